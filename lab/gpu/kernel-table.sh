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
  --kernel-name "regex:${KERNELS:-grad_sums|dx_|stats_|apply_|finalize|map_kernel|pool_|resident|cast_many|copy_channels|gap_}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
  --csv --page raw "${DLPROBE:-$bin/dlprobe}" bench --model resnet50 --batch "${BATCH:-256}" \
  --precision "${PRECISION:-fp16}" --mode grads --graph off --warmup 1 --steps 1 --min-time 0s \
  --no-ceiling --overwrite ${BENCH_FLAGS:-} --json "$out/${TAG:-}kernels.json" >"$out/${TAG:-}kernels.csv" 2>"$out/${TAG:-}kernels.err"
echo "ncu exit $?"
tail -n 5 "$out/${TAG:-}kernels.err"
python3 - "$out/${TAG:-}kernels.csv" <<'PY' | tee "$out/${TAG:-}kernels.txt"
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
names = rows[head]
col = {n: names.index(n) for n in names}
num = lambda s: float(s.replace(",", "")) if s.strip() else 0.0  # ncu writes thousands with commas
units = {n: rows[head + 1][col[n]] for n in names}
agg = collections.OrderedDict()
for r in rows[head + 2:]:
    if len(r) != len(names):
        continue
    # The template arguments tell the variants apart (dtype, pack, fused ReLU).
    k = r[col["Kernel Name"]]
    a = agg.setdefault(k, [0, 0.0, 0.0, 0.0, 0.0])
    a[0] += 1
    a[1] += num(r[col["gpu__time_duration.sum"]])
    a[2] += num(r[col["dram__bytes_read.sum"]]) + num(r[col["dram__bytes_write.sum"]])
    a[3] += num(r[col["dram__throughput.avg.pct_of_peak_sustained_elapsed"]])
    a[4] += num(r[col["sm__warps_active.avg.pct_of_peak_sustained_active"]])
scale_t = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3}[units["gpu__time_duration.sum"]]
scale_b = {"byte": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}[units["dram__bytes_read.sum"]]
steps = 2
total = sum(a[1] for a in agg.values()) * scale_t / steps
print(f"these kernels, per step (of {steps} profiled): {total * 1e3:.2f} ms")
print(f"{'kernel':70} {'calls':>5} {'ms/step':>8} {'GB/step':>8} {'TB/s':>5} {'DRAM%':>5} {'warps%':>6}")
for k, (n, t, b, dr, occ) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    sec = t * scale_t
    print(f"{k[:70]:70} {n // steps:5d} {sec / steps * 1e3:8.3f} {b * scale_b / steps / 1e9:8.2f} "
          f"{b * scale_b / sec / 1e12 if sec else 0:5.2f} {dr / n:5.1f} {occ / n:6.1f}")
PY
