#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): batch norm inside the convolutions
# with cuDNN's epilogue and prologue against dlprobe's passes: `dlprobe bench --conv-sums
# epilogue|pass` (who sums a convolution's output for the statistics) crossed with
# `--conv-prologue fused|pass` (who applies a batch norm + ReLU to the next convolution's input).
# BUILD names the binary under .devbuild/bin (default dlprobe; `BUNDLE_AS=NAME
# scripts/gpu-bundle.sh` adds dlprobe-NAME with its test binaries). First, unless TESTS=0, that
# build's GPU tests of the passes (CudaConv.ConvolutionSumsByAPass*, CudaConv.PrologueByAPass*,
# the fp16 and bf16 steps against fp64 with them, the fp16 one with cuDNN's; bf16 takes batch
# norm inside the convolutions only with the sums pass), then ResNet-50 gradients-only steps in
# the four combinations per CONFIGS (default "fp16:32 fp16:64 fp16:256"), ROUNDS rounds (default
# 2), one tuning cache for all runs; img/s and peak allocated per run in ab.txt, each run named
# round<N>-prologue-<choice>-<config>...conv-sums<choice>.
# Output in $OUT (or ./gpu-check-out).
#   BUILD=dlprobe-wide CONFIGS="fp16:32 fp16:256" lab/gpu/conv-sums.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
build=${BUILD:-dlprobe}
suffix=${build#dlprobe}
if [ "${TESTS:-1}" != 0 ]; then
  echo "== engine_cuda_test$suffix CudaConv passes"
  timeout "${TEST_TIMEOUT:-150}" "$bin/engine_cuda_test$suffix" \
    --gtest_filter='CudaConv.ConvolutionSumsByAPass*:CudaConv.PrologueByAPass*:CudaConv.FusedBatchNormRelu*' \
    >"$out/engine-tests.log" 2>&1
  grep -E '^\[ +(OK|FAILED|PASSED) |Failure' "$out/engine-tests.log" | head -n 40
  STEP_TEST=step_cuda_test$suffix step_tests \
    'StepCudaTest.*ByAPass:StepCudaTest.*ByPasses:StepCudaTest.Fp16GradientsNhwcWithBatchNormInsideTheConvolutions'
fi
echo "== $build bench, --conv-sums and --conv-prologue, cuDNN's or dlprobe's"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for prologue in fused pass; do
    ROUNDS=1 TAG=round$round-prologue-$prologue- DLPROBE=$bin/$build \
      CONFIGS=${CONFIGS:-fp16:32 fp16:64 fp16:256} \
      BENCH_FLAGS="--tuning-cache $out/tuning.json --conv-prologue $prologue" \
      bench_ab --conv-sums epilogue pass
  done
done
