// The engine's backend interface: one slot per operation of a ResNet training step. The step
// planner (src/engine) sizes and allocates every buffer ahead of time, so every slot writes into
// outputs the caller owns and allocates nothing but its own scratch space (through the allocator
// it was created with, category `workspace`). Backends: reference (plain loops, tests only),
// cpu (oneDNN), cuda (cuDNN, cuBLASLt, our kernels); one folder each under src/engine/backends/.
//
// Dtypes, as PyTorch's autocast runs ResNet (the engine follows it so results match):
// - conv2d and linear: x, w, y (and their gradients) share the activation dtype (fp32, fp16,
//   bf16); accumulation is fp32. MathMode says whether fp32 may use TF32 tensor cores.
// - batch norm: x, y, dy, dx in the activation dtype; gamma, beta, running and saved statistics,
//   dgamma, dbeta always fp32.
// - cross-entropy: logits, loss and dlogits fp32 (autocast runs it in fp32); labels int32/int64.
// - optimizers: fp32 parameters, gradients and state (the master weights of mixed precision).
// - cast converts between any two floating dtypes (fp32 master weights to fp16 working copies,
//   fp16 gradients back to fp32).
// Shapes and parameters are checked by the shape functions of dlprobe/ops.h; a slot may assume
// they passed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/ops.h"
#include "dlprobe/engine/tensor.h"

namespace dlprobe {

enum class DeviceKind : std::uint8_t { cpu, cuda };

// Whether fp32 convolutions and matrix products may run on TF32 tensor cores.
enum class MathMode : std::uint8_t { strict_fp32, tf32 };

// One parameter's tensors for a multi-tensor optimizer step. `state0`/`state1` are the momentum
// buffer (SGD) or exp_avg / exp_avg_sq (AdamW); unused ones have a null data pointer.
struct OptimizerSlot {
  TensorView param;
  TensorView grad;
  TensorView state0;
  TensorView state1;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual DeviceKind device() const = 0;
  virtual void set_math_mode(MathMode mode) = 0;

  // Host <-> backend memory, and waiting for queued work (a no-op on synchronous backends).
  virtual Status upload(void* dst, const void* src, std::size_t bytes) = 0;
  virtual Status download(void* dst, const void* src, std::size_t bytes) = 0;
  // Backend memory to backend memory, in queue order (an input pipeline's batch already on the
  // device into the step's input).
  virtual Status copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual Status synchronize() = 0;

  // Timing marks, so that step and call times need no host synchronisation each: mark(i) records
  // a point in the backend's queue under index i (recording i again moves it), elapsed_ms(a, b)
  // waits until both points are passed and returns the time from a to b. The defaults read the
  // host clock, which is right for backends whose calls finish before they return (reference,
  // cpu); the CUDA backend records events on its stream.
  virtual Status mark(std::size_t index);
  virtual Result<double> elapsed_ms(std::size_t from, std::size_t to);
  // Waits until the point marked under `index` is passed, so that a caller can bound how far it
  // queues ahead of the device without waiting for its latest work.
  virtual Status wait_for_mark(std::size_t index);

  // (optional) Graph capture: capture(record) calls `record`, whose backend calls are recorded
  // instead of run, and returns a graph that replay() queues as one launch. The recorded calls
  // must use the same buffers on every replay (a planned step's fixed addresses), copy nothing
  // from pageable host memory and wait for nothing. The defaults refuse: the caller runs eagerly.
  virtual Result<std::size_t> capture(const std::function<Status()>& record);
  virtual Status replay(std::size_t graph);
  // Gives back what a recorded graph holds (its executable, workspace and scratch) after any
  // queued replay of it has finished; it must not be replayed again, and its index is not reused.
  // The step that recorded it calls this when it goes, so that a sweep's later configurations do
  // not carry its memory.
  virtual void release_graph(std::size_t graph);
  // Starts a new count of the most workspace one call takes; capture() sizes a graph's shared
  // workspace from that count. A step calls it before the eager run its capture follows.
  virtual void reset_call_workspace_peak();

  // (optional) Streams: queues whose work may run at the same time, so that a call that takes
  // few of the device's cores leaves the rest to another. streams() is how many the backend has;
  // with one (the default) every call runs in the order it was made. on_stream(s, run) calls
  // `run`, whose backend calls go to stream s, and returns a ticket for them; a backend may run
  // them any time until a join that covers the ticket. fork(): stream 1's later work waits for
  // everything queued on stream 0 so far. join_through(ticket): stream 0's later work waits for
  // stream 1's up to and including the ticket's (one of the latest kStreamTickets); join(): for
  // all of stream 1's so far. The caller keeps every buffer stream 1's work reads or writes
  // untouched until it has joined.
  static constexpr std::size_t kStreamTickets = 64;
  virtual int streams() const { return 1; }
  virtual Result<std::size_t> on_stream(int stream, const std::function<Status()>& run);
  virtual Status fork() { return Status::ok(); }
  virtual Status join_through(std::size_t /*ticket*/) { return Status::ok(); }
  virtual Status join() { return Status::ok(); }

  virtual Status fill(const TensorView& t, double value) = 0;
  virtual Status cast(const TensorView& src, const TensorView& dst) = 0;
  // cast(src[i], dst[i]) for every i (the spans of one length), where a backend may do them all
  // at once: the working copies of every weight, or every weight gradient, in one launch.
  virtual Status cast_many(std::span<const TensorView> src, std::span<const TensorView> dst);

  virtual Status conv2d_forward(const TensorView& x, const TensorView& w, const TensorView& y,
                                const Conv2dParams& p) = 0;
  virtual Status conv2d_backward_data(const TensorView& dy, const TensorView& w,
                                      const TensorView& dx, const Conv2dParams& p) = 0;
  virtual Status conv2d_backward_weight(const TensorView& x, const TensorView& dy,
                                        const TensorView& dw, const Conv2dParams& p) = 0;

  // Training forward: batch statistics, running statistics updated in place (momentum, unbiased
  // variance), mean and 1/sqrt(biased var + eps) saved for backward.
  virtual Status batch_norm_train_forward(const TensorView& x, const TensorView& gamma,
                                          const TensorView& beta, const TensorView& running_mean,
                                          const TensorView& running_var, const TensorView& y,
                                          const TensorView& save_mean,
                                          const TensorView& save_invstd,
                                          const BatchNormParams& p) = 0;
  virtual Status batch_norm_inference_forward(const TensorView& x, const TensorView& gamma,
                                              const TensorView& beta,
                                              const TensorView& running_mean,
                                              const TensorView& running_var, const TensorView& y,
                                              const BatchNormParams& p) = 0;
  virtual Status batch_norm_backward(const TensorView& dy, const TensorView& x,
                                     const TensorView& gamma, const TensorView& save_mean,
                                     const TensorView& save_invstd, const TensorView& dx,
                                     const TensorView& dgamma, const TensorView& dbeta) = 0;

  // (optional) Batch norm with the ReLU after it, and the residual sum before that ReLU, in one
  // call: y = relu(bn(x) + residual), or y = relu(bn(x)) when `residual` has no data, rounded to
  // y's dtype once. The planner emits these only where fuses_batch_norm_relu() is true; the
  // defaults refuse.
  virtual bool fuses_batch_norm_relu() const { return false; }
  virtual Status batch_norm_relu_train_forward(
      const TensorView& x, const TensorView& gamma, const TensorView& beta,
      const TensorView& running_mean, const TensorView& running_var, const TensorView& residual,
      const TensorView& y, const TensorView& save_mean, const TensorView& save_invstd,
      const BatchNormParams& p);
  virtual Status batch_norm_relu_inference_forward(const TensorView& x, const TensorView& gamma,
                                                   const TensorView& beta,
                                                   const TensorView& running_mean,
                                                   const TensorView& running_var,
                                                   const TensorView& residual, const TensorView& y,
                                                   const BatchNormParams& p);
  // (optional) The backward of y = relu(bn(x)) (no residual) from y's gradient dy. The ReLU's
  // decision is y > 0; a backend may instead recompute its pre-activation bn(x) from x, gamma,
  // beta and the saved statistics, as its forward computed it, and so read one tensor less. A y
  // without data (never stored: a convolution's prologue computed it, see below) asks for the
  // recompute.
  virtual Status batch_norm_relu_backward(const TensorView& dy, const TensorView& y,
                                          const TensorView& x, const TensorView& gamma,
                                          const TensorView& beta, const TensorView& save_mean,
                                          const TensorView& save_invstd, const TensorView& dx,
                                          const TensorView& dgamma, const TensorView& dbeta);

  // (optional) Batch norm computed around the convolutions, as cuDNN's runtime fusion does: the
  // convolution that produces a batch norm's input also sums it; a finalize turns the sums into
  // the statistics; and the ReLU(BN) of a tensor that only the next convolution reads is applied
  // inside that convolution as it loads its input (its prologue), so it is never stored. Planned
  // only where fuses_conv_batch_norm(activation dtype, layout) is true; the defaults refuse.
  virtual bool fuses_conv_batch_norm(DType /*activation*/, Layout /*layout*/) const {
    return false;
  }
  // The dtype of a fused convolution's scale and bias (its prologue) over activations of this
  // dtype: the activations' own unless a backend needs more precision there.
  virtual DType conv_prologue_dtype(DType activation) const { return activation; }
  // Whether a plan should leave a batch norm + ReLU whose output x only a fused convolution reads
  // its own pass and keep x, which the convolution and its weight gradient then read as they are,
  // rather than have both apply it in their prologues: where the backend would run the prologue
  // as a pass of its own anyway (the weight gradient's would run that pass again), or x is small
  // enough that holding it costs little.
  virtual bool keeps_normalised_conv_input(const TensorDesc& /*x*/) const { return false; }
  // y = conv(relu(x * scale + bias), w), or conv(x, w) where scale and bias have no data; and
  // where sum and sqsum have data, y's per-channel sum and sum of squares. scale and bias [C] in
  // conv_prologue_dtype(x's dtype); sum and sqsum [K] in the dtype of the batch-norm statistics.
  virtual Status conv2d_forward_fused(const TensorView& x, const TensorView& scale,
                                      const TensorView& bias, const TensorView& w,
                                      const TensorView& y, const TensorView& sum,
                                      const TensorView& sqsum, const Conv2dParams& p);
  // dw = conv2d_backward_weight(relu(x * scale + bias), dy): the input recomputed from x.
  virtual Status conv2d_backward_weight_fused(const TensorView& x, const TensorView& scale,
                                              const TensorView& bias, const TensorView& dy,
                                              const TensorView& dw, const Conv2dParams& p);
  // dx = conv2d_backward_data(dy, w) + add where relu_y > 0, else 0: relu_backward_add with one
  // term the data gradient, which is never stored (a ResNet block output's gradient from the next
  // block's first convolution and the shortcut). add, relu_y and dx of one shape.
  virtual Status conv2d_backward_data_add_relu(const TensorView& dy, const TensorView& w,
                                               const TensorView& add, const TensorView& relu_y,
                                               const TensorView& dx, const Conv2dParams& p);
  // A batch norm's finalize: from the sums over `count` values per channel, save_mean,
  // save_invstd and the running statistics as batch_norm_train_forward gives them; and where
  // scale and bias have data, the prologue's scale = gamma * invstd and bias = beta - mean *
  // scale, in their dtype.
  struct BatchNormFinalize {
    TensorView sum, sqsum;
    std::int64_t count = 0;
    TensorView gamma, beta, running_mean, running_var, save_mean, save_invstd, scale, bias;
    BatchNormParams p;
  };
  virtual Status batch_norm_finalize(const BatchNormFinalize& finalize);
  // batch_norm_finalize, then conv2d_forward_fused with the scale and bias it gave: one call, so
  // that a backend that applies the prologue in a pass of its own may finalize in that pass, one
  // launch less (the CUDA backend at small batches). sum and sqsum (y's) as for
  // conv2d_forward_fused.
  virtual Status conv2d_forward_finalize_fused(const BatchNormFinalize& finalize,
                                               const TensorView& x, const TensorView& w,
                                               const TensorView& y, const TensorView& sum,
                                               const TensorView& sqsum, const Conv2dParams& p);
  // batch_norm_finalize (without scale and bias), then batch_norm_apply with the statistics it
  // saved: one call, so that a backend may finalize in the apply's pass, one launch less.
  virtual Status batch_norm_finalize_apply(const BatchNormFinalize& finalize, const TensorView& x,
                                           const TensorView& residual, const TensorView& y,
                                           bool relu);
  // y = bn(x) with the saved statistics (the elementwise pass of batch_norm_train_forward), then
  // + residual where it has data, then a ReLU where `relu`.
  virtual Status batch_norm_apply(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, const TensorView& save_mean,
                                  const TensorView& save_invstd, const TensorView& residual,
                                  const TensorView& y, bool relu);

  // y = relu(bn(x) + bn(r)), each batch norm with its own saved statistics: a ResNet block's
  // output whose shortcut is another batch norm's output (a projection's), which is then never
  // stored: one pass over x and r instead of batch_norm_apply for each, bn(r) kept in fp32.
  virtual Status batch_norm_apply_add(const TensorView& x, const TensorView& gamma,
                                      const TensorView& beta, const TensorView& save_mean,
                                      const TensorView& save_invstd, const TensorView& r,
                                      const TensorView& r_gamma, const TensorView& r_beta,
                                      const TensorView& r_mean, const TensorView& r_invstd,
                                      const TensorView& y);
  // batch_norm_finalize of x's batch norm and of r's (neither with scale and bias), then
  // batch_norm_apply_add with the statistics they saved: one call, so that a backend may
  // finalize both in the pass, two launches less.
  virtual Status batch_norm_finalize_apply_add(const BatchNormFinalize& finalize,
                                               const TensorView& x,
                                               const BatchNormFinalize& r_finalize,
                                               const TensorView& r, const TensorView& y);
  // One batch norm's part of batch_norm_add_backward: its input and saved statistics, and where
  // its gradients go.
  struct BatchNormGrads {
    TensorView x, gamma, save_mean, save_invstd, dx, dgamma, dbeta;
  };
  // The backward of batch_norm_apply_add below its ReLU: dy reaches bn(x) and bn(r) alike, so both
  // batch norms' gradients come from the one dy, each as batch_norm_backward gives it. The
  // default runs batch_norm_backward for each; a backend may read dy once for both (a projection
  // block's output, whose gradient is as large as any tensor of its backward).
  virtual Status batch_norm_add_backward(const TensorView& dy, const BatchNormGrads& x,
                                         const BatchNormGrads& r);

  virtual Status relu_forward(const TensorView& x, const TensorView& y) = 0;
  // From the forward's output y: the gradient passes where y > 0.
  virtual Status relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx) = 0;

  // (optional) dx = a + b where y > 0, else 0: a ReLU's backward from a gradient that arrives as
  // two terms (ResNet's block output feeds the next block and its shortcut). Planned only where
  // fuses_relu_backward_add() is true; the default refuses.
  virtual bool fuses_relu_backward_add() const { return false; }
  virtual Status relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                                   const TensorView& dx);

  virtual Status max_pool2d_forward(const TensorView& x, const TensorView& y,
                                    const MaxPool2dParams& p) = 0;
  virtual Status max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& y,
                                     const TensorView& dx, const MaxPool2dParams& p) = 0;
  // (optional) The max pool's backward where its input x = relu(bn(bn_x)), written by
  // batch_norm_relu_train_forward, was never stored: x is computed again from the batch norm's
  // input bn_x, gamma, beta and saved statistics as that forward computed it, rounded to bn_x's
  // dtype, so each window's maximum is found where the forward found it. The planner calls it only
  // where recomputes_max_pool_input() is true; the default refuses.
  virtual bool recomputes_max_pool_input() const { return false; }
  virtual Status max_pool2d_backward_recomputed(const TensorView& dy, const TensorView& bn_x,
                                                const TensorView& gamma, const TensorView& beta,
                                                const TensorView& save_mean,
                                                const TensorView& save_invstd, const TensorView& dx,
                                                const MaxPool2dParams& p);
  // (optional) The backward of y = max_pool(relu(bn(x))) as batch_norm_relu_max_pool_train_forward
  // computed it, from y's gradient dy: dx, dgamma and dbeta as max_pool2d_backward_recomputed and
  // then batch_norm_relu_backward (y without data) give them (up to the order of the per-channel
  // sums), the pool's input gradient rounded to x's dtype between the two, but never stored: a
  // backend may gather it from dy wherever it needs it. `positions` are the windows' maxima's
  // places as that forward stored them, or without data, found again from x. Planned only where
  // fuses_max_pool_batch_norm_backward(x, pool) is true; the default refuses.
  virtual bool fuses_max_pool_batch_norm_backward(const TensorDesc& /*x*/,
                                                  const MaxPool2dParams& /*pool*/) const {
    return false;
  }
  virtual Status batch_norm_relu_max_pool_backward(
      const TensorView& dy, const TensorView& positions, const TensorView& x,
      const TensorView& gamma, const TensorView& beta, const TensorView& save_mean,
      const TensorView& save_invstd, const TensorView& dx, const TensorView& dgamma,
      const TensorView& dbeta, const MaxPool2dParams& pool);
  // (optional, where recomputes_max_pool_input() is true) y = max_pool(relu(bn(x))) with the
  // batch's statistics, which are saved and move the running ones as in
  // batch_norm_relu_train_forward; the batch norm's output is compared as that op would have
  // stored it (rounded to x's dtype) and never stored: max_pool2d_backward_recomputed makes it
  // again. Where `positions` has data (y's shape, layout and dtype), each window's maximum's place
  // in it too, r * kw + s for input row h0 + r and column w0 + s (h0, w0 the window's first,
  // padding included; where max_pool2d_backward finds the maximum: a strictly greater value or a
  // NaN moves it), a small integer in y's dtype, for batch_norm_relu_max_pool_backward. The
  // default refuses.
  virtual Status batch_norm_relu_max_pool_train_forward(
      const TensorView& x, const TensorView& gamma, const TensorView& beta,
      const TensorView& running_mean, const TensorView& running_var, const TensorView& y,
      const TensorView& positions, const TensorView& save_mean, const TensorView& save_invstd,
      const BatchNormParams& bn, const MaxPool2dParams& pool);

  // y = a + b; `y` may alias `a` or `b`.
  virtual Status add(const TensorView& a, const TensorView& b, const TensorView& y) = 0;

  virtual Status global_avg_pool_forward(const TensorView& x, const TensorView& y) = 0;
  virtual Status global_avg_pool_backward(const TensorView& dy, const TensorView& dx) = 0;

  virtual Status linear_forward(const TensorView& x, const TensorView& w, const TensorView& b,
                                const TensorView& y) = 0;
  virtual Status linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                                 const TensorView& dx, const TensorView& dw,
                                 const TensorView& db) = 0;

  // loss [1] = mean over the batch of -log softmax(logits)[label].
  virtual Status cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                                       const TensorView& loss) = 0;
  // dlogits = (softmax - one_hot) * loss_scale / N, loss_scale read from `counters`
  // (StepCounters, step_counters_desc()) when the call runs; 1 where `counters` has no data.
  virtual Status cross_entropy_backward(const TensorView& logits, const TensorView& labels,
                                        const TensorView& counters, const TensorView& dlogits) = 0;

  // Mixed precision: grads *= 1 / the loss scale of `counters`, and found_inf (fp32 [1]) is set to
  // 1 if any gradient is inf or NaN (left unchanged otherwise, so one flag can collect several
  // calls).
  virtual Status unscale_gradients(std::span<const TensorView> grads, const TensorView& counters,
                                   const TensorView& found_inf) = 0;

  // One launch (or loop) over all parameters: step steps_taken + 1 of `counters`, read when the
  // call runs (AdamW's bias correction; the first SGD step seeds the momentum buffer). When
  // `found_inf` has data and holds a non-zero value, parameters and state are left unchanged
  // (the step a dynamic loss scaler skips).
  virtual Status sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p,
                          const TensorView& counters, const TensorView& found_inf) = 0;
  virtual Status adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p,
                            const TensorView& counters, const TensorView& found_inf) = 0;
  // advance_step_counters on `counters` after the optimizer call, with found_inf's value (none:
  // no step is skipped) and the loss scaler's options where `scaler` is non-null.
  virtual Status advance_step(const TensorView& counters, const GradScalerOptions* scaler,
                              const TensorView& found_inf) = 0;

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;
  std::vector<bool> host_marked_;
};

}  // namespace dlprobe
