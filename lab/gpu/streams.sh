#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the weight gradients on a second CUDA
# stream (`dlprobe bench --streams 2`) against every call on one (`--streams 1`). First the GPU
# tests of the two-stream step (step_cuda_test: the same values to the bit as one stream, eager
# and replayed; the fused fp16 step and SGD training against fp64), then ResNet-50 gradients-only
# steps both ways, alternating, per CONFIGS (default "fp16:256 fp16:64 fp16:32"), ROUNDS times
# (default 2), with one tuning cache for all runs, and unless TRAIN=0 once in training per
# TRAIN_CONFIGS (default fp16:256); img/s and peak allocated per run in ab.txt. VARIANTS: other builds of dlprobe in the
# bundle's bin/, each run once with --streams 2 per CONFIGS.
# Then, where PEERS names any (eager, compile, jax), the peers beside dlprobe's default through
# lab/peers/speed.py for PEER_CONFIGS (default fp16:256). Output in $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
step_tests "${TESTS:-*}"
echo "== dlprobe bench, --streams 2 against 1"
CONFIGS=${CONFIGS:-fp16:256 fp16:64 fp16:32} BENCH_FLAGS="--tuning-cache $out/tuning.json" \
  bench_ab --streams 2 1
for variant in ${VARIANTS:-}; do
  echo "== $variant (another build), --streams 2"
  DLPROBE=$bin/$variant TAG=$variant- ROUNDS=1 CONFIGS=${CONFIGS:-fp16:256 fp16:64 fp16:32} \
    BENCH_FLAGS="--tuning-cache $out/tuning.json" bench_ab --streams 2
done
if [ "${TRAIN:-1}" != 0 ]; then
  echo "== the same in training (SGD, eager steps), ${TRAIN_CONFIGS:-fp16:256}"
  MODE=train CONFIGS=${TRAIN_CONFIGS:-fp16:256} ROUNDS=1 \
    BENCH_FLAGS="--tuning-cache $out/tuning.json" bench_ab --streams 2 1
fi
if [ -n "${PEERS:-}" ]; then
  echo "== peers: ${PEERS} at ${PEER_CONFIGS:-fp16:256}"
  ${PYTHON:-python3} lab/peers/speed.py --dlprobe "$bin/dlprobe" --out "$out/speed" \
    --configs "${PEER_CONFIGS:-fp16:256}" --peers "$PEERS" --timeout "${RUN_TIMEOUT:-240}"
fi
