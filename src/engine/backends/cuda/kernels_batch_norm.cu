// Batch normalisation: per-channel reductions over N*H*W elements, split across blocks, merged per
// channel in a fixed order (deterministic), then an elementwise pass. Statistics accumulate in
// fp32 whatever the activation dtype, with Welford's update and Chan's merge rather than sums of
// x and x^2, which cancel when the mean is large against the spread.
//
// Element (n, c, s) of a channel, s the spatial index, sits at n*C*HW + c*HW + s in NCHW and at
// (n*HW + s)*C + c in NHWC; the reductions have one kernel for each so that neighbouring threads
// always read neighbouring addresses.
#include "cuda_common.cuh"

namespace dlprobe::cuda {
namespace {

// Accumulators are aggregates without member initialisers (`Acc acc{}` zeroes them) because
// __shared__ arrays of them cannot have constructors.
struct Welford {
  float count;
  float mean;
  float m2;

  __device__ void push(float x) {
    count += 1.0F;
    const float d = x - mean;
    mean += d / count;
    m2 += d * (x - mean);
  }
  __device__ void merge(const Welford& o) {
    if (o.count == 0.0F) return;
    if (count == 0.0F) {
      *this = o;
      return;
    }
    const float total = count + o.count;
    const float d = o.mean - mean;
    const float w = o.count / total;
    mean += d * w;
    m2 += o.m2 + d * d * count * w;
    count = total;
  }
  __device__ Welford shfl_down(int off) const {
    return {__shfl_down_sync(0xffffffffu, count, off), __shfl_down_sync(0xffffffffu, mean, off),
            __shfl_down_sync(0xffffffffu, m2, off)};
  }
};

// Sums of dy and dy * (x - mean) for the backward pass.
struct GradSums {
  float dy;
  float dy_xmu;

  __device__ void merge(const GradSums& o) {
    dy += o.dy;
    dy_xmu += o.dy_xmu;
  }
  __device__ GradSums shfl_down(int off) const {
    return {__shfl_down_sync(0xffffffffu, dy, off), __shfl_down_sync(0xffffffffu, dy_xmu, off)};
  }
};

template <class T>
struct StatsLoader {
  const T* x;
  __device__ void operator()(Welford& acc, std::int64_t i, std::int64_t /*c*/) const {
    acc.push(to_float(x[i]));
  }
};

template <class T>
struct GradLoader {
  const T* dy;
  const T* x;
  const float* mean;
  __device__ void operator()(GradSums& acc, std::int64_t i, std::int64_t c) const {
    const float g = to_float(dy[i]);
    acc.dy += g;
    acc.dy_xmu += g * (to_float(x[i]) - mean[c]);
  }
};

// Merges over the block (blockDim.x == kBlock), result in thread 0.
template <class Acc>
__device__ Acc block_merge(Acc acc) {
  __shared__ Acc partial[kBlock / 32];
  for (int off = 16; off > 0; off /= 2) acc.merge(acc.shfl_down(off));
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kBlock / 32; ++w) acc.merge(partial[w]);
  }
  return acc;
}

// grid (C, splits), block kBlock: block (c, split) covers elements [m0, m1) of channel c's
// N*HW, walking row by row so that threads read consecutive spatial positions.
template <class Acc, class Loader>
__global__ void reduce_nchw(Loader load, std::int64_t channels, std::int64_t area,
                            std::int64_t rows, std::int64_t per_split, Acc* partial) {
  const std::int64_t c = blockIdx.x;
  const std::int64_t m0 = blockIdx.y * per_split;
  const std::int64_t m1 = imin(rows, m0 + per_split);
  Acc acc{};
  for (std::int64_t n = m0 / area; n * area < m1; ++n) {
    const std::int64_t s0 = imax(m0 - n * area, std::int64_t{0});
    const std::int64_t s1 = imin(m1 - n * area, area);
    const std::int64_t base = (n * channels + c) * area;
    for (std::int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) load(acc, base + s, c);
  }
  acc = block_merge(acc);
  if (threadIdx.x == 0) partial[c * gridDim.y + blockIdx.y] = acc;
}

constexpr int kTileChannels = 32;
constexpr int kTileRows = kBlock / kTileChannels;

// grid (ceil(C/32), splits), block (32, 8): each warp reads 32 consecutive channels of one row.
template <class Acc, class Loader>
__global__ void reduce_nhwc(Loader load, std::int64_t channels, std::int64_t rows,
                            std::int64_t per_split, Acc* partial) {
  __shared__ Acc tile[kTileRows][kTileChannels];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kTileChannels + threadIdx.x;
  const std::int64_t m0 = blockIdx.y * per_split;
  const std::int64_t m1 = imin(rows, m0 + per_split);
  Acc acc{};
  if (c < channels) {
    for (std::int64_t m = m0 + threadIdx.y; m < m1; m += kTileRows) load(acc, m * channels + c, c);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    for (int r = 1; r < kTileRows; ++r) acc.merge(tile[r][threadIdx.x]);
    partial[c * gridDim.y + blockIdx.y] = acc;
  }
}

__global__ void finalize_stats(const Welford* partial, std::int64_t channels, std::int64_t splits,
                               float eps, float momentum, float* save_mean, float* save_invstd,
                               float* running_mean, float* running_var) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  Welford acc = partial[c * splits];
  for (std::int64_t s = 1; s < splits; ++s) acc.merge(partial[c * splits + s]);
  const float var_biased = acc.m2 / acc.count;
  const float var_unbiased = acc.m2 / (acc.count - 1.0F);
  save_mean[c] = acc.mean;
  save_invstd[c] = 1.0F / sqrtf(var_biased + eps);
  running_mean[c] = (1.0F - momentum) * running_mean[c] + momentum * acc.mean;
  running_var[c] = (1.0F - momentum) * running_var[c] + momentum * var_unbiased;
}

__global__ void finalize_grads(const GradSums* partial, std::int64_t channels, std::int64_t splits,
                               const float* invstd, float* dgamma, float* dbeta) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  GradSums acc = partial[c * splits];
  for (std::int64_t s = 1; s < splits; ++s) acc.merge(partial[c * splits + s]);
  dgamma[c] = acc.dy_xmu * invstd[c];
  dbeta[c] = acc.dy;
}

// Channel of storage index i.
__device__ __forceinline__ std::int64_t channel_of(std::int64_t i, std::int64_t channels,
                                                   std::int64_t area, bool nhwc) {
  return nhwc ? i % channels : (i / area) % channels;
}

// y = (x - mean) * invstd * gamma + beta, the order PyTorch evaluates it in. Inference passes
// running statistics and computes invstd from the running variance.
template <class T>
__global__ void normalize_kernel(const T* x, T* y, const float* mean, const float* invstd,
                                 const float* var, float eps, const float* gamma, const float* beta,
                                 std::int64_t total, std::int64_t channels, std::int64_t area,
                                 bool nhwc) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t c = channel_of(i, channels, area, nhwc);
    const float is = invstd != nullptr ? invstd[c] : 1.0F / sqrtf(var[c] + eps);
    y[i] = from_float<T>((to_float(x[i]) - mean[c]) * is * gamma[c] + beta[c]);
  }
}

// dx = gamma * invstd * (dy - sum(dy)/M - xhat * sum(dy * xhat)/M), xhat = (x - mean) * invstd;
// dgamma = sum(dy * xhat) and dbeta = sum(dy) are already computed.
template <class T>
__global__ void backward_dx_kernel(const T* dy, const T* x, T* dx, const float* gamma,
                                   const float* mean, const float* invstd, const float* dgamma,
                                   const float* dbeta, std::int64_t total, std::int64_t channels,
                                   std::int64_t area, bool nhwc, float inv_count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t c = channel_of(i, channels, area, nhwc);
    const float is = invstd[c];
    const float xhat = (to_float(x[i]) - mean[c]) * is;
    const float g = to_float(dy[i]) - dbeta[c] * inv_count - xhat * dgamma[c] * inv_count;
    dx[i] = from_float<T>(gamma[c] * is * g);
  }
}

// Queues the split reduction of `load` over x's channels into `partial` (channels * splits Accs).
template <class Acc, class Loader>
Status reduce_channels(const KernelContext& ctx, const TensorDesc& d, Loader load,
                       const ChannelReducePlan& plan, Acc* partial) {
  const std::int64_t channels = d.dim(1);
  const std::int64_t area = d.dim(2) * d.dim(3);
  const std::int64_t rows = d.dim(0) * area;
  if (d.layout() == Layout::nchw) {
    const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(plan.splits));
    reduce_nchw<Acc>
        <<<grid, kBlock, 0, ctx.stream>>>(load, channels, area, rows, plan.rows_per_split, partial);
  } else {
    const dim3 grid(static_cast<unsigned>((channels + kTileChannels - 1) / kTileChannels),
                    static_cast<unsigned>(plan.splits));
    reduce_nhwc<Acc><<<grid, dim3(kTileChannels, kTileRows), 0, ctx.stream>>>(
        load, channels, rows, plan.rows_per_split, partial);
  }
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

ChannelReducePlan plan_for(const KernelContext& ctx, const TensorDesc& d) {
  const std::int64_t channels = d.dim(1);
  const std::int64_t rows = d.dim(0) * d.dim(2) * d.dim(3);
  if (d.layout() == Layout::nchw) {
    return plan_channel_reduce(rows, channels, ctx.sm_count, 8 * kBlock);
  }
  return plan_channel_reduce(rows, (channels + kTileChannels - 1) / kTileChannels, ctx.sm_count,
                             32 * kTileRows);
}

const float* f32(const TensorView& t) {
  return static_cast<const float*>(t.data);
}
float* f32_out(const TensorView& t) {
  return static_cast<float*>(t.data);
}

}  // namespace

Status launch_batch_norm_train_forward(const KernelContext& ctx, const TensorView& x,
                                       const TensorView& gamma, const TensorView& beta,
                                       const TensorView& running_mean,
                                       const TensorView& running_var, const TensorView& y,
                                       const TensorView& save_mean, const TensorView& save_invstd,
                                       const BatchNormParams& p) {
  const TensorDesc& d = x.desc;
  const std::int64_t channels = d.dim(1);
  const ChannelReducePlan plan = plan_for(ctx, d);
  DLPROBE_ASSIGN_OR_RETURN(
      auto partial, scratch(ctx, static_cast<std::size_t>(channels * plan.splits) * sizeof(Welford),
                            "batch_norm_train_forward"));
  auto* acc = static_cast<Welford*>(partial.data());
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    DLPROBE_RETURN_IF_ERROR(
        reduce_channels(ctx, d, StatsLoader<T>{static_cast<const T*>(x.data)}, plan, acc));
    finalize_stats<<<grid_for(channels, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        acc, channels, plan.splits, static_cast<float>(p.eps), static_cast<float>(p.momentum),
        f32_out(save_mean), f32_out(save_invstd), f32_out(running_mean), f32_out(running_var));
    DLPROBE_CUDA_CHECK_LAUNCH();
    normalize_kernel<<<grid_for(d.numel(), ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(x.data), static_cast<T*>(y.data), f32(save_mean), f32(save_invstd),
        nullptr, 0.0F, f32(gamma), f32(beta), d.numel(), channels, d.dim(2) * d.dim(3),
        d.layout() == Layout::nhwc);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_batch_norm_inference_forward(const KernelContext& ctx, const TensorView& x,
                                           const TensorView& gamma, const TensorView& beta,
                                           const TensorView& running_mean,
                                           const TensorView& running_var, const TensorView& y,
                                           const BatchNormParams& p) {
  const TensorDesc& d = x.desc;
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    normalize_kernel<<<grid_for(d.numel(), ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(x.data), static_cast<T*>(y.data), f32(running_mean), nullptr,
        f32(running_var), static_cast<float>(p.eps), f32(gamma), f32(beta), d.numel(), d.dim(1),
        d.dim(2) * d.dim(3), d.layout() == Layout::nhwc);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_batch_norm_backward(const KernelContext& ctx, const TensorView& dy,
                                  const TensorView& x, const TensorView& gamma,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const TensorView& dx, const TensorView& dgamma,
                                  const TensorView& dbeta) {
  const TensorDesc& d = x.desc;
  const std::int64_t channels = d.dim(1);
  const ChannelReducePlan plan = plan_for(ctx, d);
  DLPROBE_ASSIGN_OR_RETURN(
      auto partial,
      scratch(ctx, static_cast<std::size_t>(channels * plan.splits) * sizeof(GradSums),
              "batch_norm_backward"));
  auto* acc = static_cast<GradSums*>(partial.data());
  const auto count = static_cast<float>(d.dim(0) * d.dim(2) * d.dim(3));
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const auto* dyp = static_cast<const T*>(dy.data);
    const auto* xp = static_cast<const T*>(x.data);
    DLPROBE_RETURN_IF_ERROR(
        reduce_channels(ctx, d, GradLoader<T>{dyp, xp, f32(save_mean)}, plan, acc));
    finalize_grads<<<grid_for(channels, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        acc, channels, plan.splits, f32(save_invstd), f32_out(dgamma), f32_out(dbeta));
    DLPROBE_CUDA_CHECK_LAUNCH();
    backward_dx_kernel<<<grid_for(d.numel(), ctx.sm_count), kBlock, 0, ctx.stream>>>(
        dyp, xp, static_cast<T*>(dx.data), f32(gamma), f32(save_mean), f32(save_invstd),
        f32(dgamma), f32(dbeta), d.numel(), channels, d.dim(2) * d.dim(3),
        d.layout() == Layout::nhwc, 1.0F / count);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace dlprobe::cuda
