#include <fmt/format.h>

#include <cstdlib>

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/units.h"

namespace dlprobe::memory {

Result<void*> HostMemorySource::allocate(std::size_t bytes) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  const std::size_t size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* ptr = std::aligned_alloc(kAlignment, size == 0 ? kAlignment : size);
  if (ptr == nullptr) {
    return error(Errc::out_of_memory,
                 fmt::format("host: aligned_alloc of {} failed", format_size(size)));
  }
  return ptr;
}

Status HostMemorySource::free(void* ptr, std::size_t /*bytes*/) {
  std::free(ptr);
  return Status::ok();
}

}  // namespace dlprobe::memory
