#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): a convolution's statistics summed by
# dlprobe's pass over its output (`dlprobe bench --conv-sums pass`) against cuDNN's epilogue
# (`--conv-sums epilogue`, the default). BUILD names the binary under .devbuild/bin (default
# dlprobe; `BUNDLE_AS=NAME scripts/gpu-bundle.sh` adds dlprobe-NAME with its test binaries).
# First that build's GPU tests of the pass (CudaConv.ConvolutionSumsByAPassMatchReference, the
# fp16 and bf16 steps against fp64 with the pass, the fp16 one with the epilogue; bf16 takes batch
# norm inside the convolutions only with the pass), then ResNet-50 gradients-only
# steps both ways, alternating, per CONFIGS (default "fp16:32 fp16:64 fp16:256"), ROUNDS times
# (default 2), one tuning cache for all runs; img/s and peak allocated per run in ab.txt.
# Output in $OUT (or ./gpu-check-out).
#   BUILD=dlprobe-wide CONFIGS="fp16:32 fp16:256" lab/gpu/conv-sums.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
build=${BUILD:-dlprobe}
suffix=${build#dlprobe}
if [ "${TESTS:-1}" != 0 ]; then
  echo "== engine_cuda_test$suffix CudaConv.ConvolutionSumsByAPass*"
  timeout "${TEST_TIMEOUT:-150}" "$bin/engine_cuda_test$suffix" \
    --gtest_filter='CudaConv.ConvolutionSumsByAPass*:CudaConv.FusedBatchNormRelu*' \
    >"$out/engine-tests.log" 2>&1
  grep -E '^\[ +(OK|FAILED|PASSED) |Failure' "$out/engine-tests.log" | head -n 40
  STEP_TEST=step_cuda_test$suffix \
    step_tests 'StepCudaTest.*SumsByAPass:StepCudaTest.Fp16GradientsNhwcWithBatchNormInsideTheConvolutions'
fi
echo "== $build bench, --conv-sums pass against epilogue"
DLPROBE=$bin/$build CONFIGS=${CONFIGS:-fp16:32 fp16:64 fp16:256} \
  BENCH_FLAGS="--tuning-cache $out/tuning.json" bench_ab --conv-sums pass epilogue
