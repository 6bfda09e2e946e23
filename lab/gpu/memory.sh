#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the figures of
# docs/memory.md. Output under $OUT (or ./gpu-check-out); every command is bounded in time.
#   1. predicted beside measured, resnet50 batch 32..256, fp32 (NCHW) and fp16 (NHWC); each
#      precision is calibrated at batch 32 and the other batches are predicted from it
#   2. planned against grow at batch 256 fp16 (gradients only), beside PyTorch eager's
#      torch.cuda.max_memory_allocated for the same step (examples/workloads/pytorch_resnet50.py
#      through dlprobe run)
#   3. the largest batch under a 16 GiB limit, fp32 and fp16, grow and planned, verified by runs
#      (the found batch runs a full step, the next fails) with NVML's figure for the process
#   4. one HTML report of all of it
# ONLY=predicted|planned|maxbatch runs that part alone (the report then covers what is in $OUT).
# Part 3 takes MAXBATCH_SPECS (PRECISION:LAYOUT list, default "fp32:nchw fp16:nhwc"),
# MAXBATCH_MEMORY (default grow,planned) and MAXBATCH_FLAGS (more flags of dlprobe memory, e.g.
# "--conv-engines any", under which the step runs batch norm inside the convolutions).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
status=0
want() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
# Shared by the measured runs: each shape is timed once, later runs take its choice.
tuning="$out/memory-tuning.json"
rm -f "$tuning"

if want predicted; then
echo "== predicted vs measured, resnet50 fp32 NCHW"
timeout 600 "$bin/dlprobe" memory --overwrite --model resnet50 --batch 32,64,128,256 --precision fp32 \
  --tuning-cache "$tuning" --layout nchw --gpu-memory grow --json "$out/memory-fp32.json" >"$out/memory-fp32.txt" 2>"$out/memory-fp32.err" || status=1
tail -n 6 "$out/memory-fp32.txt"

echo "== predicted vs measured, resnet50 fp16 NHWC"
timeout 600 "$bin/dlprobe" memory --overwrite --model resnet50 --batch 32,64,128,256 --precision fp16 \
  --tuning-cache "$tuning" --layout nhwc --gpu-memory grow --json "$out/memory-fp16.json" >"$out/memory-fp16.txt" 2>"$out/memory-fp16.err" || status=1
tail -n 6 "$out/memory-fp16.txt"
fi

if want planned; then
# Gradients only, as the PyTorch run below (its --mode grads): the same step on both sides.
echo "== planned vs grow, resnet50 bs256 fp16 NHWC, gradients only"
timeout 600 "$bin/dlprobe" memory --overwrite --model resnet50 --batch 256 --precision fp16 --layout nhwc --mode grads \
  --tuning-cache "$tuning" --gpu-memory grow,planned --json "$out/memory-planned.json" >"$out/memory-planned.txt" \
  2>"$out/memory-planned.err" || status=1
grep -E "^(==|peak|reserved|arena|NVML)" "$out/memory-planned.txt"

echo "== PyTorch eager, bs256 AMP fp16 channels_last (torch.cuda.max_memory_allocated)"
timeout 300 "$bin/dlprobe" run --overwrite --json "$out/memory-pytorch.json" -- python3 \
  examples/workloads/pytorch_resnet50.py --batch 256 --amp fp16 --channels-last --mode grads --steps 5 \
  --warmup 2 >"$out/memory-pytorch.txt" 2>&1 || status=1
python3 - "$out/memory-pytorch.json" <<'PY' || status=1
import json, sys
c = json.load(open(sys.argv[1]))["configurations"][0]
m = c["memory"] or {}
gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"
print("pytorch: status", c["status"], "| allocated peak", gib(m.get("framework_peak_allocated_bytes")),
      "| reserved peak", gib(m.get("framework_peak_reserved_bytes")),
      "| NVML process peak", gib(m.get("nvml_process_peak_bytes")))
PY
fi

if want maxbatch; then
# cuDNN heuristic engines, so each trial plans in seconds; each precision in its layout (strict
# fp32's NHWC data gradient is 28 times slower than NCHW's).
for spec in ${MAXBATCH_SPECS:-fp32:nchw fp16:nhwc}; do
  precision=${spec%%:*}
  echo "== max batch under 16 GiB, $precision"
  timeout 300 "$bin/dlprobe" memory --overwrite --model resnet50 --max-batch --limit 16GiB \
    --precision "$precision" --layout "${spec##*:}" --gpu-memory "${MAXBATCH_MEMORY:-grow,planned}" \
    --conv-algo heuristic ${MAXBATCH_FLAGS:-} \
    --json "$out/memory-maxbatch-$precision.json" >"$out/memory-maxbatch-$precision.txt" \
    2>"$out/memory-maxbatch-$precision.err" || status=1
  grep -E "^(==|predicted|found|  batch|largest| )" "$out/memory-maxbatch-$precision.txt"
done
fi

echo "== report"
"$bin/dlprobe" report --overwrite $(ls "$out"/memory-fp32.json "$out"/memory-fp16.json "$out"/memory-planned.json \
  "$out"/memory-maxbatch-fp32.json "$out"/memory-maxbatch-fp16.json 2>/dev/null) \
  -o "$out/memory-report.html" || status=1
exit $status
