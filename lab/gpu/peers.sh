#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh, then as scripts/gpu-check.sh runs):
# dlprobe's native training step against PyTorch's with lab/peers/compare_pytorch.py (docs/peers.md):
# per-tensor agreement in the same precision, and a 200-step training run's loss curve, each
# beside its controls (zeroed and negated gradients must fail, PyTorch reordered must pass).
# First on the CPU for a small ResNet-18 (the reference backend, its fp64 step included; no
# training run), then on the GPU: ResNet-50 at batch 32, 224x224, in fp32, tf32, fp16 and bf16,
# and the training run (ResNet-18 at 32x32) in the same precisions, in one process. About 8
# minutes in all. JSON and logs go to $OUT (or ./gpu-check-out); the safetensors files stay in
# $PEERS_WORK. The table is printed last.
#   MODEL=resnet50 BATCH=32 IMAGE=224 TRAIN_PRECISIONS=fp32,tf32,fp16,bf16 lab/gpu/peers.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
work=${PEERS_WORK:-/tmp/dlprobe-peers}
mkdir -p "$work"
py=${PYTHON:-python3}
compare="$py lab/peers/compare_pytorch.py --dlprobe $bin/dlprobe"
summary=()

echo "== CPU: resnet18 batch 8 at 32x32, reference backend (fp32, bf16, and its fp64 step)"
timeout 120 $compare --device cpu --model resnet18 --batch 8 --image-size 32 --classes 10 \
  --train-steps 0 --json "$out/peers-cpu.json" --workdir "$work/cpu" >"$out/peers-cpu.log" 2>&1
rc=$?
summary+=("cpu: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')")
tail -n 8 "$out/peers-cpu.log"

echo "== GPU: ${MODEL:-resnet50} batch ${BATCH:-32} at ${IMAGE:-224}, fp32 tf32 fp16 bf16;" \
  "training runs in ${TRAIN_PRECISIONS:-fp32,tf32,fp16,bf16}"
timeout 360 $compare --device cuda --model "${MODEL:-resnet50}" --batch "${BATCH:-32}" \
  --image-size "${IMAGE:-224}" --precisions fp32,tf32,fp16,bf16 \
  --train-precisions "${TRAIN_PRECISIONS:-fp32,tf32,fp16,bf16}" --json "$out/peers-gpu.json" \
  --workdir "$work/gpu" >"$out/peers-gpu.log" 2>&1
rc=$?
summary+=("gpu: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')")
cat "$out/peers-gpu.log"

echo
printf '%s\n' "${summary[@]}"
jsons=()
for f in "$out/peers-cpu.json" "$out/peers-gpu.json"; do [ -s "$f" ] && jsons+=("$f"); done
[ ${#jsons[@]} -gt 0 ] && $py lab/peers/compare_pytorch.py --summarize "${jsons[@]}" 2>&1 |
  tee "$out/peers-summary.txt"
