# Sourced from the repository root by the lab/gpu scripts that run over the bundle
# (scripts/gpu-bundle.sh): where their output goes ($OUT, else ./gpu-check-out), the bundle's
# binaries, and the GPU machine's library path (scripts/gpu-env.sh; the workloads the scripts
# start inherit it, so their Python packages load the same cuDNN).
out=${OUT:-gpu-check-out}
mkdir -p "$out"
bin=$PWD/.devbuild/bin
. scripts/gpu-env.sh
