// The oneDNN part of the device module, in a build with DLPROBE_WITH_ONEDNN.
#include "backends.h"
#include "dlprobe/engine/cpu_backend.h"

namespace dlprobe::device::detail {

Result<std::unique_ptr<Backend>> open_onednn_backend(memory::CachingAllocator& allocator) {
  return make_cpu_backend(allocator);
}

}  // namespace dlprobe::device::detail
