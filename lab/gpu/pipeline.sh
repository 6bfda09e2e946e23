#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the JPEG input pipeline beside its
# peers on the same images (docs/pipeline.md). A dataset of IMAGES JPEGs from `dlprobe pipeline
# make-dataset`; dlprobe's host pipeline over 1, 2, 4 ... all cores; PyTorch's DataLoader with
# torchvision's ImageNet transforms and one worker per core (lab/peers/dataloader.py); and
# torchvision's GPU decode (lab/peers/gpu_decode.py). Logs and JSON go to $OUT (or ./gpu-check-out).
#   IMAGES=4000 MIN_TIME=5 lab/gpu/pipeline.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
py=${PYTHON:-python3}
data=${PIPELINE_DATA:-/tmp/dlprobe-jpegs}
min=${MIN_TIME:-5}
cores=$(nproc)
rm -rf "$data"
echo "== make-dataset: ${IMAGES:-4000} images"
"$bin/dlprobe" pipeline make-dataset "$data" --images "${IMAGES:-4000}" --classes 10 2>&1 | tail -n 2
echo "== dlprobe pipeline, host threads"
timeout 150 "$bin/dlprobe" pipeline "$data" --batch 64 --min-time "${min}s" --step-rate 7000 \
  --json "$out/pipeline-host.json" 2>"$out/pipeline-host.err" | tee "$out/pipeline-host.txt"
echo "== DataLoader, $cores workers"
timeout 120 $py lab/peers/dataloader.py "$data" --workers "$cores" --batch 64 --min-time "$min" \
  2>&1 | tee "$out/dataloader.txt"
echo "== torchvision GPU decode"
timeout 120 $py lab/peers/gpu_decode.py "$data" --batch 256 --min-time "$min" \
  2>&1 | tee "$out/gpu-decode.txt"
