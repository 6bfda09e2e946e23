#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): what each `--conv-algo` choice (ALGOS,
# default "autotune exhaustive") buys and costs. ROUNDS rounds (default 2) of every choice in turn
# per CONFIGS (bench_ab's), each choice with a tuning cache of its own that its first run fills:
# img/s and peak in $out/ab.txt, every run's wall time (round 1's holds the tuning) in
# $out/wall.txt. DLPROBE names another build of the binary and NAME a prefix for its runs and
# caches. Output in $OUT (or ./gpu-check-out).
#   ALGOS="autotune exhaustive" CONFIGS="fp16:256 fp16:32" lab/gpu/conv-algo.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
name=${NAME:-}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for config in ${CONFIGS:-fp16:256 fp16:32}; do
    for algo in ${ALGOS:-autotune exhaustive}; do
      start=$(date +%s%N)
      CONFIGS=$config ROUNDS=1 TAG=round$round-$name \
        BENCH_FLAGS="--tuning-cache $out/cache-$name$algo.json" bench_ab --conv-algo "$algo"
      echo "round$round $name$config $algo: $((($(date +%s%N) - start) / 1000000)) ms" |
        tee -a "$out/wall.txt"
    done
  done
done
