#!/usr/bin/env bash
# One device call of the GPU acceptance runs: the named lab/gpu scripts in turn, all within
# BUDGET seconds (default 560, under the device's 600 s a call), each script's own output under
# gpu-check-out/<script>/, and everything packed into $OUT/<stage>.tgz (the device brings back only
# a few files). The archive is rewritten every PACK_EVERY seconds (default 20) while the scripts run,
# not only at the end: the device can end a call before the stage's own budget does (the device
# time ran out mid-call once, and that call's logs were lost). The console log of every
# script is kept in the archive too.
#   scripts/gpu-stage.sh engine engine-run.sh peers.sh
#   BUDGET=580 scripts/gpu-stage.sh evaluate evaluate.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ $# -lt 2 ]; then
  echo "usage: $0 STAGE SCRIPT... (scripts of lab/gpu)" >&2
  exit 2
fi
stage=$1
shift
budget=${BUDGET:-560}
dest=${OUT:-gpu-check-out}
work=gpu-check-out/$stage
mkdir -p "$work" "$dest"
deadline=$(($(date +%s) + budget))
pack() {
  tar czf "$dest/$stage.tgz.part" -C gpu-check-out "$stage" 2>/dev/null &&
    mv -f "$dest/$stage.tgz.part" "$dest/$stage.tgz"
}
# The packer exits on TERM only between commands (bash runs a trap once its foreground command
# ends), so a tar it has started finishes before the final pack below writes the same file; the
# sleep runs in the background so that `wait` lets the trap in at once.
(
  trap 'exit 0' TERM
  while true; do
    sleep "${PACK_EVERY:-20}" &
    wait $!
    pack
  done
) &
packer=$!
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
  OUT=$work/$name timeout --kill-after=5 "$left" "lab/gpu/$script" 2>&1 | tee "$work/$name/console.log"
  echo "== $script: exit ${PIPESTATUS[0]} after $(($(date +%s) - start)) s" | tee -a "$work/stage.log"
  # A script cut by the budget can leave processes behind (the scripts' own `timeout`s start
  # process groups of their own): they would run on the GPU beside the next script.
  pkill -f '\.devbuild/bin/' 2>/dev/null
  pkill -f 'examples/workloads/' 2>/dev/null
  sleep 1
done
kill "$packer" 2>/dev/null
wait "$packer" 2>/dev/null
pack
echo "packed $dest/$stage.tgz"
