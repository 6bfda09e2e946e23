// The one place a backend and its memory are opened. A caller that keeps its own allocator (the
// memory analysis resizes and limits it) takes the two openers; everyone else takes an Engine
// (engine.h), which holds both.
#pragma once

#include <memory>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/dtype.h"

namespace dlprobe::device {

// Host memory on the CPU; cudaMalloc on a CUDA device (Errc::unavailable without CUDA or a usable
// GPU).
Result<std::unique_ptr<memory::MemorySource>> open_memory_source(const Device& device);

// A backend of `kind` on `device` over `allocator` (which must be over that device's memory and
// outlive the backend). `conv` matters to the CUDA backend only; `compute` to the reference backend
// only: DType::fp64 for Precision::fp64, else fp32 (the others compute in fp32). A backend that
// does not run on the device, is not built here, or cannot compute in `compute` is an error.
Result<std::unique_ptr<Backend>> open_backend(const Device& device, BackendKind kind,
                                              memory::CachingAllocator& allocator,
                                              const ConvOptions& conv = {},
                                              DType compute = DType::fp32);

}  // namespace dlprobe::device
