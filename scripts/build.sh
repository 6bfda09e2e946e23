#!/usr/bin/env bash
# Configures and builds dlprobe into ./build (the binary is ./build/dlprobe). Extra arguments go to
# CMake's configure step, e.g. -DDLPROBE_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DLPROBE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build_dir" --parallel "${DLPROBE_JOBS:-$(nproc)}"
