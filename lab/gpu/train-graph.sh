#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): training replayed as a CUDA graph
# (`dlprobe bench --mode train --graph on`) against eager steps (`--graph off`, training's
# default), with each optimizer of OPTIMIZERS (default "sgd adamw"). First the GPU tests of
# replayed training (step_cuda_test, TESTS: the weights to the bit against eager steps through the
# fp16 loss scale's overflows and growth, with SGD and AdamW, and steps queued without collecting;
# SGD against fp64), then ResNet-50 training steps both ways, alternating, per CONFIGS (default
# "fp16:32 fp16:256 bf16:256"), ROUNDS times (default 2), one tuning cache for all runs; img/s and
# peak allocated per run in ab.txt. DLPROBE names another build of dlprobe in the bundle. Output
# in $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
step_tests "${TESTS:-*TrainGraph*:*TrainSgd*}"
for optimizer in ${OPTIMIZERS:-sgd adamw}; do
  echo "== dlprobe bench --mode train --optimizer $optimizer, --graph on against off"
  TAG=$optimizer- MODE=train CONFIGS=${CONFIGS:-fp16:32 fp16:256 bf16:256} \
    BENCH_FLAGS="--optimizer $optimizer --tuning-cache $out/tuning.json" bench_ab --graph on off
done
