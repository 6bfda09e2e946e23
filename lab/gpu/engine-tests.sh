#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the engine's GPU tests alone (every
# CUDA op against the fp64 reference, the CUDA graph checks, the step on the GPU), a quicker
# check than scripts/gpu-tests.sh's every binary before a speed run. Logs to $OUT (or
# ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
status=0
for binary in engine_cuda_test step_cuda_test; do
  if timeout "${TEST_TIMEOUT:-150}" "$bin/$binary" >"$out/$binary.log" 2>&1; then
    echo "PASS $binary: $(grep -E '^\[  PASSED  \]' "$out/$binary.log")"
  else
    echo "FAIL $binary"
    grep -E '^\[  FAILED  \]|Failure|error' "$out/$binary.log" | head -n 20
    status=1
  fi
done
exit $status
