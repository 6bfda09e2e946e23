#!/usr/bin/env bash
# One device call of the GPU acceptance runs: the named bench/gpu scripts in turn, all within
# BUDGET seconds (default 560, under the device's 600 s a call), each script's own output under
# gpu-check-out/<script>/, and everything packed into $OUT/<stage>.tgz at the end, also when the
# budget cut a script short (the device brings back only a few files, and nothing of a command it
# had to kill). The console log of every script is kept in the archive too.
#   scripts/gpu-stage.sh engine engine-run.sh peers.sh
#   BUDGET=580 scripts/gpu-stage.sh evaluate evaluate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: $0 STAGE SCRIPT... (scripts of bench/gpu)" >&2
  exit 2
fi
stage=$1
shift
budget=${BUDGET:-560}
dest=${OUT:-gpu-check-out}
work=gpu-check-out/$stage
mkdir -p "$work" "$dest"
deadline=$(($(date +%s) + budget))
for script in "$@"; do
  left=$((deadline - $(date +%s) - 10))  # ten seconds kept for packing
  if [ "$left" -le 0 ]; then
    echo "== $script: not run, the stage's $budget s are spent" | tee -a "$work/stage.log"
    continue
  fi
  name=${script%.sh}
  mkdir -p "$work/$name"
  echo "== $script (at most $left s)" | tee -a "$work/stage.log"
  start=$(date +%s)
  OUT=$work/$name timeout --kill-after=5 "$left" "bench/gpu/$script" 2>&1 | tee "$work/$name/console.log"
  echo "== $script: exit ${PIPESTATUS[0]} after $(($(date +%s) - start)) s" | tee -a "$work/stage.log"
  # A script cut by the budget can leave processes behind (the scripts' own `timeout`s start
  # process groups of their own): they would run on the GPU beside the next script.
  pkill -f '\.devbuild/bin/' 2>/dev/null
  pkill -f 'examples/workloads/' 2>/dev/null
  sleep 1
done
tar czf "$dest/$stage.tgz" -C gpu-check-out "$stage"
echo "packed $dest/$stage.tgz"
