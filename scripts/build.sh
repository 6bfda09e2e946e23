#!/usr/bin/env bash
# Configures and builds dlprobe into ./build (the binary is ./build/dlprobe). Extra arguments go to
# CMake's configure step, e.g. -DDLPROBE_WITH_CUDA=OFF. Builds the tool alone unless
# DLPROBE_TARGETS names others ("all": the tests and microbenchmarks too, as scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DLPROBE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
# shellcheck disable=SC2086 # DLPROBE_TARGETS is a list of target names
cmake --build "$build_dir" --parallel "${DLPROBE_JOBS:-$(nproc)}" --target ${DLPROBE_TARGETS:-dlprobe}
