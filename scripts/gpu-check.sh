#!/usr/bin/env bash
# Runs on a GPU machine over the bundle that scripts/gpu-bundle.sh made (.devbuild/): every test
# labelled `gpu`, `dlprobe doctor` with its measured ceilings, and `dlprobe monitor` against
# `nvidia-smi dmon` under a known load. Logs go to $OUT (or ./gpu-check-out); a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
bin=.devbuild/bin
. scripts/gpu-env.sh
summary=()

echo "== gpu tests" | tee "$out/gpu-tests.log"
for binary in $(cut -f1 .devbuild/gpu-tests.tsv | sort -u); do
  filter=$(awk -F'\t' -v b="$binary" '$1 == b {sub("--gtest_filter=", "", $2); print $2}' \
    .devbuild/gpu-tests.tsv | paste -sd: -)
  if "$bin/$binary" --gtest_filter="$filter" --gtest_brief=1 >>"$out/gpu-tests.log" 2>&1; then
    summary+=("PASS $binary")
  else
    summary+=("FAIL $binary (see gpu-tests.log)")
  fi
done

echo "== doctor"
"$bin/dlprobe" doctor >"$out/doctor.txt" 2>&1 && summary+=("doctor: ok") || summary+=("doctor: exit $?")
"$bin/dlprobe" doctor --json >"$out/doctor.json" 2>"$out/doctor-json.err" || summary+=("doctor --json: failed")

echo "== monitor vs nvidia-smi dmon"
python3 bench/gpu/gpu_load.py --seconds 40 >"$out/gpu-load.log" 2>&1 &
load=$!
sleep 4
TZ=UTC nvidia-smi dmon -s pm -o DT -d 1 -c 30 >"$out/dmon.txt" 2>&1 &
dmon=$!
"$bin/dlprobe" monitor -i 100ms --duration 30s --csv "$out/monitor.csv" >/dev/null 2>"$out/monitor.err"
wait "$dmon" "$load"
python3 bench/gpu/monitor_vs_dmon.py "$out/monitor.csv" "$out/dmon.txt" >"$out/monitor-vs-dmon.txt" 2>&1
summary+=("monitor vs dmon: exit $?")

echo
cat "$out/doctor.txt" | tail -n 40
cat "$out/monitor-vs-dmon.txt"
printf '%s\n' "${summary[@]}"
