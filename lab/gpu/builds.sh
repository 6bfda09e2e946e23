#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): builds of dlprobe side by side, for a
# change no flag turns off (a kernel's code). BUILDS names binaries under .devbuild/bin (default
# "dlprobe"; build the others with scripts/gpu-bundle.sh and copy them there under other names).
# First engine_cuda_test's tests matching TESTS (a gtest filter; none unless given) and
# step_cuda_test's matching STEP_TESTS, with the bundle's own build; then every build's ResNet-50
# steps per CONFIGS (default "fp16:256 fp16:32"), ROUNDS rounds (default 2) with the builds in turn
# in each, one tuning cache for all; img/s and peak allocated per run in ab.txt, each line named
# round<N>-<build>-<config>. Unless NCU=0, each build's kernel table last
# (lab/gpu/kernel-table.sh). Output in $OUT (or ./gpu-check-out).
#   BUILDS="dlprobe-old dlprobe" TESTS='*batch_norm*' lab/gpu/builds.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
if [ -n "${TESTS:-}" ]; then
  echo "== engine_cuda_test $TESTS"
  timeout "${TEST_TIMEOUT:-150}" "$bin/engine_cuda_test" --gtest_filter="$TESTS" >"$out/engine-tests.log" 2>&1
  grep -E '^\[ +(OK|FAILED|PASSED) |Failure' "$out/engine-tests.log" | head -n 60
fi
[ -n "${STEP_TESTS:-}" ] && step_tests "$STEP_TESTS"
builds=${BUILDS:-dlprobe}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for build in $builds; do
    ROUNDS=1 TAG=round$round-$build- DLPROBE=$bin/$build \
      BENCH_FLAGS="--tuning-cache $out/tuning.json" bench_ab --recompute none
  done
done
if [ "${NCU:-1}" != 0 ]; then
  for build in $builds; do
    DLPROBE=$bin/$build TAG=$build- lab/gpu/kernel-table.sh | head -n 12
  done
fi
