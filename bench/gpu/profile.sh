#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): where dlprobe's native ResNet-50 step
# spends its time (`dlprobe bench --profile`) under each convolution-engine choice and precision,
# beside PyTorch eager's kernel profile of the same step (bench/gpu/torch_profile.py). bs 256,
# grads mode. Output under $OUT (or ./gpu-check-out), one log per configuration.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
bin=.devbuild/bin
. scripts/gpu-env.sh
batch=${BATCH:-256}
run() {
  local tag=$1
  shift
  echo "== native $tag"
  timeout 150 "$bin/dlprobe" bench --model resnet50 --batch "$batch" --mode grads --steps 20 \
    --warmup 5 --profile 3 "$@" >"$out/native-$tag.log" 2>&1
  echo "exit $?"
  grep -E "throughput|peak memory|profile" "$out/native-$tag.log"
}
run fp16-nhwc-heuristic --precision fp16 --layout nhwc --conv-algo heuristic
run fp16-nhwc-autotune --precision fp16 --layout nhwc
run fp16-nhwc-autotune-nondet --precision fp16 --layout nhwc --nondeterministic
run bf16-nhwc-autotune --precision bf16 --layout nhwc
run tf32-nchw-autotune --precision tf32 --layout nchw
run fp32-nchw-autotune --precision fp32 --layout nchw
echo "== pytorch eager fp16 channels_last"
timeout 120 python3 bench/gpu/torch_profile.py --batch "$batch" --amp fp16 --channels-last \
  >"$out/torch-fp16.log" 2>&1
head -n 8 "$out/torch-fp16.log"
echo "== pytorch eager tf32"
timeout 120 python3 bench/gpu/torch_profile.py --batch "$batch" --amp none --tf32 \
  >"$out/torch-tf32.log" 2>&1
head -n 8 "$out/torch-tf32.log"
