// DeviceStaging in a build without DLPROBE_WITH_CUDA.
#include <fmt/format.h>

#include "dlprobe/data/device_staging.h"

namespace dlprobe::data {

Result<std::unique_ptr<DeviceStaging>> DeviceStaging::open(int device, std::size_t /*bytes*/) {
  return error(
      Errc::unavailable,
      fmt::format("cuda:{}: this dlprobe was built without CUDA (DLPROBE_WITH_CUDA)", device));
}

}  // namespace dlprobe::data
