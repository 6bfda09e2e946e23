#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): does the spread between runs that
# `dlprobe bench --repeat 3` reports cover runs in separate processes? ResNet-50 fp16 bs256
# gradients, once with --repeat 3 (three runs from scratch in one process: their t interval), then
# three separate processes; lab/gpu/spread_check.py says whether each process's figure lies within
# the reported spread. JSON and logs go to $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
args=(bench --model resnet50 --batch 256 --precision fp16 --mode grads --no-ceiling --overwrite)
echo "== --repeat 3"
timeout 150 "$bin/dlprobe" "${args[@]}" --repeat 3 --json "$out/repeat.json" 2>"$out/repeat.err" |
  tee "$out/repeat.txt"
for i in 1 2 3; do
  echo "== process $i"
  timeout 90 "$bin/dlprobe" "${args[@]}" --json "$out/process$i.json" 2>"$out/process$i.err" |
    tail -n 2
done
${PYTHON:-python3} lab/gpu/spread_check.py "$out/repeat.json" "$out"/process{1,2,3}.json
