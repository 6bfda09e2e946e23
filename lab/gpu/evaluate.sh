#!/usr/bin/env bash
# On a GPU machine over the bundle that scripts/gpu-bundle.sh made (.devbuild/): the acceptance runs
# of `dlprobe evaluate` and the bench sweeps. Everything lands under $OUT (or
# ./gpu-check-out); a summary is printed last.
#   1. `dlprobe evaluate` twice back to back, each timed (the limit is 5 minutes); the first
#      tunes from nothing, the second runs the engines the first chose (its tuning.json);
#   2. `dlprobe compare` of the two runs with a 2% noise threshold: every configuration must say
#      "no change", and the largest |ratio - 1| is printed;
#   3. inference throughput and latency per batch, batch 1 included;
#   4. `--batch auto` walking up to the first out-of-memory, and `--repeat 3` runs from scratch
#      (3 and 4 are left out under EXTRAS=0).
# Render the report screenshot afterwards on a machine with Chromium:
#   lab/gpu/screenshot.sh gpu-check-out/evaluate-1/report.html docs/evaluate-h200.png
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
summary=()
for run in 1 2; do
  echo "== dlprobe evaluate, run $run"
  rm -rf "$out/evaluate-$run"
  # Run 2 runs the engines run 1 chose (run 1 keeps them in its folder's tuning.json).
  reuse=()
  [ "$run" = 2 ] && reuse=(--tuning-cache "$out/evaluate-1/tuning.json")
  start=$(date +%s)
  timeout 900 "$bin/dlprobe" evaluate --out "$out/evaluate-$run" "${reuse[@]}" \
    >"$out/evaluate-$run.txt" 2>"$out/evaluate-$run.err"
  rc=$?
  seconds=$(($(date +%s) - start))
  cat "$out/evaluate-$run.txt"
  summary+=("evaluate run $run: exit $rc in ${seconds} s (limit 300 s)")
done

echo "== compare run 1 vs run 2 (noise threshold 2%)"
"$bin/dlprobe" compare "$out/evaluate-1/results.json" "$out/evaluate-2/results.json" --noise 2% \
  | tee "$out/compare.txt"
"$bin/dlprobe" compare "$out/evaluate-1/results.json" "$out/evaluate-2/results.json" --noise 2% \
  --json >"$out/compare.json" 2>/dev/null
summary+=("$(python3 - "$out/compare.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
verdicts = [r["verdict"] for r in rows]
worst = max((abs(x - 1) for x in ratios), default=float("nan"))
print(f"compare: {verdicts.count('no change')} of {len(rows)} no change, "
      f"largest |ratio - 1| {worst * 100:.2f}%, verdicts {sorted(set(verdicts))}")
PY
)")

# EXTRAS=0 stops here (a short device call: the acceptance runs above only).
if [ "${EXTRAS:-1}" = 0 ]; then
  echo
  printf '%s\n' "${summary[@]}"
  exit 0
fi

echo "== inference: throughput and latency per batch"
timeout 300 "$bin/dlprobe" bench --overwrite --model resnet50 --mode infer --precision bf16,fp16 \
  --layout nhwc --batch 1,8,32,128 --json "$out/infer.json" --md "$out/infer.md" \
  >"$out/infer.txt" 2>"$out/infer.err"
summary+=("bench infer: exit $?")
cat "$out/infer.txt"

echo "== --batch auto: bf16 training up to the first out-of-memory"
timeout 600 "$bin/dlprobe" bench --overwrite --model resnet50 --precision bf16 --layout nhwc --batch auto \
  --batch-start 256 --batch-limit 16384 --steps 5 --min-time 0s --warmup 2 --warmup-time 0s \
  --json "$out/auto.json" >"$out/auto.txt" 2>"$out/auto.err"
summary+=("bench --batch auto: exit $? (0: the walk ended at its out-of-memory)")
cat "$out/auto.txt"

echo "== --repeat 3: three runs of one configuration, each from scratch, and their spread"
timeout 300 "$bin/dlprobe" bench --overwrite --model resnet50 --precision bf16 --layout nhwc --batch 256 \
  --repeat 3 --json "$out/repeat.json" >"$out/repeat.txt" 2>"$out/repeat.err"
summary+=("bench --repeat 3: exit $?")
cat "$out/repeat.txt"

echo
printf '%s\n' "${summary[@]}"
