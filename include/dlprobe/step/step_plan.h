// What a planned step is made of: the flat list of backend calls a step runs, and the activations
// and temporaries that live across parts of it (TrainingStep::calls(), transients(), arena()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"

namespace dlprobe::engine {

// One entry of the planned call list.
enum class CallKind : std::uint8_t {
  alloc,  // an activation or temporary buffer comes to life
  free,   // ... and goes
  fill,
  cast,
  conv_forward,
  conv_backward_data,
  conv_backward_weight,
  conv_forward_fused,           // a convolution with a batch norm's apply and/or sums around it
  conv_backward_weight_fused,   // its weight gradient, the applied input recomputed
  conv_backward_data_add_relu,  // a data gradient summed with a second term under a ReLU's mask
  batch_norm_train_forward,
  batch_norm_inference_forward,
  batch_norm_backward,
  batch_norm_add_backward,  // both batch norms of a block output's apply_add, from one gradient
  batch_norm_relu_train_forward,           // batch norm, [residual add,] ReLU in one call
  batch_norm_relu_inference_forward,       // the same with running statistics
  batch_norm_relu_backward,                // ReLU's mask and batch norm's backward in one call
  batch_norm_relu_max_pool_train_forward,  // batch norm, ReLU and the max pool after them
  batch_norm_relu_max_pool_backward,       // the backward of those three in one call
  batch_norm_apply,      // the elementwise pass of a batch norm whose input a convolution summed
  batch_norm_apply_add,  // two batch norms' passes summed, and the ReLU: a block output
  relu_forward,
  relu_backward,
  relu_backward_add,  // a ReLU's backward from a gradient that arrives as two terms
  max_pool_forward,
  max_pool_backward,
  add,
  global_avg_pool_forward,
  global_avg_pool_backward,
  linear_forward,
  linear_backward,
  cross_entropy_forward,
  cross_entropy_backward,
  unscale_gradients,
  sgd_step,
  adamw_step,
  advance_step,
};
std::string_view call_kind_name(CallKind kind);

struct Call {
  std::string name;  // "layer1.0.conv1.forward", "alloc layer1.0.bn1 activations fp32[...]", ...
  CallKind kind = CallKind::fill;
  std::string layer;  // owner: a model layer, "loss", "optimizer", "grad_scaler"
  std::function<Status()> run;
  // StepConfig::streams: the backend stream the call goes to, and the waits before it: stream 0
  // for stream 1's work up to and including the call of index `join_through` in the list (-1:
  // none); with `fork`, stream 1 for stream 0's work so far.
  int stream = 0;
  std::int64_t join_through = -1;
  bool fork = false;
};

// An activation or temporary of the plan, and which entries of calls() it lives across: under
// MemoryPlan::dynamic its own alloc and free entries, under planned the first and last calls that
// touch it.
struct TransientBuffer {
  std::string owner;  // the layer
  memory::Category category = memory::Category::temporaries;
  std::uint64_t bytes = 0;
  std::size_t first_call = 0;
  std::size_t last_call = 0;
  std::uint64_t arena_offset = 0;  // planned only
  // Made by the backward pass: a gradient it carries (of a value, or under mixed precision a
  // parameter's before its cast to the master dtype), of category temporaries.
  bool gradient = false;
};

// The arena of a planned step: its size, and the most bytes its buffers have live at one call
// (no layout can be smaller; the difference is the cost of the layout).
struct ArenaLayout {
  std::uint64_t bytes = 0;
  std::uint64_t peak_live_bytes = 0;
};

}  // namespace dlprobe::engine
