#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): how far the step moves with the
# convolution tuning's own choices. Each run tunes afresh (a tuning cache of its own that its
# first run fills), REPS times (default 4) for every build (BUILDS, binaries under .devbuild/bin,
# default "dlprobe") and config (CONFIGS, default "fp16:64 fp16:32 fp16:256"), builds alternating
# within each repetition; each figure is a first run's timed window, so it holds the tuning's
# choices and not the spread of one cache's runs (lab/gpu/builds.sh shares one cache instead).
# img/s and peak per run in $out/ab.txt, then each build and config's runs side by side; the
# caches stay in $out for comparing their choices. Output in $OUT (or ./gpu-check-out).
#   BUILDS="dlprobe dlprobe-branch" CONFIGS="fp16:64 bf16:256" REPS=4 lab/gpu/tunings.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
for rep in $(seq 1 "${REPS:-4}"); do
  for build in ${BUILDS:-dlprobe}; do
    for config in ${CONFIGS:-fp16:64 fp16:32 fp16:256}; do
      CONFIGS=$config ROUNDS=1 TAG=rep$rep-$build- DLPROBE=$bin/$build \
        BENCH_FLAGS="--tuning-cache $out/cache-rep$rep-$build.json" bench_ab --conv-algo autotune
    done
  done
done
echo "== fresh tunings, img/s"
for build in ${BUILDS:-dlprobe}; do
  for config in ${CONFIGS:-fp16:64 fp16:32 fp16:256}; do
    figures=$(grep -E "^rep[0-9]+-$build-${config%%:*}-bs${config##*:}-" "$out/ab.txt" |
      sed -E 's/.*: ([0-9.]+) img\/s.*/\1/' | paste -sd' ')
    echo "$build $config: $figures"
  done
done
