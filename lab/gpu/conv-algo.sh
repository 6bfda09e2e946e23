#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): what each `--conv-algo` choice (ALGOS,
# default "autotune exhaustive") buys and costs. ROUNDS rounds (default 2) of every build (BUILDS,
# binaries under .devbuild/bin, default "dlprobe") and choice in turn per CONFIGS (bench_ab's),
# each build and choice with a tuning cache of its own that its first run fills: img/s and peak
# in $out/ab.txt, every run's wall time (round 1's holds the tuning) in $out/wall.txt. Output in
# $OUT (or ./gpu-check-out).
#   ALGOS="autotune exhaustive" CONFIGS="fp16:256 fp16:32" lab/gpu/conv-algo.sh
#   BUILDS="dlprobe dlprobe-branch" ALGOS=exhaustive lab/gpu/conv-algo.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
for round in $(seq 1 "${ROUNDS:-2}"); do
  for config in ${CONFIGS:-fp16:256 fp16:32}; do
    for build in ${BUILDS:-dlprobe}; do
      for algo in ${ALGOS:-autotune exhaustive}; do
        start=$(date +%s%N)
        CONFIGS=$config ROUNDS=1 TAG=round$round-$build- DLPROBE=$bin/$build \
          BENCH_FLAGS="--tuning-cache $out/cache-$build-$algo.json" bench_ab --conv-algo "$algo"
        echo "round$round $build $config $algo: $((($(date +%s%N) - start) / 1000000)) ms" |
          tee -a "$out/wall.txt"
      done
    done
  done
done
