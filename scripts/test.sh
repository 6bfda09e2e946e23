#!/usr/bin/env bash
# The whole CPU test suite, in one build: the tool and its libraries compiled with
# AddressSanitizer and UndefinedBehaviorSanitizer (-O1) under the tests, so that a bad input which reads out of
# bounds or overflows fails its test instead of passing by luck. CUDA's runtime and ASan do not mix,
# so this build leaves the CUDA backend out.
# Tests labelled `gpu` need a GPU: scripts/gpu-check.sh runs them on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DLPROBE_JOBS:-$(nproc)}

echo "== build (ASan + UBSan, CPU backends) =="
DLPROBE_TARGETS=all DLPROBE_BUILD_DIR=build-test ./scripts/build.sh -DDLPROBE_SANITIZE=ON \
  -DDLPROBE_WITH_CUDA=OFF
# intercept_tls_get_addr=0: up to GCC 13, the runtime's __tls_get_addr interceptor can take a malloc'd
# dynamic-TLS block at a 4096-byte offset for a pre-2.25 glibc header, and LeakSanitizer's tracer then
# dies at exit ("Tracer caught signal 11") with no leak found. It hit a CPU bench child in CI once.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-test -LE gpu --output-on-failure -j "$jobs"

# Where a CUDA toolkit is installed, ./build compiles every CUDA source (the backend's kernels and
# host code, its GPU tests and GPU microbenchmarks; warnings are errors there too) and runs the
# host-side tests, which need no GPU. The tool itself is the quick start's build.
# DLPROBE_TEST_CUDA=0 leaves this out.
if [ "${DLPROBE_TEST_CUDA:-1}" != 0 ] && { [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; }; then
  echo "== build (the CUDA backend and its tests) =="
  DLPROBE_TARGETS="dlprobe_cuda_backend engine_cuda_host_test engine_cuda_test bench_conv_fusion_gpu bench_stem_conv_gpu" \
    ./scripts/build.sh
  ctest --test-dir build -L cuda_host --output-on-failure -j "$jobs"
fi
