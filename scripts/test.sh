#!/usr/bin/env bash
# The whole CPU test suite: the normal build, then an AddressSanitizer + UndefinedBehaviorSanitizer
# build of the tests (CPU code only: CUDA's runtime and ASan do not mix, and no GPU runs here).
# Tests labelled `gpu` are left out; run them on a GPU machine with `ctest --test-dir build -L gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DLPROBE_JOBS:-$(nproc)}

echo "== build (RelWithDebInfo) =="
./scripts/build.sh
ctest --test-dir build -LE gpu --output-on-failure -j "$jobs"

echo "== build (ASan + UBSan) =="
DLPROBE_BUILD_DIR=build-asan ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DDLPROBE_SANITIZE=ON \
  -DDLPROBE_WITH_CUDA=OFF -DDLPROBE_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -LE gpu --output-on-failure -j "$jobs"
