#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): `dlprobe bench --precision fp16` with no
# other flag (training, the default mode) beside the fastest training configuration named in full
# (NHWC, planned arena; training steps are not replayed as graphs), and the same with `--mode grads`
# beside NHWC, planned arena and a CUDA graph; ResNet-50 batch 256, alternating so that drift
# between calls shows as spread rather than as a difference; then `dlprobe evaluate`, timed. Output under $OUT (or
# ./gpu-check-out); a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
summary=()
bench() {
  local name=$1
  shift
  timeout 240 "$bin/dlprobe" bench --overwrite --model resnet50 --batch 256 --precision fp16 "$@" \
    --json "$out/$name.json" >"$out/$name.txt" 2>"$out/$name.err"
  local rc=$?
  cat "$out/$name.txt"
  grep -i "picked" "$out/$name.err"
  summary+=("$name: exit $rc: $(python3 - "$out/$name.json" <<'PY'
import json, sys
try:
    c = json.load(open(sys.argv[1]))["configurations"][0]
    s = c["settings"]
    print(f'{c["statistics"]["throughput"]:.1f} img/s, layout {s.get("layout")}, '
          f'gpu-memory {s.get("gpu_memory")}, mode {s.get("mode")}')
except Exception as e:  # the run's own error is in its .err file
    print(f"no result ({e})")
PY
)")
}
for round in 1 2; do
  bench "train-default-$round"
  bench "train-best-$round" --layout nhwc --gpu-memory planned --graph off
  bench "grads-default-$round" --mode grads
  bench "grads-best-$round" --mode grads --layout nhwc --gpu-memory planned --graph on
done

echo "== dlprobe evaluate"
start=$(date +%s)
timeout 420 "$bin/dlprobe" evaluate --overwrite --out "$out/evaluate" >"$out/evaluate.txt" 2>"$out/evaluate.err"
rc=$?
cat "$out/evaluate.txt"
summary+=("evaluate: exit $rc in $(($(date +%s) - start)) s")

echo
printf '%s\n' "${summary[@]}"
