#!/usr/bin/env bash
# The whole CPU test suite: the normal build, then an AddressSanitizer + UndefinedBehaviorSanitizer
# build of the tests (CPU code only: CUDA's runtime and ASan do not mix, and no GPU runs here).
# Tests labelled `gpu` are left out; run them on a GPU machine with `ctest --test-dir build -L gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DLPROBE_JOBS:-$(nproc)}

echo "== build (RelWithDebInfo) =="
DLPROBE_TARGETS=all ./scripts/build.sh
ctest --test-dir build -LE gpu --output-on-failure -j "$jobs"

echo "== build (ASan + UBSan) =="
DLPROBE_TARGETS=all DLPROBE_BUILD_DIR=build-asan ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DDLPROBE_SANITIZE=ON \
  -DDLPROBE_WITH_CUDA=OFF -DDLPROBE_BUILD_BENCH=OFF
# intercept_tls_get_addr=0: up to GCC 13, the runtime's __tls_get_addr interceptor can take a malloc'd
# dynamic-TLS block at a 4096-byte offset for a pre-2.25 glibc header, and LeakSanitizer's tracer then
# dies at exit ("Tracer caught signal 11") with no leak found. It hit a CPU bench child in CI once.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -LE gpu --output-on-failure -j "$jobs"
