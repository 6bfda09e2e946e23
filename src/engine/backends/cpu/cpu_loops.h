// The CPU backend's own loops, for the ops oneDNN 2.6 has no primitive for (cross-entropy, fills,
// gradient unscaling, the optimizers) or computes differently from PyTorch (ReLU and max
// pooling, and the ReLU of the fused batch norm slots: see cpu_loops.cpp). Each works in place on
// host tensors the caller allocated; dtypes and shapes are checked by the backend before it calls
// them, except what only the data can tell (labels).
#pragma once

#include <span>

#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/ops.h"
#include "dlprobe/engine/tensor.h"

namespace dlprobe::cpu {

// fp32, bf16, fp16 or fp64 elements, every one set to `value` rounded to the dtype.
Status fill(const TensorView& t, double value);

// fp32 or bf16; x and y (dy, y and dx) share one descriptor.
void relu_forward(const TensorView& x, const TensorView& y);
void relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx);

// fp32 or bf16, one descriptor for all operands. y = relu(y + residual) in place, or relu(y)
// where `residual` has no data; dx = y <= 0 ? 0 : a + b, dx may alias any input.
void add_relu_in_place(const TensorView& y, const TensorView& residual);
void relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                       const TensorView& dx);

// fp32 or bf16, either layout (x and y may differ).
void max_pool2d_forward(const TensorView& x, const TensorView& y, const MaxPool2dParams& p);
// dx = 0, then each dy element added at its window's first maximum in x. `accum` (fp32, dx's
// element count) is where a bf16 dx is summed before one rounding; unused for fp32.
void max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& dx,
                         const MaxPool2dParams& p, std::span<float> accum);

// fp32 logits [N, K], int32/int64 labels [N]; a label outside [0, K) is an invalid_argument error
// and nothing is written.
Status cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                             const TensorView& loss);
Status cross_entropy_backward(const TensorView& logits, const TensorView& labels, double loss_scale,
                              const TensorView& dlogits);

// fp32 gradients and flag.
void unscale_gradients(std::span<const TensorView> grads, double inv_scale,
                       const TensorView& found_inf);

// True when found_inf has data and holds a non-zero value: the optimizer step is skipped.
bool step_skipped(const TensorView& found_inf);
// fp32; param, grad and state share one descriptor (checked by the backend). On the first step
// (`step` == 1) the state buffers are written before they are read, as torch.optim creates them,
// so they need no initialisation.
void sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p, std::int64_t step);
void adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p, std::int64_t step);

}  // namespace dlprobe::cpu
