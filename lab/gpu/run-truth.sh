#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): `dlprobe run` with no regex over
# scripts that print no step lines, each beside `nvidia-smi dmon -s u -o DT` over the same
# seconds: examples/workloads/pytorch_resnet50.py --plain, jax_resnet50.py --plain and
# lab/gpu/seed_pytorch.py (the seed's form: one "Throughput: X samples/sec" line at the end).
# lab/gpu/run_truth_check.py prints for each the script's throughput and dlprobe's, the steady
# window and its phases, the findings, and the utilisation from dlprobe and from dmon over that
# window, with the checks (equal throughput, utilisation within 5 points, no finding the window
# contradicts). Then two JAX copies together (--copies 2), with JAX's default preallocation and
# with XLA_PYTHON_CLIENT_MEM_FRACTION=0.47: the table and the shared-GPU findings of each. Output
# under $OUT/run-truth (or ./gpu-check-out/run-truth).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
dir=$out/run-truth
mkdir -p "$dir"
py=${PYTHON:-python3}
summary=()

# truth NAME LIMIT_S -- CMD...
truth() {
  local name=$1 limit=$2
  shift 3
  nvidia-smi dmon -s u -o DT >"$dir/$name.dmon.txt" 2>"$dir/$name.dmon.err" &
  local dmon=$!
  sleep 2  # dmon's first lines, before the workload
  local launch
  launch=$(date +%s.%N)
  echo "== $name: $*"
  timeout $((limit + 60)) "$bin/dlprobe" run --overwrite --timeout "${limit}s" \
    --json "$dir/$name.json" --details-json "$dir/$name-details.json" \
    --log-dir "$dir/$name-logs" -- "$@" >"$dir/$name.log" 2>&1
  local rc=$?
  sleep 2
  kill "$dmon" 2>/dev/null
  wait "$dmon" 2>/dev/null
  tail -n 8 "$dir/$name.log"
  $py lab/gpu/run_truth_check.py --name "$name" --details "$dir/$name-details.json" \
    --dmon "$dir/$name.dmon.txt" --launch-epoch "$launch" \
    --stdout-log "$(ls "$dir/$name-logs"/run001*.stdout.log 2>/dev/null | head -n1)" \
    >"$dir/$name.check.txt" 2>&1
  local check=$?
  cat "$dir/$name.check.txt"
  summary+=("$name: dlprobe run exit $rc, check exit $check")
}

# 300 steps (about 13 s at 5,900 img/s): with 50 the steady window was 2.2 s, which nvidia-smi
# dmon's 1 s lines sample too coarsely for the 5-point utilisation check (2 lines, 96 against 89).
truth pytorch 300 -- python3 examples/workloads/pytorch_resnet50.py --plain --batch 256 \
  --amp fp16 --channels-last --steps 300 --warmup 5
truth jax 420 -- python3 examples/workloads/jax_resnet50.py --plain --batch 256 \
  --precision bf16 --steps 50 --warmup 5
truth seed 300 -- python3 lab/gpu/seed_pytorch.py --batch 128

# Two JAX copies on the GPU: with JAX's default preallocation (75 % each), then with the fix the
# finding gives; the shared-GPU findings of each.
# shared NAME [ENV=VALUE...]
shared() {
  local name=$1
  shift
  echo "== $name: --copies 2 jax_resnet50.py --batch 128 $*"
  env "$@" timeout 480 "$bin/dlprobe" run --overwrite --timeout 420s --copies 2 \
    --details-json "$dir/$name-details.json" --log-dir "$dir/$name-logs" -q -- \
    python3 examples/workloads/jax_resnet50.py --batch 128 --precision bf16 --steps 30 \
    --warmup 5 >"$dir/$name.log" 2>&1
  local rc=$?
  tail -n 20 "$dir/$name.log"
  summary+=("$name: dlprobe run exit $rc")
}
shared jax-shared-default
shared jax-shared-fixed XLA_PYTHON_CLIENT_MEM_FRACTION=0.47

echo
printf '%s\n' "${summary[@]}"
