#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the GPU cases written since the last
# full GPU test run, first in a short device call: the CUDA graph's workspace sizing and replay
# (engine_cuda_test CudaGraph.*), the bench's graph window and the other bench cases
# (bench_gpu_test), and the memory analysis on the device (memory_gpu_test). Output
# under $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
status=0
run_cases() {
  local name=$1 filter=$2
  timeout 150 "$bin/$name" --gtest_filter="$filter" >"$out/$name.log" 2>&1
  local rc=$?
  grep -E "^\[  (FAILED|PASSED|     OK)|Failure" "$out/$name.log" | head -n 30
  echo "$name ($filter): exit $rc"
  [ $rc = 0 ] || status=1
}
run_cases engine_cuda_test 'CudaGraph.*'
run_cases bench_gpu_test '*'
run_cases memory_gpu_test '*'
exit $status
