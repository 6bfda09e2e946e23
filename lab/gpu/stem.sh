#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): ResNet-50's stem convolution under
# every cuDNN engine that takes it (bench_stem_conv_gpu), in PyTorch (lab/gpu/stem_torch.py: its
# kernels, and from cuDNN's API log the engine and knobs of each plan it built, in the order it
# tried them), beside dlprobe's autotuning of the same shapes (`bench --verbose`: every candidate's
# time) and the step's per-call profile. Output in $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
py=${PYTHON:-python3}
# Every cuDNN engine that takes the stem, by index (microbench/stem_conv_gpu_bench.cpp), unless
# ENGINES=0: the three fastest of each variant.
if [ "${ENGINES:-1}" != 0 ]; then
  timeout 240 "$bin/bench_stem_conv_gpu" >"$out/engines.txt" 2>&1
  echo "bench_stem_conv_gpu exit $?"
  grep -E "^stem_" "$out/engines.txt" | grep -v ERROR |
    awk '{split($1, a, "/"); line = a[1] " " a[2] " " a[3] " " $2; for (i = 7; i <= NF; i++) line = line " " $i; print line}' |
    sort -k1,1 -k2,2 -k4,4n | awk '{k = $1 " " $2; if (n[k]++ < 3) print}'
fi
# PyTorch's stem, unless TORCH=0.
for mode in ${TORCH_MODES-"" --benchmark}; do
  [ "${TORCH:-1}" = 0 ] && break
  tag=torch${mode:+-benchmark}
  CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$out/$tag-cudnn.log" timeout 120 \
    "$py" lab/gpu/stem_torch.py --batch "${BATCH:-256}" $mode >"$out/$tag.txt" 2>&1
  echo "exit $?" >>"$out/$tag.txt"
  cat "$out/$tag.txt"
  # The engine configurations cuDNN logged, in order, each after its graph's direction.
  grep -o -E '"finalizeMode":"[A-Z_]*"|"engineId":[0-9]+,"smVersion":[0-9]+,"knobChoices":\{[^}]*\}' \
    "$out/$tag-cudnn.log" | head -n 400 >"$out/$tag-engines.txt"
  gzip -f "$out/$tag-cudnn.log"
done
# A fresh tuning cache, so that every shape is tuned and its candidates logged.
rm -f "$out/tuning.json"
timeout 200 "$bin/dlprobe" --verbose bench --model resnet50 --batch "${BATCH:-256}" \
  --precision fp16 --mode grads --steps 30 --no-ceiling --tuning-cache "$out/tuning.json" \
  --overwrite --json "$out/bench.json" >"$out/bench.txt" 2>"$out/bench.err"
echo "bench exit $?"
grep -E "img/s" "$out/bench.txt" | head -n 5
# Each shape's candidates come before the line naming its choice and key: the stem's keys hold
# its four-channel image, [N,4,224,224].
awk '/conv (autotune|candidates)/ { buf = buf $0 "\n"; next }
     /: eng[0-9]+ .* for / { if ($0 ~ / for conv.*,[34],224,224\]/) printf "%s%s\n\n", buf, $0; buf = "" }' \
  "$out/bench.err" >"$out/stem-autotune.txt"
cat "$out/stem-autotune.txt"
echo "$(grep -c "conv autotune" "$out/bench.err") candidates timed in all"
# The fused graphs' choices (the heuristics' first that builds), each after its candidate list.
awk '/conv candidates/ { last = $0; next }
     /_fused: / { print last; print $0; print "" }' "$out/bench.err" >"$out/fused-choices.txt"
echo "$(grep -c "_fused: " "$out/fused-choices.txt") fused graphs planned"
gzip -f "$out/bench.err"
timeout 200 "$bin/dlprobe" bench --model resnet50 --batch "${BATCH:-256}" --precision fp16 \
  --mode grads --steps 30 --no-ceiling --tuning-cache "$out/tuning.json" --profile 3 \
  --overwrite --json "$out/profile.json" >"$out/profile.txt" 2>&1
echo "profile exit $?"
head -n 60 "$out/profile.txt"
