// What this binary was built from and with: reported by doctor and in every results file.
#pragma once

#include <string_view>

namespace dlprobe {

struct BuildInfo {
  std::string_view version;     // dlprobe's own version
  // Short hash of the commit the sources were at when built, "-dirty" where tracked files differed
  // from it, or "unknown" outside a git checkout.
  std::string_view git_hash;
  std::string_view compiler;    // e.g. "GNU 12.2.0"
  std::string_view build_type;  // CMake build type
  bool with_cuda;
  bool with_onednn;
  int cuda_runtime_version;  // CUDART_VERSION built against (e.g. 13000), 0 without CUDA
  int cudnn_version;         // CUDNN_VERSION built against (e.g. 91900), 0 without CUDA
  std::string_view cuda_architectures;
};

const BuildInfo& build_info();

}  // namespace dlprobe
