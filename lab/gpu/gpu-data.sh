#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the GPU input pipeline. Its tests
# (data_gpu_test: the kernel against the host's resize, nvJPEG's samples against libjpeg-turbo's,
# bad files skipped for the same reasons); `dlprobe pipeline --device cuda:0` over reader thread
# counts; and `dlprobe bench --data` training ResNet-50 fp16 bs256 from the JPEGs, decoded on the
# GPU and on the host's cores, each beside the synthetic batch in the same call. Logs and JSON go
# to $OUT (or ./gpu-check-out).
#   IMAGES=4000 GPU_PIXELS="rgb ycbcr" DECODES="gpu gpu-ycbcr cpu" lab/gpu/gpu-data.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
jpeg_dataset
echo "== data_gpu_test"
timeout 120 "$bin/data_gpu_test" 2>&1 | tail -n 25 | tee "$out/data_gpu_test.txt"
for pixels in ${GPU_PIXELS:-rgb}; do
  echo "== dlprobe pipeline --device cuda:0 --gpu-pixels $pixels"
  timeout 120 "$bin/dlprobe" pipeline "$data" --device cuda:0 --batch 256 --dtype fp16 --layout nhwc \
    --threads "${GPU_THREADS:-1,4,16}" --min-time 5s --step-rate 7000 --gpu-pixels "$pixels" \
    --json "$out/pipeline-gpu-$pixels.json" 2>"$out/pipeline-gpu-$pixels.err" |
    tee "$out/pipeline-gpu-$pixels.txt"
  tail -n 3 "$out/pipeline-gpu-$pixels.err"
done
# DECODES: gpu (nvJPEG's RGB), gpu-ycbcr (nvJPEG's YCbCr planes) and cpu.
for decode in ${DECODES:-gpu cpu}; do
  echo "== dlprobe bench --data (decode on $decode)"
  where=${decode%-ycbcr}
  pixels=rgb
  [ "$decode" != "$where" ] && pixels=ycbcr
  extra=()
  [ "$where" = gpu ] && extra=(--data-gpu-pixels "$pixels")
  timeout 200 "$bin/dlprobe" bench --model resnet50 --batch 256 --precision fp16 --mode grads \
    --steps 30 --min-time 5s --data "$data" --data-decode "$where" "${extra[@]}" --no-ceiling \
    --json "$out/bench-data-$decode.json" --overwrite >"$out/bench-data-$decode.txt" \
    2>"$out/bench-data-$decode.err"
  echo "exit $?"
  cat "$out/bench-data-$decode.txt"
  tail -n 3 "$out/bench-data-$decode.err"
done
