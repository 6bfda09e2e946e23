// GpuDecoder in a build without DLPROBE_WITH_CUDA.
#include <fmt/format.h>

#include "dlprobe/data/gpu_decoder.h"

namespace dlprobe::data {

Result<std::unique_ptr<GpuDecoder>> GpuDecoder::open(const GpuDecoderOptions& options) {
  return error(Errc::unavailable,
               fmt::format("cuda:{}: this dlprobe was built without CUDA (DLPROBE_WITH_CUDA), so "
                           "it has no GPU decoder",
                           options.device));
}

}  // namespace dlprobe::data
