#!/usr/bin/env bash
# Runs on a GPU machine over the bundle that scripts/gpu-bundle.sh made (.devbuild/): every test
# labelled `gpu`, one binary at a time, into $OUT/gpu-tests.log (or ./gpu-check-out); prints one
# PASS/FAIL line per binary and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
bin=.devbuild/bin
. scripts/gpu-env.sh
status=0
echo "== gpu tests" >>"$out/gpu-tests.log"
# BINARIES="engine_cuda_test step_cuda_test" runs only those.
for binary in $(cut -f1 .devbuild/gpu-tests.tsv | sort -u); do
  [[ -n ${BINARIES:-} && " $BINARIES " != *" $binary "* ]] && continue
  filter=$(awk -F'\t' -v b="$binary" '$1 == b {sub("--gtest_filter=", "", $2); print $2}' \
    .devbuild/gpu-tests.tsv | paste -sd: -)
  # A binary registered whole (dlprobe_add_test ONE_PROCESS) has no filter: all of its tests run.
  args=()
  [ -n "$filter" ] && args=(--gtest_filter="$filter")
  if timeout "${GPU_TEST_TIMEOUT:-300}" "$bin/$binary" "${args[@]}" >>"$out/gpu-tests.log" 2>&1; then
    echo "PASS $binary"
  else
    echo "FAIL $binary (see gpu-tests.log)"
    status=1
  fi
done
exit $status
