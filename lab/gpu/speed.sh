#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): dlprobe's native ResNet-50 step beside
# PyTorch eager, torch.compile and JAX/XLA, gradients only, in one run (lab/peers/speed.py). The
# table is speed.md in $OUT (or ./gpu-check-out)/speed.
#   CONFIGS=fp16:256,bf16:256,fp16:32 lab/gpu/speed.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
${PYTHON:-python3} lab/peers/speed.py --dlprobe "$bin/dlprobe" --out "$out/speed" \
  --configs "${CONFIGS:-fp16:256,bf16:256,fp16:32,tf32:256}" --timeout "${RUN_TIMEOUT:-240}"
