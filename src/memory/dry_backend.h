// A backend that computes nothing: every slot returns at once and upload/download move no bytes.
// Memory analysis plans and "runs" a step on it over an allocator with fake addresses, so the
// step's alloc/free entries meet the caching allocator's real policy while no tensor is touched:
// the allocator's figures for any batch and precision, on a machine without the device. It never
// reads or writes through a pointer, so fake addresses are safe with it.
#pragma once

#include <memory>

#include "dlprobe/engine/backend.h"

namespace dlprobe::memory {

// `fuses`: plan batch norm with its ReLU (and the two-term ReLU backward) fused, as the CUDA and
// reference backends do, or apart, as oneDNN's does; `fuses_conv`: plan batch norm inside the
// convolutions (Backend::fuses_conv_batch_norm) for the step's precision and layout. The call list
// follows both; `recomputes_pool`: the max pool's backward recomputes its input
// (Backend::recomputes_max_pool_input), which the step then never stores;
// `fuses_pool_backward`: that pool's backward runs with the batch norm's in one call
// (Backend::fuses_max_pool_batch_norm_backward), its forward keeping its maxima's places.
std::unique_ptr<Backend> make_dry_backend(bool fuses, bool fuses_conv, bool recomputes_pool,
                                          bool fuses_pool_backward);

}  // namespace dlprobe::memory
