// Kernel scratch while a CUDA graph is recorded. Plain C++ over the caching allocator, so the CPU
// tests check it.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"

namespace dlprobe::cuda {

// While the backend records a CUDA graph, kernel scratch comes from and goes back to this pool,
// whose buffers the graph keeps for its replays (they use the recorded addresses). The recorded
// calls run in order on one stream at every replay, as they did eagerly, so a buffer one call is
// done with may serve a later one: the graph keeps the most scratch any call had at once, not
// the sum over the step. (On an H200 the bf16 ResNet-50 graph at batch 256 held 494 MiB beside
// its arena, the shared cuDNN workspace and the kept scratch together; their split was not
// measured.)
class ScratchPool {
 public:
  // The smallest pooled buffer of at least `bytes`, else a new one from the allocator.
  Result<memory::DeviceBuffer> take(memory::CachingAllocator& allocator, std::size_t bytes,
                                    std::string_view op);
  void give(memory::DeviceBuffer b);
  std::size_t idle() const { return free_.size(); }  // buffers given back and not taken again
  // A buffer of `bytes` the graph keeps and never lends again: what its calls read at every
  // replay but the recording wrote once (a multi-tensor kernel's table of tensors).
  Result<void*> keep(memory::CachingAllocator& allocator, std::size_t bytes, std::string_view op);

 private:
  std::vector<memory::DeviceBuffer> free_;
  std::vector<memory::DeviceBuffer> kept_;
};

}  // namespace dlprobe::cuda
