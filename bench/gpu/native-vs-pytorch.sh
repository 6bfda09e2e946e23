#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu-check.sh's environment: dlprobe's native ResNet-50 step and
# PyTorch eager on the same GPU in one run (bs 256, forward + backward, synthetic on-device input,
# 5 warm-up + 30 timed steps), each bounded in time. Output under $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
bin=.devbuild/bin
. scripts/gpu-env.sh
batch=${BATCH:-256}
for cfg in "fp16 nhwc" "bf16 nhwc" "tf32 nchw" "fp32 nchw"; do
  set -- $cfg
  echo "== native $1 $2 bs$batch"
  timeout 120 "$bin/dlprobe" bench --model resnet50 --batch "$batch" --precision "$1" --layout "$2" \
    --mode grads --steps 30 --warmup 5 2>&1 | tail -n 15
done
echo "== pytorch eager AMP fp16 channels_last bs$batch (through dlprobe run)"
timeout 180 "$bin/dlprobe" run --json "$out/pytorch.json" -- python3 examples/workloads/pytorch_resnet50.py \
  --batch "$batch" --amp fp16 --channels-last --steps 30 --warmup 5 2>&1 | tail -n 25
