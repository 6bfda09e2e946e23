// The oneDNN part of the device module in a build without DLPROBE_WITH_ONEDNN.
#include "backends.h"

namespace dlprobe::device::detail {

Result<std::unique_ptr<Backend>> open_onednn_backend(memory::CachingAllocator& /*allocator*/) {
  return error(Errc::unavailable,
               "this build has no oneDNN backend (configured without DLPROBE_WITH_ONEDNN)");
}

}  // namespace dlprobe::device::detail
