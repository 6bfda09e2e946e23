#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh, then as scripts/gpu-check.sh runs):
# dlprobe's native training step against PyTorch's on the same weights and batch, tensor by tensor
# with lab/peers/compare_pytorch.py, first on the CPU for a small ResNet-18 (the reference
# backend, its fp64 step included), then on the GPU for ResNet-50 at batch 32, 224x224, one run per
# precision, each bounded in time. JSON and logs go to $OUT (or ./gpu-check-out); the safetensors
# files (about 0.5 GB) stay in $PEERS_WORK. The table is printed last.
#   MODEL=resnet50 BATCH=32 IMAGE=224 lab/gpu/peers.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
work=${PEERS_WORK:-/tmp/dlprobe-peers}
mkdir -p "$work"
py=${PYTHON:-python3}
compare="$py lab/peers/compare_pytorch.py --dlprobe $bin/dlprobe"
summary=()

echo "== CPU: resnet18 batch 8 at 64x64, reference backend (fp32, bf16, and its fp64 step)"
timeout 600 $compare --device cpu --model resnet18 --batch 8 --image-size 64 --classes 10 \
  --json "$out/peers-cpu.json" --workdir "$work/cpu" >"$out/peers-cpu.log" 2>&1
summary+=("cpu: exit $?")

jsons=()
for p in fp32 tf32 fp16 bf16; do
  echo "== GPU: ${MODEL:-resnet50} batch ${BATCH:-32} at ${IMAGE:-224}, $p"
  timeout 600 $compare --device cuda --model "${MODEL:-resnet50}" --batch "${BATCH:-32}" \
    --image-size "${IMAGE:-224}" --precisions "$p" --json "$out/peers-$p.json" \
    --workdir "$work/gpu" >"$out/peers-$p.log" 2>&1
  rc=$?
  summary+=("gpu $p: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')")
  [ -s "$out/peers-$p.json" ] && jsons+=("$out/peers-$p.json")
  tail -n 25 "$out/peers-$p.log"
done

echo
printf '%s\n' "${summary[@]}"
$py lab/peers/compare_pytorch.py --summarize "$out/peers-cpu.json" 2>&1 | tee "$out/peers-cpu-summary.txt"
[ ${#jsons[@]} -gt 0 ] && $py lab/peers/compare_pytorch.py --summarize "${jsons[@]}" 2>&1 |
  tee "$out/peers-summary.txt"
