#!/usr/bin/env bash
# Installs every Debian package dlprobe's build and tests need. Idempotent: when all are present it
# changes nothing and asks no registry. Run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache git pkg-config python3
  # lab/peers/compare_pytorch.py --self-test (its comparison helpers) runs in the tests.
  python3-numpy
  libfmt-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libre2-dev libturbojpeg0-dev
  libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # oneDNN's CMake package looks for OpenCL (Debian builds it with the OCL GPU runtime), which
  # is only a recommendation of libdnnl-dev, so a --no-install-recommends install needs it named.
  libdnnl-dev ocl-icd-opencl-dev
  chromium
  # Chart.js, embedded at build time in the HTML report (src/report/CMakeLists.txt).
  libjs-chart.js
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  echo "setup: CUDA toolkit found: the CUDA backend will be built" >&2
else
  echo "setup: no CUDA toolkit (nvcc) found: dlprobe builds without its CUDA backend" >&2
fi
echo "setup: done" >&2
