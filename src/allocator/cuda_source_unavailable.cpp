// make_cuda_memory_source in a build without CUDA: the caller learns why there is no GPU memory.
#include "dlprobe/allocator/memory_source.h"

namespace dlprobe::memory {

Result<std::unique_ptr<MemorySource>> make_cuda_memory_source(int /*device*/) {
  return error(Errc::unavailable, "this dlprobe was built without CUDA (DLPROBE_WITH_CUDA=OFF)");
}

}  // namespace dlprobe::memory
