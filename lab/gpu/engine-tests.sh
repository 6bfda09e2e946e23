#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): the engine's GPU tests alone (every
# CUDA op against the fp64 reference, the CUDA graph checks, the step on the GPU), a quicker
# check than every binary of scripts/gpu-tests.sh before a speed run, as a lab/gpu script so that
# scripts/gpu-stage.sh runs it in the same call. Log in $OUT (or ./gpu-check-out)/gpu-tests.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
BINARIES="engine_cuda_test step_cuda_test" exec scripts/gpu-tests.sh
