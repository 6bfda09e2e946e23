#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the native engine's figures for
# docs/performance.md in one bounded run, most important first, each log written as it goes
# under $OUT (or ./gpu-check-out): ResNet-50 bs 256 grads mode per precision (fp16 eager with a
# per-call profile, then every precision with the planned arena replayed as a CUDA graph), each
# beside PyTorch eager in the same precision through `dlprobe run` in the same call, the GPU
# tests (the graph replay case also under compute-sanitizer), and the PyTorch agreement check
# (lab/peers/compare_pytorch.py). The native runs share
# one tuning cache: the first run of a shape times its candidates, later ones run its choice.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. lab/gpu/common.sh
batch=${BATCH:-256}
rm -f "$out/tuning.json"
# `verbose=-v native ...` logs every autotuning candidate's time and the engine kept per shape;
# `limit=S native ...` bounds a run to S seconds instead of 90.
native() {
  local tag=$1
  shift
  # shellcheck disable=SC2086 # $verbose is empty or one flag
  timeout "${limit:-90}" "$bin/dlprobe" ${verbose:-} bench --overwrite --model resnet50 --batch "$batch" --mode grads --steps 30 \
    --warmup 5 --tuning-cache "$out/tuning.json" --json "$out/native-$tag.json" "$@" \
    >"$out/native-$tag.log" 2>&1
  echo "native $tag: exit $?"
  grep -E "^(resnet50|\[|throughput|protocol|peak|loss)" "$out/native-$tag.log" | head -n 7
}
# The backend's GPU tests first: a minute, and they say whether the runs below can be trusted.
gpu_test() {
  timeout 300 "$bin/$1" >"$out/$1.log" 2>&1
  echo "$1: exit $?"
  grep -E "^\[  FAILED|median|Failure|replay|eager" "$out/$1.log" | head -n 16
}
gpu_test engine_cuda_test
verbose=-v native fp16-graph --precision fp16 --layout nhwc --gpu-memory planned --graph
native fp16-eager --precision fp16 --layout nhwc --profile 2
# PyTorch eager through `dlprobe run`, by the peer protocol (cudnn.benchmark, gradients only,
# steps timed back to back on CUDA events), in the same call as the native runs.
peer() {
  local tag=$1
  shift
  echo "== pytorch eager $tag bs$batch (through dlprobe run)"
  timeout 120 "$bin/dlprobe" run --overwrite --json "$out/pytorch-$tag.json" -- python3 \
    examples/workloads/pytorch_resnet50.py --batch "$batch" --mode grads --steps 30 --warmup 5 \
    "$@" >"$out/pytorch-$tag.log" 2>&1
  echo "pytorch $tag: exit $?"
  grep -iE "img/s" "$out/pytorch-$tag.log" | tail -n 3
}
peer fp16 --amp fp16 --channels-last
native bf16-graph --precision bf16 --layout nhwc --gpu-memory planned --graph
peer bf16 --amp bf16 --channels-last
native tf32-graph --precision tf32 --layout nhwc --gpu-memory planned --graph
peer tf32 --tf32
limit=150 verbose=-v native fp32-graph --precision fp32 --layout nchw --gpu-memory planned --graph
peer fp32
gpu_test step_cuda_test
timeout 150 python3 lab/peers/compare_pytorch.py --dlprobe "$bin/dlprobe" --device cuda \
  --model resnet50 --batch 32 --precisions fp32,tf32,fp16,bf16 --train-steps 0 \
  --json "$out/peers.json" \
  --workdir /tmp/dlprobe-peers >"$out/peers.log" 2>&1
echo "peers: exit $?"
tail -n 40 "$out/peers.log"
# The graph replay case under compute-sanitizer: on 2026-12-02 its replayed conv1.weight gradient
# (fp32 NHWC) was not finite (an out-of-bounds write or a read of memory nothing
# wrote would do that: memcheck and initcheck).
for tool in initcheck memcheck; do
  timeout 150 compute-sanitizer --tool "$tool" --print-limit 20 "$bin/step_cuda_test" \
    --gtest_filter=StepCudaTest.GraphReplayMatchesEagerSteps >"$out/graph-$tool.log" 2>&1
  echo "graph replay under $tool: exit $?"
  grep -E "ERROR SUMMARY|Invalid|Uninitialized|FAILED|OK \]" "$out/graph-$tool.log" | head -n 12
done
