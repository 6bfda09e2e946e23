// `--gpu-memory`: how a run takes device memory, as one flag for every command that runs the
// native engine (`dlprobe bench`, `dlprobe memory`).
//
//   grow               segments on demand, kept cached (the default; PyTorch's behaviour)
//   prealloc[:F|SIZE]  reserve up front and carve everything from that (TensorFlow's default):
//                      a fraction F in (0, 1] of the device's memory, or a size; plain `prealloc`
//                      is 0.9 of the device, leaving room for the CUDA context and libraries
//   limit:SIZE         as grow, but the whole process (allocator plus CUDA context, library
//                      handles and workspaces, as measured) stays within SIZE: a smaller card
//   planned            the step's activations and temporaries in one static arena laid out from
//                      their lifetimes (engine::MemoryPlan::planned), the rest as grow
//
// `planned` combines with one allocator mode through '+': "planned+limit:16GiB".
#pragma once

#include <string>
#include <string_view>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"

namespace dlprobe::memory {

// What plain `prealloc` reserves: TensorFlow takes nearly all of the device and JAX 0.75 of it;
// 0.9 leaves the context and the libraries' lazily loaded kernels room on any card.
inline constexpr double kDefaultPreallocateFraction = 0.9;

struct GpuMemoryOption {
  // growth, preallocate (bytes or fraction) or limit (limit_bytes; overhead_bytes is left 0 for
  // the caller to fill in with what it measures outside the allocator).
  AllocatorOptions allocator;
  bool planned = false;
  std::string text;  // as given, for reports

  // The same setting, however written ("prealloc:0.5" and "prealloc:50%").
  bool operator==(const GpuMemoryOption& o) const {
    return allocator == o.allocator && planned == o.planned;
  }
};

// Errors are one line naming `flag` and what it accepts.
Result<GpuMemoryOption> parse_gpu_memory(std::string_view text,
                                         std::string_view flag = "--gpu-memory");

}  // namespace dlprobe::memory
