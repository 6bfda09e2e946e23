// The reference backend behind the Backend interface: every slot runs the plain loops of
// src/engine/backends/reference on host memory, so the whole training step runs (slowly) without a
// GPU, in CI and in `dlprobe bench --device cpu`. Tensors live in host memory (use
// memory::HostMemorySource under the allocator); upload and download are copies.
//
// Each call widens its floating inputs to the compute type, runs the reference op, and rounds the
// results back to the dtypes of the output tensors; fp16/bf16 tensors are thereby computed with
// fp32 (or fp64) accumulation, as autocast's kernels do. MathMode is accepted and ignored: there
// are no TF32 units to emulate.
#pragma once

#include <memory>

#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/dtype.h"

namespace dlprobe {

// `compute` is DType::fp32 or DType::fp64; anything else is an error. With two `streams`, work
// sent to stream 1 runs at the join that covers it (see Backend::streams), the latest a device may
// run it: the tests' check that a schedule over two streams waits where it must. With
// `keeps_normalised` it answers yes to every Backend::keeps_normalised_conv_input, as the CUDA
// backend does for small tensors: the tests' way to the plan that keeps the normalised inputs.
Result<std::unique_ptr<Backend>> make_reference_backend(DType compute = DType::fp32,
                                                        int streams = 1,
                                                        bool keeps_normalised = false);

}  // namespace dlprobe
