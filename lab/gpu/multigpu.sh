#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the NCCL collectives of
# `dlprobe doctor --nccl` over every visible GPU in one process, then, with two GPUs or more and
# torchrun installed, one rank per GPU (the launcher's environment and NCCL_COMM_ID bootstrap);
# then every test labelled gpu (scripts/gpu-tests.sh). On one GPU the sweep is a one-rank
# communicator: it must run and report no bus bandwidth. Output under $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
status=0
gpus=$(nvidia-smi -L | grep -c '^GPU')
echo "== $gpus GPU(s)"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 && cat "$out/topo.txt"

# The check every JSON report must pass: measured, one sweep per collective, NVLS off, and bus
# bandwidth present exactly when there are several ranks.
check() {
  python3 - "$1" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
ranks = int(sys.argv[2])
c = doc["collectives"]
assert c["measured"], c["why_not"]
assert c["ranks"] == ranks, (c["ranks"], ranks)
assert c["nvls"] == "0", c["nvls"]
assert [s["collective"] for s in c["sweeps"]] == ["all_reduce", "all_gather", "reduce_scatter"]
for s in c["sweeps"]:
    for p in s["points"]:
        assert (p["busbw_gbs"] is None) == (ranks == 1), p
    print(s["collective"], "largest", s["points"][-1]["bytes"], "B:",
          "algbw %.1f GB/s" % s["points"][-1]["algbw_gbs"],
          "peak busbw", s["peak_busbw_gbs"], "ratio", s["peak_ratio"])
print("mode:", c["mode"], "| link peak:", c["link_peak"], "|", c["note"])
PY
}

unset NCCL_NVLS_ENABLE
timeout 300 "$bin/dlprobe" doctor --no-ceilings --nccl >"$out/nccl.txt" 2>&1
rc=$?
sed -n '/^NCCL collectives/,/^Findings/p' "$out/nccl.txt"
echo "doctor --nccl (one process): exit $rc"
[ $rc = 0 ] || status=1
timeout 300 "$bin/dlprobe" doctor --no-ceilings --nccl --json -o "$out/nccl.json" --overwrite &&
  check "$out/nccl.json" "$gpus" || status=1

if [ "$gpus" -ge 2 ] && command -v torchrun >/dev/null; then
  timeout 300 torchrun --standalone --nproc-per-node "$gpus" --no-python "$bin/dlprobe" doctor \
    --no-ceilings --nccl --json -o "$out/nccl-torchrun.json" --overwrite >"$out/nccl-torchrun.log" 2>&1
  rc=$?
  echo "torchrun x $gpus doctor --nccl: exit $rc"
  [ $rc = 0 ] && check "$out/nccl-torchrun.json" "$gpus" || status=1
else
  echo "one rank per process: skipped ($gpus GPU(s), torchrun $(command -v torchrun || echo absent))"
fi

./scripts/gpu-tests.sh || status=1
exit $status
