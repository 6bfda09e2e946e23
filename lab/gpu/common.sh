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
