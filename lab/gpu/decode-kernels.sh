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
python3 - "$out/decode-kernels.csv" <<'PY' | tee "$out/decode-kernels.txt"
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
names = rows[head]
col = {n: names.index(n) for n in names}
agg = collections.OrderedDict()
num = lambda s: float(s.replace(",", ""))  # ncu writes thousands with commas
for r in rows[head + 2:]:
    if len(r) != len(names):
        continue
    k = r[col["Kernel Name"]]
    a = agg.setdefault(k, [0, 0.0, r[col["launch__grid_size"]], r[col["launch__block_size"]], 0.0, 0.0])
    a[0] += 1
    a[1] += num(r[col["gpu__time_duration.sum"]])
    a[4] += num(r[col["sm__throughput.avg.pct_of_peak_sustained_elapsed"]])
    a[5] += num(r[col["dram__throughput.avg.pct_of_peak_sustained_elapsed"]])
print(f"unit of time: {rows[head + 1][col['gpu__time_duration.sum']]}")
print(f"{'kernel':90} {'calls':>5} {'total':>10} {'mean':>9} {'grid':>6} {'block':>5} {'SM%':>5} {'DRAM%':>5}")
for k, (n, t, g, b, sm, dr) in agg.items():
    print(f"{k[:90]:90} {n:5d} {t:10.0f} {t / n:9.0f} {g:>6} {b:>5} {sm / n:5.1f} {dr / n:5.1f}")
PY
