// The reference backend: every engine op written as plainly as possible, on host tensors, for the
// tests to check the fast backends against. Readability over speed: loops follow the formula.
//
// Each op is a pure function: inputs are never modified, outputs are new tensors (running
// statistics and optimizer state come back updated instead of being changed in place). The
// template argument is the compute type, double or float; every floating-point tensor passed in
// must have that dtype (convert first with HostTensor::to_dtype), labels are int32 or int64.
// Sums accumulate in the compute type. Either layout is accepted for any rank-4 operand, mixed
// freely; an output takes the layout of the activation it is computed from.
//
// Backward functions take the descriptor of the tensor whose gradient they return (dtype, shape,
// layout), since the gradient of a strided op does not determine the input's size.
#pragma once

#include <optional>

#include "dlprobe/engine/ops.h"
#include "dlprobe/engine/tensor.h"

namespace dlprobe::reference {

template <class T>
Result<HostTensor> conv2d_forward(const HostTensor& x, const HostTensor& w, const Conv2dParams& p);
template <class T>
Result<HostTensor> conv2d_backward_data(const HostTensor& dy, const HostTensor& w,
                                        const TensorDesc& x_desc, const Conv2dParams& p);
template <class T>
Result<HostTensor> conv2d_backward_weight(const HostTensor& x, const HostTensor& dy,
                                          const TensorDesc& w_desc, const Conv2dParams& p);

struct BatchNormTrainOutput {
  HostTensor y;
  HostTensor save_mean;    // batch mean per channel
  HostTensor save_invstd;  // 1 / sqrt(biased batch variance + eps), as PyTorch saves it
  HostTensor running_mean;
  HostTensor running_var;  // updated with the unbiased batch variance
};
template <class T>
Result<BatchNormTrainOutput> batch_norm_train_forward(const HostTensor& x, const HostTensor& gamma,
                                                      const HostTensor& beta,
                                                      const HostTensor& running_mean,
                                                      const HostTensor& running_var,
                                                      const BatchNormParams& p);
template <class T>
Result<HostTensor> batch_norm_inference_forward(const HostTensor& x, const HostTensor& gamma,
                                                const HostTensor& beta,
                                                const HostTensor& running_mean,
                                                const HostTensor& running_var,
                                                const BatchNormParams& p);
struct BatchNormGrads {
  HostTensor dx;
  HostTensor dgamma;
  HostTensor dbeta;
};
// Backward of the training forward (batch statistics), from what it saved.
template <class T>
Result<BatchNormGrads> batch_norm_backward(const HostTensor& dy, const HostTensor& x,
                                           const HostTensor& gamma, const HostTensor& save_mean,
                                           const HostTensor& save_invstd);

template <class T>
Result<HostTensor> relu_forward(const HostTensor& x);
// From the forward's output, as PyTorch does: the gradient passes where y > 0.
template <class T>
Result<HostTensor> relu_backward(const HostTensor& dy, const HostTensor& y);

template <class T>
Result<HostTensor> max_pool2d_forward(const HostTensor& x, const MaxPool2dParams& p);
// Finds each window's maximum again in x (the first one on ties, as PyTorch's CPU kernel does)
// and routes the gradient there.
template <class T>
Result<HostTensor> max_pool2d_backward(const HostTensor& dy, const HostTensor& x,
                                       const MaxPool2dParams& p);
// Where max_pool2d_backward finds each window's maximum, as its place in the window: r * kw + s for
// input row h0 + r and column w0 + s (h0, w0 the window's first, padding included), a T shaped
// as the forward's output.
template <class T>
Result<HostTensor> max_pool2d_positions(const HostTensor& x, const MaxPool2dParams& p);
// max_pool2d_backward with those places given, for an input described by `x`.
template <class T>
Result<HostTensor> max_pool2d_backward_at(const HostTensor& dy, const HostTensor& positions,
                                          const TensorDesc& x, const MaxPool2dParams& p);

// The residual connection's sum; its backward is the identity on both operands.
template <class T>
Result<HostTensor> add(const HostTensor& a, const HostTensor& b);

template <class T>
Result<HostTensor> global_avg_pool_forward(const HostTensor& x);
template <class T>
Result<HostTensor> global_avg_pool_backward(const HostTensor& dy, const TensorDesc& x_desc);

template <class T>
Result<HostTensor> linear_forward(const HostTensor& x, const HostTensor& w, const HostTensor& b);
struct LinearGrads {
  HostTensor dx;
  HostTensor dw;
  HostTensor db;
};
template <class T>
Result<LinearGrads> linear_backward(const HostTensor& dy, const HostTensor& x, const HostTensor& w);

// Mean of -log softmax(logits)[label] over the batch, with log-sum-exp shifted by the row maximum.
template <class T>
Result<HostTensor> cross_entropy_forward(const HostTensor& logits, const HostTensor& labels);
// d loss / d logits = (softmax - one_hot) * dloss / N. `dloss` [1] is the incoming gradient: 1, or
// the loss scale when training in fp16.
template <class T>
Result<HostTensor> cross_entropy_backward(const HostTensor& logits, const HostTensor& labels,
                                          const HostTensor& dloss);

struct SgdState {
  std::optional<HostTensor> momentum_buffer;  // none before the first step with momentum
};
struct SgdStep {
  HostTensor param;
  SgdState state;
};
template <class T>
Result<SgdStep> sgd_step(const HostTensor& param, const HostTensor& grad, const SgdState& state,
                         const SgdParams& p);

struct AdamWState {
  std::int64_t step = 0;
  std::optional<HostTensor> exp_avg;  // none before the first step; then as PyTorch's state
  std::optional<HostTensor> exp_avg_sq;
};
struct AdamWStep {
  HostTensor param;
  AdamWState state;
};
template <class T>
Result<AdamWStep> adamw_step(const HostTensor& param, const HostTensor& grad,
                             const AdamWState& state, const AdamWParams& p);

}  // namespace dlprobe::reference
