#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh, with lab/gpu/slow_calls.cpp built into
# .devbuild/lib/libslow_calls.so): `dlprobe bench --data` training ResNet-50 fp16 bs256 from JPEGs
# decoded on the GPU, with every CUDA call over SLOW_CALLS_MS listed by call and thread, to find
# what holds the decoding threads up beside the step. Output in $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
jpeg_dataset
CUDA_INJECTION64_PATH=$PWD/.devbuild/lib/libslow_calls.so SLOW_CALLS_MS=${SLOW_CALLS_MS:-2} \
  SLOW_CALLS_OUT=$out/slow-calls.txt timeout 200 "$bin/dlprobe" bench --model resnet50 \
  --batch 256 --precision fp16 --mode grads --steps 30 --min-time 3s --data "$data" \
  --data-decode gpu --no-ceiling --json "$out/bench.json" --overwrite >"$out/bench.txt" \
  2>"$out/bench.err"
code=$?
echo "exit $code"
head -n 4 "$out/bench.txt"
# The list is written when the process exits normally; a killed one leaves none.
cat "$out/slow-calls.txt" 2>/dev/null || echo "no list: dlprobe did not exit normally"
exit "$code"
