# Sourced from the repository root by the lab/gpu scripts that run over the bundle
# (scripts/gpu-bundle.sh): where their output goes ($OUT, else ./gpu-check-out), the bundle's
# binaries, and the GPU machine's library path (scripts/gpu-env.sh; the workloads the scripts
# start inherit it, so their Python packages load the same cuDNN).
out=${OUT:-gpu-check-out}
mkdir -p "$out"
bin=$PWD/.devbuild/bin
. scripts/gpu-env.sh
# The JPEG folder of the data scripts, in $data: PIPELINE_DATA, else one of IMAGES JPEGs (default
# 4,000) made on first use and kept for the scripts after it in the same call.
jpeg_dataset() {
  data=${PIPELINE_DATA:-/tmp/dlprobe-jpegs}
  if [ ! -d "$data" ]; then
    "$bin/dlprobe" pipeline make-dataset "$data" --images "${IMAGES:-4000}" --classes 10 | tail -n 1
  fi
}

# `step_tests FILTER`: step_cuda_test's tests matching FILTER (a gtest filter), within TEST_TIMEOUT
# seconds (default 150); the whole log in $out/step-tests.log, each test's line and each failure's
# in $out/step-tests.txt and on stdout. STEP_TEST names another build of the test binary in the
# bundle (step_cuda_test-NAME, beside DLPROBE's dlprobe-NAME).
step_tests() {
  echo "== ${STEP_TEST:-step_cuda_test}"
  timeout "${TEST_TIMEOUT:-150}" "$bin/${STEP_TEST:-step_cuda_test}" --gtest_filter="$1" \
    >"$out/step-tests.log" 2>&1
  grep -E '^\[ +(OK|FAILED|PASSED) |Failure' "$out/step-tests.log" | head -n 60 |
    tee "$out/step-tests.txt"
}

# `bench_ab FLAG A B ...`: ResNet-50 steps (MODE, default grads) with FLAG at each value in turn, per
# CONFIGS (PRECISION:BATCH list, default "fp16:256 fp16:32"), ROUNDS times (default 2),
# alternating so that drift between runs falls on every value alike; img/s and peak allocated per
# run appended to $out/ab.txt, each run's output in $out/<tag>.{txt,err,json}. BENCH_FLAGS go to
# every run (e.g. a --tuning-cache shared by the runs); DLPROBE names another build of the binary,
# TAG a prefix for its runs' names.
bench_ab() {
  local flag=$1
  shift
  local round config precision batch value tag
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for config in ${CONFIGS:-fp16:256 fp16:32}; do
      precision=${config%%:*}
      batch=${config##*:}
      for value in "$@"; do
        tag=${TAG:-}$precision-bs$batch-${MODE:-grads}${flag#-}$value-r$round
        timeout 200 "${DLPROBE:-$bin/dlprobe}" bench --model resnet50 --mode "${MODE:-grads}" --precision "$precision" \
          --batch "$batch" --steps 30 --no-ceiling ${BENCH_FLAGS:-} "$flag" "$value" \
          --json "$out/$tag.json" \
          --overwrite >"$out/$tag.txt" 2>"$out/$tag.err"
        echo "exit $?" >>"$out/$tag.err"
        python3 - "$out/$tag.json" "$tag" <<'PY' | tee -a "$out/ab.txt"
import json, sys
try:
    c = json.load(open(sys.argv[1]))["configurations"][0]
except (OSError, ValueError, KeyError, IndexError) as e:
    print(f"{sys.argv[2]}: no result ({e.__class__.__name__})")
    sys.exit(0)
s = c.get("statistics") or {}
a = (c.get("memory") or {}).get("allocator_stats") or {}
peak = a.get("peak.allocated_bytes")
print(f'{sys.argv[2]}: {s.get("throughput") or 0:.1f} img/s '
      f'(CI {s.get("throughput_ci_low") or 0:.1f}-{s.get("throughput_ci_high") or 0:.1f}), '
      f'peak allocated {peak / 2**30 if peak else 0:.2f} GiB, status {c.get("status")} {c.get("error") or ""}')
PY
      done
    done
  done
}
