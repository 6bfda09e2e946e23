#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): where dlprobe's native ResNet-50 step
# spends its time (`dlprobe bench --profile`) in each precision and layout, beside PyTorch eager
# timed the same way (through `dlprobe run`) and PyTorch's kernel profile of the same step
# (lab/gpu/torch_profile.py). bs 256, grads mode. Output under $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
batch=${BATCH:-256}
# ONLY="fp16-nhwc bf16-nhwc" runs just those native configurations.
run() {
  local tag=$1
  shift
  [[ -n ${ONLY:-} && " $ONLY " != *" $tag "* ]] && return
  echo "== native $tag"
  timeout 150 "$bin/dlprobe" bench --overwrite --model resnet50 --batch "$batch" --mode grads --steps 20 \
    --warmup 5 --profile 3 "$@" >"$out/native-$tag.log" 2>&1
  echo "exit $?"
  grep -E "throughput|peak memory|profile" "$out/native-$tag.log"
}
run fp16-nhwc --precision fp16 --layout nhwc
run fp16-nhwc-exact --precision fp16 --layout nhwc --conv-engines exact
run bf16-nhwc --precision bf16 --layout nhwc
run tf32-nchw --precision tf32 --layout nchw
run tf32-nhwc --precision tf32 --layout nhwc
run fp32-nchw --precision fp32 --layout nchw
run fp32-nhwc --precision fp32 --layout nhwc
echo "== pytorch eager AMP fp16 channels_last bs$batch (through dlprobe run)"
timeout 180 "$bin/dlprobe" run --overwrite --json "$out/pytorch-fp16.json" -- python3 \
  examples/workloads/pytorch_resnet50.py --batch "$batch" --amp fp16 --channels-last --steps 30 \
  --warmup 5 >"$out/pytorch-fp16.log" 2>&1
grep -iE "img/s|throughput|peak" "$out/pytorch-fp16.log" | head -n 8
echo "== pytorch eager fp16 channels_last kernel profile"
timeout 120 python3 lab/gpu/torch_profile.py --batch "$batch" --amp fp16 --channels-last \
  >"$out/torch-fp16.log" 2>&1
head -n 6 "$out/torch-fp16.log"
