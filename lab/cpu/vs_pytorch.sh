#!/usr/bin/env bash
# dlprobe's CPU training step against PyTorch's (lab/peers/cpu_train.py), alternating on one
# machine: N rounds of dlprobe then PyTorch, the same model, batch, image size, thread count and
# optimizer (SGD, lr 0.1, momentum 0.9, weight decay 1e-4), fp32. Prints one row per round with
# the load average before each run and the ratio, then the medians.
#
#   lab/cpu/vs_pytorch.sh [--dlprobe PATH] [--model resnet18] [--batch 32] [--image-size 64]
#                         [--threads 2] [--rounds 3] [--min-time 10] [--channels-last]
#
# Both run with OMP_NUM_THREADS = --threads; dlprobe also pins its OpenMP threads to cores
# (OMP_PROC_BIND=close, OMP_PLACES=cores) as given by the environment, so do the same for the
# peer. The machine may be shared: the load column says how idle it was; compare rows, not runs
# from different times.
set -euo pipefail

dlprobe=build-rel/dlprobe
model=resnet18
batch=32
size=64
threads=2
rounds=3
min_time=10
torch_layout=()
python=/usr/bin/python3
while [[ $# -gt 0 ]]; do
  case $1 in
    --dlprobe) dlprobe=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --image-size) size=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --channels-last) torch_layout=(--channels-last); shift ;;
    *) echo "vs_pytorch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ ! -x $dlprobe ]]; then
  echo "vs_pytorch.sh: --dlprobe '$dlprobe' is not an executable (build it: cmake --build build-rel --target dlprobe)" >&2
  exit 2
fi
peer="$(dirname "$0")/../peers/cpu_train.py"
export OMP_NUM_THREADS=$threads OMP_PROC_BIND=close OMP_PLACES=cores

load() { cut -d' ' -f1 /proc/loadavg; }

echo "# $(date -u +%FT%TZ) $(hostname) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
echo "# $model bs$batch ${size}x$size fp32 train SGD, $threads threads; dlprobe $("$dlprobe" --version 2>/dev/null | head -1)"
printf '%-5s %-6s %12s %-6s %12s %7s\n' round load dlprobe load pytorch ratio
ds=()
ps=()
for ((r = 1; r <= rounds; r++)); do
  l1=$(load)
  d=$("$dlprobe" bench --device cpu --model "$model" --batch "$batch" --image-size "$size" \
        --mode train --precision fp32 --warmup 3 --steps 10 --min-time "${min_time}s" \
        --no-history --json - -q 2>/dev/null |
      "$python" -c 'import json,sys; d=json.load(sys.stdin); print("%.2f" % d["configurations"][0]["statistics"]["throughput"])')
  l2=$(load)
  p=$("$python" "$peer" --model "$model" --batch "$batch" --image-size "$size" \
        --threads "$threads" --min-time "$min_time" "${torch_layout[@]}" |
      sed -E 's/.*: ([0-9.]+) img\/s.*/\1/')
  ratio=$("$python" -c "print('%.2f' % ($d / $p))")
  printf '%-5s %-6s %12s %-6s %12s %7s\n' "$r" "$l1" "$d" "$l2" "$p" "${ratio}x"
  ds+=("$d")
  ps+=("$p")
done
"$python" - "${ds[*]}" "${ps[*]}" <<'PY'
import statistics, sys
d = [float(v) for v in sys.argv[1].split()]
p = [float(v) for v in sys.argv[2].split()]
print(f"median: dlprobe {statistics.median(d):.2f} img/s, pytorch {statistics.median(p):.2f} img/s, "
      f"ratio {statistics.median(d) / statistics.median(p):.2f}x")
PY
