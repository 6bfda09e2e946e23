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

while read -r line; do summary+=("$line"); done < <(./scripts/gpu-tests.sh)

echo "== doctor"
"$bin/dlprobe" doctor >"$out/doctor.txt" 2>&1 && summary+=("doctor: ok") || summary+=("doctor: exit $?")
"$bin/dlprobe" doctor --json >"$out/doctor.json" 2>"$out/doctor-json.err" || summary+=("doctor --json: failed")

echo "== monitor vs nvidia-smi dmon"
python3 lab/gpu/gpu_load.py --seconds 40 >"$out/gpu-load.log" 2>&1 &
load=$!
sleep 4
TZ=UTC nvidia-smi dmon -s pm -o DT -d 1 -c 30 >"$out/dmon.txt" 2>&1 &
dmon=$!
"$bin/dlprobe" monitor --overwrite -i 100ms --duration 30s --csv "$out/monitor.csv" >/dev/null 2>"$out/monitor.err"
wait "$dmon" "$load"
python3 lab/gpu/monitor_vs_dmon.py "$out/monitor.csv" "$out/dmon.txt" >"$out/monitor-vs-dmon.txt" 2>&1
summary+=("monitor vs dmon: exit $?")

echo
cat "$out/doctor.txt" | tail -n 40
cat "$out/monitor-vs-dmon.txt"
printf '%s\n' "${summary[@]}"
