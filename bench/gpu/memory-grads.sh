#!/usr/bin/env bash
# On a GPU machine over the bundle: part 2 of memory.sh alone (planned against grow at batch 256
# fp16, gradients only, beside PyTorch eager in the same mode), and the memory-analysis GPU tests;
# for a short device call after memory.sh's other parts have run. Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
ONLY=planned bash bench/gpu/memory.sh
status=$?
. bench/gpu/common.sh
timeout 150 "$bin/memory_analysis_gpu_test" >"$out/memory_analysis_gpu_test.log" 2>&1 || status=1
grep -E "^\[  (FAILED|PASSED|     OK)|Failure|predicted" "$out/memory_analysis_gpu_test.log" | head -n 20
exit $status
