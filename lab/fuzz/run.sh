#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer (fuzz/README.md): builds every fuzz target with clang 16
# or later (CC/CXX, else clang-16 where installed: Debian's clang 14 lacks std::source_location),
# ASan and UBSan (DLPROBE_FUZZ_LIBFUZZER=ON, in build-fuzz/), then runs each for SECONDS from its
# seed corpus and dictionary, one after the other, and prints per target the executions, the
# corpus it grew (inputs and bytes, in build-fuzz/fuzz/grown/<target>; the repository's seeds
# stay as they are) and the crashes, whose inputs are left in build-fuzz/fuzz/artifacts/<target>/.
#   lab/fuzz/run.sh [SECONDS] [TARGET...]      (default 60 s, every target)
# Exit 1 when any target crashed, hung or leaked.
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
shift || true
build=${DLPROBE_FUZZ_BUILD:-build-fuzz}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*.dict; do targets+=("$(basename "$f" .dict)"); done
fi

if [ ! -f "$build/build.ninja" ]; then
  CC=${CC:-$(command -v clang-16 || echo clang)} CXX=${CXX:-$(command -v clang++-16 || echo clang++)} \
    cmake -S . -B "$build" -G Ninja -DDLPROBE_SANITIZE=ON \
    -DDLPROBE_WITH_CUDA=OFF -DDLPROBE_FUZZ_LIBFUZZER=ON >/dev/null || exit 2
fi
cmake --build "$build" -j "${DLPROBE_JOBS:-1}" --target "${targets[@]/#/fuzz_}" >/dev/null || exit 2

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
failed=0
printf '%-20s %10s %8s %10s %10s %8s %8s\n' target seconds execs exec/s "corpus" bytes crashes
for t in "${targets[@]}"; do
  grown="$build/fuzz/grown/$t"
  artifacts="$build/fuzz/artifacts/$t"
  mkdir -p "$grown" "$artifacts"
  log="$build/fuzz/$t.log"
  start=$(date +%s.%N)
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -seed=1 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" -dict="fuzz/$t.dict" "$grown" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  elapsed=$(echo "$(date +%s.%N) - $start" | bc)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  inputs=$(find "$grown" "fuzz/corpus/$t" -type f | wc -l)
  bytes=$(find "$grown" "fuzz/corpus/$t" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  crashes=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'leak-*' \
    -o -name 'oom-*' \) | wc -l)
  printf '%-20s %10.1f %8s %10s %10s %8s %8s\n' "$t" "$elapsed" "${execs:-?}" "${rate:-?}" \
    "$inputs" "$bytes" "$crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    grep -m 3 -E 'ERROR|runtime error|deadly signal|Test unit written' "$log" | sed 's/^/    /'
  fi
done
exit $failed
