// Softmax cross-entropy over fp32 logits [N, K]: one block per row for the row's maximum and
// log-sum-exp, then (forward) one block summing the N row losses in a fixed order, so the loss is
// the same on every run. A label outside [0, K) cannot stop a queued kernel; it turns the row's
// loss and gradient into NaN, which the loss (and found_inf under a loss scaler) then shows.
#include "cuda_common.cuh"

namespace dlprobe::cuda {
namespace {

constexpr int kRowBlock = 256;

// log(sum_k exp(z_k)) of one row, shifted by its maximum so that no exp overflows; every thread
// of the block gets it.
__device__ float row_log_sum_exp(const float* row, std::int64_t classes) {
  float m = -INFINITY;
  for (std::int64_t k = threadIdx.x; k < classes; k += blockDim.x) m = fmaxf(m, row[k]);
  m = block_reduce<true>(m);
  float sum = 0.0F;
  for (std::int64_t k = threadIdx.x; k < classes; k += blockDim.x) sum += expf(row[k] - m);
  sum = block_reduce<false>(sum);
  return m + logf(sum);
}

template <class L>
__global__ void ce_row_loss(const float* logits, const L* labels, std::int64_t classes,
                            float* row_loss) {
  const std::int64_t n = blockIdx.x;
  const float* row = logits + n * classes;
  const float lse = row_log_sum_exp(row, classes);
  if (threadIdx.x == 0) {
    const auto label = static_cast<std::int64_t>(labels[n]);
    row_loss[n] = label >= 0 && label < classes ? lse - row[label] : NAN;
  }
}

__global__ void ce_mean(const float* row_loss, std::int64_t batch, float* loss) {
  float sum = 0.0F;
  for (std::int64_t n = threadIdx.x; n < batch; n += blockDim.x) sum += row_loss[n];
  sum = block_reduce<false>(sum);
  if (threadIdx.x == 0) *loss = sum / static_cast<float>(batch);
}

template <class L>
__global__ void ce_backward(const float* logits, const L* labels, std::int64_t classes,
                            const StepCounters* counters, double batch, float* dlogits) {
  // The loss scale as the step's counters hold it when this runs (a replayed graph included).
  const float scale =
      static_cast<float>((counters != nullptr ? counters->loss_scale : 1.0) / batch);
  const std::int64_t n = blockIdx.x;
  const float* row = logits + n * classes;
  float* out = dlogits + n * classes;
  const float lse = row_log_sum_exp(row, classes);
  const auto label = static_cast<std::int64_t>(labels[n]);
  const bool valid = label >= 0 && label < classes;
  for (std::int64_t k = threadIdx.x; k < classes; k += blockDim.x) {
    const float softmax = expf(row[k] - lse);
    out[k] = valid ? (softmax - (k == label ? 1.0F : 0.0F)) * scale : NAN;
  }
}

}  // namespace

Status launch_cross_entropy_forward(const KernelContext& ctx, const TensorView& logits,
                                    const TensorView& labels, const TensorView& loss) {
  const std::int64_t batch = logits.desc.dim(0);
  const std::int64_t classes = logits.desc.dim(1);
  DLPROBE_ASSIGN_OR_RETURN(auto rows, scratch(ctx, static_cast<std::size_t>(batch) * sizeof(float),
                                              "cross_entropy_forward"));
  auto* row_loss = static_cast<float*>(rows.data());
  return dispatch_label(labels.desc.dtype(), [&](auto tag) -> Status {
    using L = typename decltype(tag)::type;
    ce_row_loss<<<static_cast<unsigned>(batch), kRowBlock, 0, ctx.stream>>>(
        static_cast<const float*>(logits.data), static_cast<const L*>(labels.data), classes,
        row_loss);
    DLPROBE_CUDA_CHECK_LAUNCH();
    ce_mean<<<1, 1024, 0, ctx.stream>>>(row_loss, batch, static_cast<float*>(loss.data));
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_cross_entropy_backward(const KernelContext& ctx, const TensorView& logits,
                                     const TensorView& labels, const StepCounters* counters,
                                     const TensorView& dlogits) {
  const std::int64_t batch = logits.desc.dim(0);
  return dispatch_label(labels.desc.dtype(), [&](auto tag) -> Status {
    using L = typename decltype(tag)::type;
    ce_backward<<<static_cast<unsigned>(batch), kRowBlock, 0, ctx.stream>>>(
        static_cast<const float*>(logits.data), static_cast<const L*>(labels.data),
        logits.desc.dim(1), counters, static_cast<double>(batch),
        static_cast<float*>(dlogits.data));
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace dlprobe::cuda
