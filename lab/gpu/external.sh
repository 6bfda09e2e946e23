#!/usr/bin/env bash
# `dlprobe run`'s acceptance checks on a GPU machine, over the bundle (scripts/gpu-bundle.sh, then as
# scripts/gpu-check.sh runs), every step bounded in time:
#   1. dlprobe run over examples/workloads/pytorch_resnet50.py (fp16 AMP, channels_last, bs 256)
#      and jax_resnet50.py (bf16, bs 256), with nvidia-smi logging the same processes' memory
#      every 100 ms beside it; lab/gpu/external_check.py compares dlprobe's peak with
#      nvidia-smi's (2 % bound) and dlprobe's throughput with the one the script printed;
#   2. a batch sweep 64..1024 of the PyTorch script capped at SWEEP_FRACTION of the GPU
#      (torch.cuda.set_per_process_memory_fraction: a smaller card), which must run out of memory
#      at some batch, be reported as such and complete;
#   3. dlprobe report over the native bench results (NATIVE_JSON, else $OUT/native*.json, else
#      native fp16 / bf16 bench runs here, training as the scripts do and gradients only with a
#      CUDA graph) and the PyTorch and JAX results: one report.html (and report.md).
# Everything goes to $OUT/external (or ./gpu-check-out/external); the checks are printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
ext=$out/external
mkdir -p "$ext"
py=${PYTHON:-python3}
checks=$ext/checks.txt
: >"$checks"
: >"$ext/checks.jsonl"
summary=()

# nvidia-smi's compute-process query with timestamps, so rows of one sample can be summed; older
# drivers without the field get the query without it (external_check.py handles both).
apps_fields=timestamp,pid,process_name,used_memory
nvidia-smi --query-compute-apps=$apps_fields --format=csv,noheader,nounits >/dev/null 2>&1 ||
  apps_fields=pid,process_name,used_memory

# run_one NAME LIMIT_S [DLPROBE RUN OPTIONS] -- CMD...: one dlprobe run with nvidia-smi watching,
# then the checks.
run_one() {
  local name=$1 limit=$2
  shift 2
  local opts=()
  while [ "$1" != "--" ]; do
    opts+=("$1")
    shift
  done
  shift
  local before
  before=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | paste -sd, -)
  nvidia-smi --query-compute-apps=$apps_fields --format=csv,noheader,nounits -lms 100 \
    >"$ext/$name.smi-apps.csv" 2>"$ext/$name.smi.err" &
  local smi_apps=$!
  nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 100 \
    >"$ext/$name.smi-gpu.csv" 2>>"$ext/$name.smi.err" &
  local smi_gpu=$!
  sleep 1  # a sample of the GPU before the workload starts
  echo "== $name: $*"
  timeout $((limit + 60)) "$bin/dlprobe" run --overwrite --timeout "${limit}s" --json "$ext/$name.json" \
    --details-json "$ext/$name-details.json" --log-dir "$ext/$name-logs" "${opts[@]}" -- \
    "$@" >"$ext/$name.log" 2>&1
  local rc=$?
  sleep 1
  kill "$smi_apps" "$smi_gpu" 2>/dev/null
  wait "$smi_apps" "$smi_gpu" 2>/dev/null
  summary+=("$name: dlprobe run exit $rc")
  tail -n 12 "$ext/$name.log"
  $py lab/gpu/external_check.py run --name "$name" --details "$ext/$name-details.json" \
    --smi-apps "$ext/$name.smi-apps.csv" --smi-gpu "$ext/$name.smi-gpu.csv" \
    --stdout-log "$(ls "$ext/$name-logs"/run001*.stdout.log 2>/dev/null | head -n1)" \
    --exclude-pids "$before" \
    --json-out "$ext/checks.jsonl" >>"$checks" 2>&1
}

# One-point sweeps, so that batch and precision are the runs' settings in the results and the
# report lines them up with the native runs.
run_one pytorch 300 --sweep batch=256 --sweep precision=fp16 -- \
  python3 examples/workloads/pytorch_resnet50.py --batch '{batch}' --amp '{precision}' \
  --channels-last --steps 30 --warmup 5
run_one jax 420 --sweep batch=256 --sweep precision=bf16 -- \
  python3 examples/workloads/jax_resnet50.py --batch '{batch}' --precision '{precision}' \
  --steps 30 --warmup 5

fraction=${SWEEP_FRACTION:-0.2}
batches=64,128,256,512,1024
echo "== sweep: batch $batches, PyTorch capped at $fraction of the GPU"
timeout 900 "$bin/dlprobe" run --overwrite --timeout 180s --sweep "batch=$batches" --json "$ext/sweep.json" \
  --details-json "$ext/sweep-details.json" --log-dir "$ext/sweep-logs" -- \
  python3 examples/workloads/pytorch_resnet50.py --batch '{batch}' \
  --amp fp16 --channels-last --steps 10 --warmup 3 --memory-fraction "$fraction" \
  >"$ext/sweep.log" 2>&1
summary+=("sweep: dlprobe run exit $? (1 expected: a point ran out of memory)")
tail -n 20 "$ext/sweep.log"
$py lab/gpu/external_check.py sweep --name sweep --details "$ext/sweep-details.json" \
  --points 5 --json-out "$ext/checks.jsonl" >>"$checks" 2>&1

# The native engine in the same call, for the report's native / PyTorch / JAX table, unless
# NATIVE_JSON names results or an earlier script left some in $OUT.
# Two native runs: training with SGD (what both scripts run; eager, as a graph replays grads and
# infer only) and the engine's fastest gradients-only step (planned arena, CUDA graph).
# native MODE [BENCH FLAGS...]: one fp16 + bf16 bench run, its results file added to NATIVE_JSON.
native() {
  local mode=$1
  shift
  echo "== native: resnet50 bs256 $mode, fp16 and bf16 NHWC, planned arena $*"
  timeout 240 "$bin/dlprobe" bench --overwrite --model resnet50 --batch 256 --mode "$mode" \
    --precision fp16,bf16 --layout nhwc --gpu-memory planned "$@" --steps 30 --warmup 5 \
    --no-ceiling --json "$ext/native-$mode.json" >"$ext/native-$mode.log" 2>&1
  summary+=("native bench $mode: exit $?")
  NATIVE_JSON="${NATIVE_JSON:-} $ext/native-$mode.json"
}
if [ -z "${NATIVE_JSON:-}" ] && ! ls "$out"/native*.json >/dev/null 2>&1; then
  native train
  native grads --graph
fi
# shellcheck disable=SC2206
natives=(${NATIVE_JSON:-$(ls "$out"/native*.json 2>/dev/null)})
inputs=("${natives[@]}" "$ext/pytorch.json" "$ext/jax.json" "$ext/sweep.json")
echo "== report over ${inputs[*]}"
for f in report.html report.md; do
  timeout 120 "$bin/dlprobe" report --overwrite "${inputs[@]}" -o "$ext/$f" >>"$ext/report.log" 2>&1
  summary+=("$f: exit $? (${#natives[@]} native results file(s))")
done

echo
printf '%s\n' "${summary[@]}"
[ -s "$ext/report.md" ] && cat "$ext/report.md"
cat "$checks"
