#include <fmt/format.h>

#include <cstdint>
#include <iterator>

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/units.h"

namespace dlprobe::memory {

FakeMemorySource::FakeMemorySource(FakeMemoryConfig options) : options_(options) {
  if (options_.capacity_bytes > 0) holes_.emplace(options_.base_address, options_.capacity_bytes);
}

Result<void*> FakeMemorySource::allocate(std::size_t bytes) {
  ++allocate_calls_;
  const std::uint64_t size = round_up(bytes == 0 ? 1 : bytes, kAlignment);
  // First fit by address, as a device allocator that does not move memory has to: a large request
  // can fail while the free bytes add up to more, which is the fragmentation tests want to see.
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second < size) continue;
    const std::uint64_t address = it->first;
    const std::uint64_t rest = it->second - size;
    holes_.erase(it);
    if (rest > 0) holes_.emplace(address + size, rest);
    live_.emplace(address, size);
    live_bytes_ += size;
    // Fake addresses are only ever compared and offset, never dereferenced.
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
  }
  ++failed_allocations_;
  return error(Errc::out_of_memory,
               fmt::format("fake source: no hole of {} ({} of {} in use)", format_size(size),
                           format_size(live_bytes_), format_size(options_.capacity_bytes)));
}

Status FakeMemorySource::free(void* ptr, std::size_t bytes) {
  const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr));
  auto live = live_.find(address);
  if (live == live_.end() || live->second != round_up(bytes == 0 ? 1 : bytes, kAlignment)) {
    return error(Errc::invalid_argument,
                 fmt::format("fake source: free of {:#x} ({} B) that is not a live segment",
                             address, bytes));
  }
  ++free_calls_;
  std::uint64_t start = address;
  std::uint64_t size = live->second;
  live_bytes_ -= size;
  live_.erase(live);
  // Merge with the holes on either side so that freed neighbours make one large hole again.
  auto next = holes_.lower_bound(start);
  if (next != holes_.end() && next->first == start + size) {
    size += next->second;
    next = holes_.erase(next);
  }
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      holes_.erase(prev);
    }
  }
  holes_.emplace(start, size);
  return Status::ok();
}

std::optional<DeviceMemoryInfo> FakeMemorySource::memory_info() const {
  if (!options_.report_memory_info) return std::nullopt;
  return DeviceMemoryInfo{options_.capacity_bytes - live_bytes_, options_.capacity_bytes};
}

}  // namespace dlprobe::memory
