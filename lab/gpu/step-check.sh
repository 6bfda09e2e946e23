#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the whole-step GPU cases that failed
# on the H200 before their fixes, alone and first, so that a short device call answers them:
# the graph replay against eager steps (bit for bit) and fp32 AdamW training against the
# reference. Output under $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
timeout 150 "$bin/step_cuda_test" \
  --gtest_filter=StepCudaTest.GraphReplayMatchesEagerSteps:StepCudaTest.Fp32TrainAdamW \
  >"$out/step-check.log" 2>&1
rc=$?
grep -E "^\[  (FAILED|PASSED|     OK)|Failure|first at|median|update " "$out/step-check.log" | head -n 30
echo "step_cuda_test (2 cases): exit $rc"
exit $rc
