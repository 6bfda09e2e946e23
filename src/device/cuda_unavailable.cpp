// The CUDA parts of the device module in a build without DLPROBE_WITH_CUDA.
#include <fmt/format.h>

#include "backends.h"
#include "dlprobe/device/device.h"

namespace dlprobe::device {

std::optional<std::string> cuda_pci_bus_id(int /*index*/) {
  return std::nullopt;
}

namespace detail {

Result<std::unique_ptr<Backend>> open_cuda_backend(int index, memory::CachingAllocator& /*alloc*/,
                                                   const ConvOptions& /*conv*/) {
  return error(Errc::unavailable,
               fmt::format("cuda:{}: this build has no CUDA backend (configured without "
                           "DLPROBE_WITH_CUDA)",
                           index));
}

void add_cuda_facts(GpuFacts& /*facts*/) {}

std::optional<std::pair<int, int>> cuda_compute_capability(int /*index*/) {
  return std::nullopt;
}

}  // namespace detail
}  // namespace dlprobe::device
