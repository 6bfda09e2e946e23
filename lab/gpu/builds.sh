#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): builds of dlprobe side by side, for a
# change no flag turns off (a kernel's code, another branch). BUILDS names binaries under
# .devbuild/bin (default "dlprobe"); `BUNDLE_AS=NAME scripts/gpu-bundle.sh` in another tree adds
# dlprobe-NAME with its step_cuda_test-NAME and engine_cuda_test-NAME. First each build's GPU
# tests: engine_cuda_test's matching TESTS and step_cuda_test's matching STEP_TESTS (gtest
# filters; none unless given), from the test binaries of the build's name; then every build's
# ResNet-50 steps per CONFIGS (default "fp16:256 fp16:32"), ROUNDS rounds (default 2) with the
# builds in turn in each, one tuning cache for all; img/s and peak allocated per run in ab.txt,
# each line named round<N>-<build>-<config>. Unless NCU=0, each build's kernel table last
# (lab/gpu/kernel-table.sh). Output in $OUT (or ./gpu-check-out).
#   BUILDS="dlprobe dlprobe-branch" TESTS='*batch_norm*' STEP_TESTS='*Fp16*' lab/gpu/builds.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
builds=${BUILDS:-dlprobe}
# `gpu_tests BINARY FILTER`: the binary's tests matching FILTER, their lines in BINARY.log.
gpu_tests() {
  [ -n "$2" ] || return 0
  if [ ! -x "$bin/$1" ]; then
    echo "== $1: not in the bundle"
    return 0
  fi
  echo "== $1 $2"
  timeout "${TEST_TIMEOUT:-150}" "$bin/$1" --gtest_filter="$2" >"$out/$1.log" 2>&1
  local rc=$?
  grep -E '^\[ +(OK|FAILED|PASSED) |Failure' "$out/$1.log" | head -n 60
  # A run cut short prints no summary line: say so, or its tests would read as none run.
  if [ "$rc" = 124 ]; then
    echo "== $1: timed out after ${TEST_TIMEOUT:-150} s, $(grep -c '^\[ \+OK ' "$out/$1.log") tests passed by then"
  elif [ "$rc" != 0 ]; then
    echo "== $1: exit $rc"
  fi
}
for build in $builds; do
  suffix=${build#dlprobe}  # "" for the bundle's own, "-NAME" for dlprobe-NAME
  gpu_tests "engine_cuda_test$suffix" "${TESTS:-}"
  gpu_tests "step_cuda_test$suffix" "${STEP_TESTS:-}"
done
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
