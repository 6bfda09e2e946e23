// The device module's own view of the backends a build may lack. Each function has two
// definitions, one per build (cuda.cpp or cuda_unavailable.cpp, onednn.cpp or
// onednn_unavailable.cpp), chosen in this folder's CMakeLists.txt by DLPROBE_WITH_CUDA and
// DLPROBE_WITH_ONEDNN: no source tests a macro.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/availability.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/dtype.h"

namespace dlprobe::device::detail {

// Whether `kind` computes in `compute` (fp32 everywhere, fp64 on the reference backend), checked
// before any memory is taken.
Status check_compute(BackendKind kind, DType compute);

Result<std::unique_ptr<Backend>> open_cuda_backend(int index, memory::CachingAllocator& allocator,
                                                   const ConvOptions& conv);
// Major and minor; nullopt without CUDA or that device.
std::optional<std::pair<int, int>> cuda_compute_capability(int index);

// What the CUDA runtime says (GpuFacts' cuda_driver, cuda_runtime, cuda_devices, cuda_error);
// nothing without CUDA.
void add_cuda_facts(GpuFacts& facts);

Result<std::unique_ptr<Backend>> open_onednn_backend(memory::CachingAllocator& allocator);

}  // namespace dlprobe::device::detail
