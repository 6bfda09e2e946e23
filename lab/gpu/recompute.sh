#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): block outputs recomputed in the
# backward pass (`dlprobe bench --recompute block-outputs`) against kept (`--recompute none`).
# First the GPU tests of the step (step_cuda_test, filter TESTS, default *Recompute*: the fused
# fp16 step's gradients and SGD training against fp64), then ResNet-50 steps both ways,
# alternating, per CONFIGS (default "fp16:256"), ROUNDS times (default 2), MODE (default grads),
# with one tuning cache for all runs; img/s and peak allocated per run in ab.txt. Unless
# MAXBATCH=0, the largest fp16 batch under 16 GiB with the outputs recomputed (lab/gpu/memory.sh's
# part 3: planned memory, batch norm inside the convolutions). Output in $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
step_tests "${TESTS:-*Recompute*}"
echo "== dlprobe bench, --recompute block-outputs against none"
CONFIGS=${CONFIGS:-fp16:256} BENCH_FLAGS="--tuning-cache $out/tuning.json" \
  bench_ab --recompute block-outputs none
if [ "${MAXBATCH:-1}" != 0 ]; then
  ONLY=maxbatch MAXBATCH_SPECS=fp16:nhwc MAXBATCH_MEMORY=planned \
    MAXBATCH_FLAGS="--conv-engines any --recompute block-outputs" lab/gpu/memory.sh
fi
