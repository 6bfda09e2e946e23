#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): how long `dlprobe bench` takes from
# the process's start to its first timed step, without a tuning cache and then with the cache the
# first run wrote (ResNet-50 fp16 bs256 grads, the default warm-up). A bound: each figure is the
# process's run time less its timed window (so it also holds the teardown). Output in $OUT (or
# ./gpu-check-out)/startup.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cache=$work/tuning.json
: >"$out/startup.txt"
for run in no-cache cache; do
  start=$(date +%s.%N)
  timeout 120 "$bin/dlprobe" bench --model resnet50 --batch "${BATCH:-256}" --precision fp16 \
    --mode grads --min-time 1s --tuning-cache "$cache" --no-ceiling --overwrite \
    --json "$out/startup-$run.json" >"$out/startup-$run.txt" 2>&1
  code=$?
  end=$(date +%s.%N)
  python3 - "$run" "$code" "$start" "$end" "$out/startup-$run.json" <<'PY' | tee -a "$out/startup.txt"
import json, sys
run, code, start, end, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
try:
    c = json.load(open(path))["configurations"][0]
    window = c["statistics"]["total_seconds"]
    warm = c["samples"]["warmup"][0]["seconds"]
    print(f"{run}: exit {code}, process {end - start:.2f} s, timed window {window:.2f} s, "
          f"start to first timed step at most {end - start - window:.2f} s (warm-up {warm:.2f} s)")
except (OSError, KeyError, IndexError, ValueError) as e:
    print(f"{run}: exit {code}, no result ({e})")
PY
done
