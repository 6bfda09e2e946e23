#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): how long `dlprobe bench` takes from
# the process's start to its first timed step (ResNet-50 fp16 BATCH (256) grads, the default
# warm-up): without a tuning cache, then with the cache that run wrote. A bound: each figure is
# the process's run time less its timed window (so it also holds the teardown). Then ROUNDS (2)
# rounds of two runs, alternating: with that cache, and with it less the fused graphs' plans (so
# that they are built again, as before the cache kept them). Output in $OUT (or
# ./gpu-check-out)/startup.txt. Last, one run with the cache and --verbose, each line of its log
# stamped with the seconds since its start (startup-trace.txt): where the time goes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cache=$work/tuning.json
: >"$out/startup.txt"
# `startup NAME CACHE`: one run over CACHE, its line appended to startup.txt.
startup() {
  local run=$1 file=$2 start end code
  start=$(date +%s.%N)
  timeout 120 "$bin/dlprobe" bench --model resnet50 --batch "${BATCH:-256}" --precision fp16 \
    --mode grads --min-time 1s --tuning-cache "$file" --no-ceiling --overwrite \
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
}
startup no-cache "$cache"
startup cache "$cache"
echo "tuning cache: $(wc -c <"$cache") bytes, $(grep -c '"plan"' "$cache") serialized plans" |
  tee -a "$out/startup.txt"
python3 - "$cache" "$work/unfused.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["entries"] = {k: v for k, v in c["entries"].items() if "plan" not in v}
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
for round in $(seq 1 "${ROUNDS:-2}"); do
  cp "$cache" "$work/with.json"
  startup "cache-r$round" "$work/with.json"
  cp "$work/unfused.json" "$work/without.json"
  startup "cache-without-plans-r$round" "$work/without.json"
done
start=$(date +%s.%N)
timeout 120 "$bin/dlprobe" --verbose bench --model resnet50 --batch "${BATCH:-256}" \
  --precision fp16 --mode grads --min-time 1s --tuning-cache "$cache" --no-ceiling --overwrite \
  --json "$out/startup-trace.json" 2>&1 | python3 -u -c '
import sys, time
start = float(sys.argv[1])
for line in sys.stdin:
    sys.stdout.write(f"{time.time() - start:7.3f} {line}")' "$start" >"$out/startup-trace.txt"
