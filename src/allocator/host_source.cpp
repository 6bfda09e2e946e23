#include <fmt/format.h>

#include <cstdlib>

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/units.h"

namespace dlprobe::memory {

HostMemorySource::HostMemorySource(std::optional<std::uint64_t> budget_bytes)
    : budget_bytes_(budget_bytes) {}

Result<void*> HostMemorySource::allocate(std::size_t bytes) {
  // aligned_alloc wants a size that is a multiple of the alignment; one that wrapped is past any.
  const std::size_t size = round_up(bytes, kAlignment);
  if (size < bytes) {
    return error(Errc::out_of_memory, fmt::format("host: {} bytes is past any memory", bytes));
  }
  if (budget_bytes_ && size > *budget_bytes_ - live_bytes_) {
    return error(
        Errc::out_of_memory,
        fmt::format("host: {} more would pass the {} of memory available to this run "
                    "({} held)",
                    format_size(size), format_size(*budget_bytes_), format_size(live_bytes_)));
  }
  void* ptr = std::aligned_alloc(kAlignment, size == 0 ? kAlignment : size);
  if (ptr == nullptr) {
    return error(Errc::out_of_memory,
                 fmt::format("host: aligned_alloc of {} failed", format_size(size)));
  }
  live_bytes_ += size;
  return ptr;
}

Status HostMemorySource::free(void* ptr, std::size_t bytes) {
  std::free(ptr);
  live_bytes_ -= round_up(bytes, kAlignment);
  return Status::ok();
}

}  // namespace dlprobe::memory
