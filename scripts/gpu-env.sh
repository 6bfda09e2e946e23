# Sourced by the scripts that run on a GPU machine over .devbuild/: the bundle's libraries, and
# cuDNN 9.19 from PyTorch's environment (dlprobe is built against 9.19; the system has 9.14).
# nvidia.cudnn is a namespace package (its __file__ is None), so its folder comes from __path__.
cudnn_dir=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null)
if [ -n "$cudnn_dir" ] && [ -d "$cudnn_dir/lib" ]; then
  echo "gpu-env: cuDNN from $cudnn_dir/lib" >&2
else
  echo "gpu-env: PyTorch's cuDNN not found; the system cuDNN is used" >&2
  cudnn_dir=""
fi
export LD_LIBRARY_PATH=$PWD/.devbuild/lib${cudnn_dir:+:$cudnn_dir/lib}:${LD_LIBRARY_PATH:-}
