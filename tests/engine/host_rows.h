// The backends of the host test binary: the reference backend in fp32 and, when built, oneDNN.
#pragma once

#include "backend_ops.h"

namespace dlprobe::testing {

// An allocator over host memory, for the host backends' tensors and scratch.
Result<std::unique_ptr<memory::CachingAllocator>> host_allocator();

BackendRow reference_row();
// Built with DLPROBE_WITH_ONEDNN only (cpu/onednn_row.cpp).
BackendRow onednn_row();

}  // namespace dlprobe::testing
