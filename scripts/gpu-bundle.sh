#!/usr/bin/env bash
# Builds dlprobe for a GPU machine and gathers what must travel there into .devbuild/: the dlprobe
# binary, every test binary that has tests labelled `gpu` (stripped), a list of those tests, and any
# non-system shared library the binaries need. The GPU machine then runs scripts/gpu-check.sh
# without building (it lacks Debian's headers). oneDNN stays off: the CPU backend is tested in CI.
# Release: the binaries are stripped below, so debug information would only cost compile time.
set -euo pipefail
cd "$(dirname "$0")/.."
DLPROBE_TARGETS=all DLPROBE_BUILD_DIR=build-gpu ./scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DDLPROBE_WITH_ONEDNN=OFF \
  -DDLPROBE_BUILD_BENCH=ON "$@"

# BUNDLE_AS=NAME: this tree's dlprobe and GPU test binaries join the bundle already there as
# dlprobe-NAME, step_cuda_test-NAME and engine_cuda_test-NAME, for lab/gpu/builds.sh to set
# beside the bundle's own; nothing else changes.
if [ -n "${BUNDLE_AS:-}" ]; then
  [ -d .devbuild/bin ] || { echo "gpu-bundle: BUNDLE_AS needs a bundle in .devbuild" >&2; exit 2; }
  for binary in dlprobe tests/step/step_cuda_test tests/engine/engine_cuda_test; do
    strip --strip-unneeded -o ".devbuild/bin/$(basename "$binary")-$BUNDLE_AS" "build-gpu/$binary"
  done
  du -sh .devbuild
  exit 0
fi

rm -rf .devbuild && mkdir -p .devbuild/bin .devbuild/lib
cp build-gpu/dlprobe .devbuild/bin/
# The GPU microbenchmarks (lab/gpu/conv-fusion.sh and stem.sh run them).
cp build-gpu/microbench/bench_conv_fusion_gpu build-gpu/microbench/bench_stem_conv_gpu .devbuild/bin/
# Tests labelled gpu, as "binary<TAB>gtest filter" lines.
ctest --test-dir build-gpu -L gpu --show-only=json-v1 | python3 -c '
import json, os, sys
for t in json.load(sys.stdin)["tests"]:
    cmd = t["command"]
    flt = next((a for a in cmd[1:] if a.startswith("--gtest_filter=")), "")
    print(os.path.basename(cmd[0]) + "\t" + flt)
' > .devbuild/gpu-tests.tsv
cut -f1 .devbuild/gpu-tests.tsv | sort -u | while read -r name; do
  cp "$(find build-gpu -type f -name "$name" -perm -u+x | head -n1)" .devbuild/bin/
done
# Helper executables the tests start (fake workloads, fake NVML) travel too.
find build-gpu -maxdepth 3 -type f \( -name 'libfake_nvml*.so' -o -name 'dlprobe_*workload*' \) \
  -exec cp {} .devbuild/lib/ \;
strip --strip-unneeded .devbuild/bin/*
# lab/gpu/slow-calls.sh's CUDA injection library, with the CUPTI it was built against, where
# this machine has CUPTI (only that lab script needs it).
cupti=$(ls /usr/local/cuda/lib64/libcupti.so.* /usr/local/cuda/lib/libcupti.so.* 2>/dev/null | head -n 1)
if [ -n "$cupti" ]; then
  g++ -std=c++20 -O2 -shared -fPIC -Wall -Wextra -Werror -I/usr/local/cuda/include \
    lab/gpu/slow_calls.cpp -L"$(dirname "$cupti")" -lcupti -Wl,-rpath,'$ORIGIN' \
    -o .devbuild/lib/libslow_calls.so
  cp -L "$cupti" .devbuild/lib/
else
  echo "gpu-bundle: no CUPTI under /usr/local/cuda; lab/gpu/slow-calls.sh will not run" >&2
fi
# Shared libraries from Debian that Ubuntu's image may lack (cpp-httplib, fmt, RE2, TurboJPEG,
# SQLite, Google Benchmark); the CUDA ones are there.
for lib in $(ldd .devbuild/bin/* 2>/dev/null | awk '/=> \/(usr\/)?lib.*(httplib|libfmt|libre2|libturbojpeg|libsqlite3|libbenchmark)/ {print $3}' | sort -u); do
  cp -L "$lib" .devbuild/lib/
done
du -sh .devbuild
