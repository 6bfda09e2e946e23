#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the kernels the GPU input pipeline
# launches and how long each runs (Nsight Compute over `dlprobe pipeline --device cuda:0`, one
# thread, decode and augment), to weigh the SM time a batch takes from a training step beside it.
# Kernel table in $OUT (or ./gpu-check-out)/decode-kernels.txt.
#   IMAGES=4000 GPU_PIXELS=ycbcr lab/gpu/decode-kernels.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
jpeg_dataset
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
# Skip the first batches' launches (allocation, first use); then a fixed number of launches.
timeout 240 "$ncu" --target-processes all --clock-control none --launch-skip "${SKIP:-60}" \
  --launch-count "${COUNT:-150}" --metrics \
  gpu__time_duration.sum,launch__grid_size,launch__block_size,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  --csv --page raw "$bin/dlprobe" pipeline "$data" --device cuda:0 --batch 256 --dtype fp32 \
  --layout nhwc --threads 1 --min-time 2s --gpu-pixels "${GPU_PIXELS:-rgb}" >"$out/decode-kernels.csv" 2>"$out/decode-kernels.err"
echo "ncu exit $?"
tail -n 5 "$out/decode-kernels.err"
python3 lab/gpu/ncu_table.py --width 90 "$out/decode-kernels.csv" | tee "$out/decode-kernels.txt"
