#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): batch norm inside the convolutions
# (`dlprobe bench --fusion all`, the default) against batch norm fused with its ReLU alone
# (`--fusion batch-norm`). First the fused step's GPU tests (step_cuda_test against the fp64
# reference; the finalize, apply and recomputed-mask ops of the op table), then ResNet-50
# gradients-only steps in both forms, alternating, per CONFIGS (PRECISION:BATCH list, default
# fp16:256,fp16:32), ROUNDS times (default 2); img/s and peak allocated per run in ab.txt.
# Then, where PEERS names any (eager, compile, jax), the peers beside dlprobe's default through
# lab/peers/speed.py for PEER_CONFIGS (default fp16:256); where PROFILE is set, before that,
# `--profile 3` of both forms, eager, per PROFILE_CONFIGS (default fp16:256). Output in $OUT (or
# ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
step_tests '*'
echo "== engine_cuda_test: the batch-norm ops of the fused step"
timeout 120 "$bin/engine_cuda_test" \
  --gtest_filter='*finalize*:*batch_norm_apply*:*recomputed*:*Offer*:*Fused*' >"$out/op-tests.log" 2>&1
grep -E '^\[ +(FAILED|PASSED) |Failure|tests ran' "$out/op-tests.log" | head -n 40 |
  tee "$out/op-tests.txt"
echo "== dlprobe bench, --fusion all against batch-norm"
bench_ab --fusion all batch-norm
if [ -n "${PROFILE:-}" ]; then
  # Eager steps with a mark around every call: device time per kind of call, both forms.
  for config in ${PROFILE_CONFIGS:-fp16:256}; do
    precision=${config%%:*}
    batch=${config##*:}
    for fusion in all batch-norm; do
      tag=profile-$precision-bs$batch-$fusion
      echo "== $tag"
      timeout 200 "$bin/dlprobe" bench --model resnet50 --mode grads --precision "$precision" \
        --batch "$batch" --steps 20 --no-ceiling --graph off --profile 3 --fusion "$fusion" \
        >"$out/$tag.txt" 2>"$out/$tag.err"
      echo "exit $?" >>"$out/$tag.err"
      grep -v '^$' "$out/$tag.txt" | tail -n 45
    done
  done
fi
if [ -n "${PEERS:-}" ]; then
  echo "== peers: ${PEERS} at ${PEER_CONFIGS:-fp16:256}"
  ${PYTHON:-python3} lab/peers/speed.py --dlprobe "$bin/dlprobe" --out "$out/speed" \
    --configs "${PEER_CONFIGS:-fp16:256}" --peers "$PEERS" --timeout "${RUN_TIMEOUT:-240}"
fi
