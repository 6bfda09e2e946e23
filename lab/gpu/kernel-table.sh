#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the time and DRAM traffic of each
# kernel in one eager ResNet-50 step (Nsight Compute over `dlprobe bench --graph off`, PRECISION
# (fp16) BATCH (256) grads, a warm-up step and a timed one), to see which passes run short of the
# memory bandwidth and what the kernels sum to beside the step's time. KERNELS (a regex) picks
# them, by default our own (cuDNN's left out); with cuDNN's, give a BENCH_FLAGS tuning cache that
# an earlier run filled, so that autotuning's runs are not profiled. Nsight Compute flushes the
# caches before each kernel unless NCU_CACHE=none. Per kernel: calls, time, bytes moved and the
# bandwidth they imply. Table in $OUT (or ./gpu-check-out)/TAGkernels.txt; DLPROBE names another
# build of the binary, TAG a prefix for its files.
#   BATCH=32 KERNELS=. NCU_CACHE=none BENCH_FLAGS="--tuning-cache t.json" lab/gpu/kernel-table.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
# One warm-up step and one timed step: the table divides by the two steps it saw.
timeout "${NCU_TIMEOUT:-300}" "$ncu" --target-processes all --clock-control none --cache-control "${NCU_CACHE:-all}" \
  --kernel-name "regex:${KERNELS:-grad_sums|dx_|stats_|apply_|finalize|map_kernel|pool_|resident|cast_many|copy_channels|pad_rows|gap_|channel_sums|scale_bias_relu}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
  --csv --page raw "${DLPROBE:-$bin/dlprobe}" bench --model resnet50 --batch "${BATCH:-256}" \
  --precision "${PRECISION:-fp16}" --mode grads --graph off --warmup 1 --steps 1 --min-time 0s \
  --no-ceiling --overwrite ${BENCH_FLAGS:-} --json "$out/${TAG:-}kernels.json" >"$out/${TAG:-}kernels.csv" 2>"$out/${TAG:-}kernels.err"
echo "ncu exit $?"
tail -n 5 "$out/${TAG:-}kernels.err"
python3 lab/gpu/ncu_table.py --per 2 "$out/${TAG:-}kernels.csv" | tee "$out/${TAG:-}kernels.txt"
