#include "scratch_pool.h"

#include <utility>

namespace dlprobe::cuda {

Result<memory::DeviceBuffer> ScratchPool::take(memory::CachingAllocator& allocator,
                                               std::size_t bytes, std::string_view op) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->size() >= bytes && (best == free_.end() || it->size() < best->size())) best = it;
  }
  if (best == free_.end()) return allocator.allocate_buffer(bytes, memory::Category::workspace, op);
  memory::DeviceBuffer b = std::move(*best);
  free_.erase(best);
  return Result<memory::DeviceBuffer>(std::move(b));
}

void ScratchPool::give(memory::DeviceBuffer b) {
  free_.push_back(std::move(b));
}

Result<void*> ScratchPool::keep(memory::CachingAllocator& allocator, std::size_t bytes,
                                std::string_view op) {
  DLPROBE_ASSIGN_OR_RETURN(memory::DeviceBuffer b,
                           allocator.allocate_buffer(bytes, memory::Category::workspace, op));
  kept_.push_back(std::move(b));
  return kept_.back().data();
}

}  // namespace dlprobe::cuda
