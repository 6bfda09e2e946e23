// dlprobe's own CUDA kernels, as host functions that queue them on a stream. Shared by the
// backend (C++) and the kernel files (.cu). The backend has checked dtypes, layouts and shapes
// before calling; these only launch, and return the launch's Status. Scratch memory comes from
// the context's allocator (category workspace, owner `op`) and is released once queued (stream
// order keeps that safe, see dlprobe/cuda_backend.h).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/ops.h"
#include "dlprobe/engine/tensor.h"
#include "launch_plan.h"
#include "scratch_pool.h"

namespace dlprobe::cuda {

// Every pointer on a 16-byte boundary, as the kernels' 16-byte packs need (the engine's allocator
// aligns to 512 bytes; a caller's own buffers may not). A null pointer counts as aligned.
inline bool aligned_16(std::initializer_list<const void*> pointers) {
  return std::all_of(pointers.begin(), pointers.end(),
                     [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; });
}

struct KernelContext {
  cudaStream_t stream = nullptr;
  int sm_count = 1;
  memory::CachingAllocator* allocator = nullptr;
  ScratchPool* pool = nullptr;  // while a graph is being recorded
  // The device takes cooperative launches (grid-wide barriers); under MPS it may not.
  bool cooperative = false;
};

// Scratch memory for one op: given back when it goes out of scope (after the launch is queued;
// stream order makes that safe), to the allocator or to the pool of the graph being recorded.
class Scratch {
 public:
  Scratch(memory::DeviceBuffer buffer, ScratchPool* pool)
      : buffer_(std::move(buffer)), pool_(pool) {}
  Scratch(Scratch&& other) noexcept
      : buffer_(std::move(other.buffer_)), pool_(std::exchange(other.pool_, nullptr)) {}
  Scratch& operator=(Scratch&&) = delete;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (pool_ != nullptr && buffer_) pool_->give(std::move(buffer_));
  }
  void* data() const { return buffer_.data(); }

 private:
  memory::DeviceBuffer buffer_;
  ScratchPool* pool_;
};

inline Result<Scratch> scratch(const KernelContext& ctx, std::size_t bytes, std::string_view op) {
  if (ctx.pool != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(memory::DeviceBuffer b, ctx.pool->take(*ctx.allocator, bytes, op));
    return Scratch(std::move(b), ctx.pool);
  }
  DLPROBE_ASSIGN_OR_RETURN(memory::DeviceBuffer b,
                           ctx.allocator->allocate_buffer(bytes, memory::Category::workspace, op));
  return Scratch(std::move(b), nullptr);
}

// Elementwise, on tensors of one shape and layout (numel elements in storage order).
Status launch_fill(const KernelContext& ctx, const TensorView& t, double value);
Status launch_cast(const KernelContext& ctx, const TensorView& src, const TensorView& dst);
// launch_cast over pairs of one source dtype and one destination dtype, kCastsPerLaunch pairs a
// launch: the pointers travel in the kernel's parameters (no table to upload, which a CUDA graph
// would have to keep).
inline constexpr std::size_t kCastsPerLaunch = 96;
Status launch_cast_many(const KernelContext& ctx, std::span<const TensorView> src,
                        std::span<const TensorView> dst);
Status launch_relu_forward(const KernelContext& ctx, const TensorView& x, const TensorView& y);
Status launch_relu_backward(const KernelContext& ctx, const TensorView& dy, const TensorView& y,
                            const TensorView& dx);
// dx = a + b where y > 0, else 0.
Status launch_relu_backward_add(const KernelContext& ctx, const TensorView& a, const TensorView& b,
                                const TensorView& y, const TensorView& dx);
Status launch_add(const KernelContext& ctx, const TensorView& a, const TensorView& b,
                  const TensorView& y);
// NHWC tensors of one dtype and the same N, H, W (or K, R, S): dst's channel c is src's where src
// has it, else zero. Pads an image to more channels, or drops the extra ones of a gradient.
Status launch_copy_channels(const KernelContext& ctx, const TensorView& src, const TensorView& dst);
// A 7x7, stride-2, pad-3 convolution over an NHWC image x of at most four channels is the 4x4,
// stride-1, unpadded one over xd [N, kStemDepthChannels, P + 3, Q + 3] (P x Q the output) with
// the weights wd [K, kStemDepthChannels, 4, 4] (space to depth): each depth pixel holds a 2x2
// patch of the image, the border zero. launch_stem_weights_from_depth takes a weight gradient of
// wd back to w's shape. Any floating dtype; the backend takes the route in bf16 only.
inline constexpr std::int64_t kStemDepthChannels = 16;
Status launch_stem_to_depth(const KernelContext& ctx, const TensorView& x, const TensorView& xd);
Status launch_stem_weights_to_depth(const KernelContext& ctx, const TensorView& w,
                                    const TensorView& wd);
Status launch_stem_weights_from_depth(const KernelContext& ctx, const TensorView& wd,
                                      const TensorView& w);
// y = relu(x * scale + bias) per channel (NHWC; scale and bias [C], of one floating dtype), as a
// fused convolution's prologue gives its input.
Status launch_scale_bias_relu(const KernelContext& ctx, const TensorView& x,
                              const TensorView& scale, const TensorView& bias, const TensorView& y);

// What the batch-norm forward's elementwise pass does after normalising: add `residual` (same
// shape and layout as y) and apply a ReLU. A residual comes only with the ReLU, as in ResNet's
// last BN of a block: y = relu(bn(x) + shortcut).
struct BatchNormEpilogue {
  const TensorView* residual = nullptr;
  bool relu = false;
};

Status launch_batch_norm_train_forward(const KernelContext& ctx, const TensorView& x,
                                       const TensorView& gamma, const TensorView& beta,
                                       const TensorView& running_mean,
                                       const TensorView& running_var, const TensorView& y,
                                       const TensorView& save_mean, const TensorView& save_invstd,
                                       const BatchNormParams& p, const BatchNormEpilogue& epi);
// The training forward's statistics alone: save_mean, save_invstd and the running statistics'
// step, for an op that applies them itself. Always the split reduction: where the whole tensor
// fits in one grid's registers, launch_batch_norm_train_forward's one-launch path sums in another
// order, so the two may differ in the last bits.
Status launch_batch_norm_statistics(const KernelContext& ctx, const TensorView& x,
                                    const TensorView& running_mean, const TensorView& running_var,
                                    const TensorView& save_mean, const TensorView& save_invstd,
                                    const BatchNormParams& p);
Status launch_batch_norm_inference_forward(const KernelContext& ctx, const TensorView& x,
                                           const TensorView& gamma, const TensorView& beta,
                                           const TensorView& running_mean,
                                           const TensorView& running_var, const TensorView& y,
                                           const BatchNormParams& p, const BatchNormEpilogue& epi);
// The statistics from a convolution's per-channel sums over `count` values, and where f's scale
// and bias have data, the next convolution's prologue in their dtype (Backend::
// batch_norm_finalize).
Status launch_batch_norm_finalize(const KernelContext& ctx, const Backend::BatchNormFinalize& f);
// launch_batch_norm_finalize (with the prologue's scale and bias) and launch_scale_bias_relu
// from them in one launch: every block makes all channels' scale and bias from the sums, its
// first block stores what the finalize would. NHWC x and y; the outputs are those of the two
// launches to the bit.
Status launch_finalize_scale_bias_relu(const KernelContext& ctx,
                                       const Backend::BatchNormFinalize& f, const TensorView& x,
                                       const TensorView& y);
// launch_batch_norm_finalize (no prologue) and launch_batch_norm_apply from the statistics it
// saves in one launch (NHWC): each block makes its channels' statistics from the sums with the
// finalize's code, the first row of blocks stores them.
Status launch_batch_norm_finalize_apply(const KernelContext& ctx,
                                        const Backend::BatchNormFinalize& f, const TensorView& x,
                                        const TensorView& y, const BatchNormEpilogue& epi);
// The training forward's elementwise pass alone, with the saved statistics.
Status launch_batch_norm_apply(const KernelContext& ctx, const TensorView& x,
                               const TensorView& gamma, const TensorView& beta,
                               const TensorView& save_mean, const TensorView& save_invstd,
                               const TensorView& y, const BatchNormEpilogue& epi);
// A batch norm's parameters and saved statistics, per channel, fp32.
struct SavedBatchNorm {
  const TensorView& gamma;
  const TensorView& beta;
  const TensorView& mean;
  const TensorView& invstd;
};
// y = relu(bn(x) + bn(r)), each with its own statistics (Backend::batch_norm_apply_add).
Status launch_batch_norm_apply_add(const KernelContext& ctx, const TensorView& x,
                                   const SavedBatchNorm& xn, const TensorView& r,
                                   const SavedBatchNorm& rn, const TensorView& y);
// launch_batch_norm_finalize of both batch norms (no prologue) and launch_batch_norm_apply_add
// from the statistics they save in one launch (NHWC), as launch_batch_norm_finalize_apply does.
Status launch_batch_norm_finalize_apply_add(const KernelContext& ctx,
                                            const Backend::BatchNormFinalize& f,
                                            const TensorView& x,
                                            const Backend::BatchNormFinalize& rf,
                                            const TensorView& r, const TensorView& y);
// With `relu_beta` (the beta of a fused y = relu(bn(x))), dy is y's gradient and passes where
// bn(x) > 0, recomputed from x; without it, dy is the BN output's gradient.
Status launch_batch_norm_backward(const KernelContext& ctx, const TensorView& dy,
                                  const TensorView* relu_beta, const TensorView& x,
                                  const TensorView& gamma, const TensorView& save_mean,
                                  const TensorView& save_invstd, const TensorView& dx,
                                  const TensorView& dgamma, const TensorView& dbeta);
// launch_batch_norm_backward of x's batch norm and of r's (neither with the ReLU) from the one
// dy (Backend::batch_norm_add_backward). NHWC in packs, where the tensors are too large for the
// one-launch kernels: one pass sums dy, x and r for both, one launch finalizes both, one pass
// writes both dx; elsewhere the two calls. The gradients are launch_batch_norm_backward's to the
// bit.
Status launch_batch_norm_add_backward(const KernelContext& ctx, const TensorView& dy,
                                      const Backend::BatchNormGrads& x,
                                      const Backend::BatchNormGrads& r);
// A convolution output's per-channel sum and sum of squares (fp32, [C]), as cuDNN's statistics
// epilogue gives them, by a pass over y (NHWC).
Status launch_channel_sums(const KernelContext& ctx, const TensorView& y, const TensorView& sum,
                           const TensorView& sqsum);

// Where the max pool's input is never stored (Backend::batch_norm_relu_max_pool_train_forward and
// max_pool2d_backward_recomputed), what it is computed from: per channel
// relu((x - mean) * (invstd * gamma) + beta), rounded to x's dtype, x being the batch norm's input.
struct PoolInputFromBatchNorm {
  const float* mean;
  const float* invstd;
  const float* gamma;
  const float* beta;
};
// With `positions` (from_bn's NHWC in 16-byte channel packs only), each window's maximum's place
// in the window too, as a value of y's dtype laid out as y (Backend::
// batch_norm_relu_max_pool_train_forward's `positions`).
Status launch_max_pool2d_forward(const KernelContext& ctx, const TensorView& x, const TensorView& y,
                                 const MaxPool2dParams& p,
                                 const PoolInputFromBatchNorm* from_bn = nullptr,
                                 void* positions = nullptr);
Status launch_max_pool2d_backward(const KernelContext& ctx, const TensorView& dy,
                                  const TensorView& x, const TensorView& dx,
                                  const MaxPool2dParams& p,
                                  const PoolInputFromBatchNorm* from_bn = nullptr);
// The max pool backward's first pass alone (NHWC in 16-byte channel packs): each window's maximum
// found again in x (computed from the batch norm's input with from_bn) and its position in the
// window stored in `where`, a byte an element of the pool's output gradient dy, laid out as dy.
Status launch_max_pool2d_positions(const KernelContext& ctx, const TensorView& x,
                                   const TensorDesc& dy, std::uint8_t* where,
                                   const MaxPool2dParams& p, const PoolInputFromBatchNorm* from_bn);
// Where each window's maximum lies, laid out as the pool's output: bytes from
// launch_max_pool2d_positions, or else the forward's positions (launch_max_pool2d_forward's, in
// the activations' dtype).
struct PoolPositions {
  const std::uint8_t* bytes = nullptr;
  const void* values = nullptr;
};
// The backward of relu(bn(x)) where the ReLU's output gradient is the max pool's backward of dy
// (the pool after them, its windows' maxima at `where`): both of the batch norm's passes gather
// that gradient as they load it, rounded to x's dtype as the pool's backward would store it, where
// launch_max_pool2d_backward and launch_batch_norm_backward write it (x's size) and read it
// twice. NHWC in 16-byte channel packs.
Status launch_batch_norm_relu_backward_from_pool(
    const KernelContext& ctx, const TensorView& dy, const PoolPositions& where,
    const MaxPool2dParams& p, const TensorView& x, const TensorView& gamma, const TensorView& beta,
    const TensorView& save_mean, const TensorView& save_invstd, const TensorView& dx,
    const TensorView& dgamma, const TensorView& dbeta);

Status launch_global_avg_pool_forward(const KernelContext& ctx, const TensorView& x,
                                      const TensorView& y);
Status launch_global_avg_pool_backward(const KernelContext& ctx, const TensorView& dy,
                                       const TensorView& dx);

// db[o] = sum over rows n of dy[n, o], accumulated in fp32 (the bias gradient of linear).
Status launch_column_sum(const KernelContext& ctx, const TensorView& dy, const TensorView& db);

Status launch_cross_entropy_forward(const KernelContext& ctx, const TensorView& logits,
                                    const TensorView& labels, const TensorView& loss);
Status launch_cross_entropy_backward(const KernelContext& ctx, const TensorView& logits,
                                     const TensorView& labels, const StepCounters* counters,
                                     const TensorView& dlogits);

// Multi-tensor kernels over fp32 arrays: one launch over the packed table (see launch_plan.h).
// `counters` is the step's StepCounters in device memory, read by the kernel when it runs (the
// loss scale, the optimizer's step); `found_inf` is a device fp32 scalar or null.
Status launch_unscale(const KernelContext& ctx, const MultiTensorPack& pack,
                      const StepCounters* counters, float* found_inf);
Status launch_sgd(const KernelContext& ctx, const MultiTensorPack& pack, const SgdParams& p,
                  const StepCounters* counters, const float* found_inf);
Status launch_adamw(const KernelContext& ctx, const MultiTensorPack& pack, const AdamWParams& p,
                    const StepCounters* counters, const float* found_inf);
// advance_step_counters on the device: one thread.
Status launch_advance_step(const KernelContext& ctx, StepCounters* counters,
                           const GradScalerOptions* scaler, const float* found_inf);

}  // namespace dlprobe::cuda
