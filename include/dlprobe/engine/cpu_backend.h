// The CPU backend of the training engine: convolutions, batch norm, average pooling, the residual
// add, linear layers and casts through oneDNN primitives; ReLU, max pooling, cross-entropy, fills,
// gradient unscaling and the optimizers as dlprobe's own loops (docs/cpu-backend.md says which and
// why). Built only with DLPROBE_WITH_ONEDNN.
//
// Tensors live in host memory, so upload() and download() are copies and every op has finished
// when its slot returns; synchronize() only waits on the oneDNN stream. Scratch memory (oneDNN
// scratchpads, weights reordered to the layout a convolution wants) comes from the allocator passed
// in, category `workspace`, owner = the op's name, and is given back before the slot returns.
//
// Dtypes: fp32 always, computed strictly (no implicit down-conversion; MathMode::tf32 has no CPU
// counterpart and changes nothing). bf16 where oneDNN can run it (AVX-512 and newer); otherwise an
// Errc::unsupported error naming the CPU's ISA. fp16 is refused with Errc::unsupported.
#pragma once

#include <memory>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"

namespace dlprobe {

// The allocator must be over host memory (memory::HostMemorySource) and outlive the backend.
Result<std::unique_ptr<Backend>> make_cpu_backend(memory::CachingAllocator& allocator);

}  // namespace dlprobe
