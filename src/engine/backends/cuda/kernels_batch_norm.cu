// Batch normalisation, with ReLU and the residual add fused in where the step allows: per-channel
// reductions over N*H*W elements split across blocks and merged per channel in a fixed order
// (deterministic), then one elementwise pass. These passes are memory-bound, so each thread moves
// 16 bytes per access (a "pack" of 8 fp16/bf16 or 4 fp32 values) and keeps its channels in
// registers across its loop instead of recomputing them from the element index.
//
// Statistics accumulate in fp32 whatever the activation dtype. Each thread sums x - s and
// (x - s)^2 around the first value s it saw of a channel (the shifted-data algorithm: no division
// per element, and no cancellation while the spread is small against the mean), turns its sums
// into a (count, mean, M2) triple, and triples merge by Chan's rule.
//
// Layouts: NHWC is rows of C channels (a row per n, h, w); a block is tx channel packs by ty rows,
// so every thread keeps the same channels for its whole loop. NCHW is N*C planes of H*W values; a
// statistics block covers one channel, an elementwise thread one pack of one plane.
#include <cooperative_groups.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_common.cuh"
#include "launch_plan.h"
#include "pool_geometry.cuh"

namespace dlprobe::cuda {
namespace {

// ---- accumulators ----

// Accumulators are aggregates without member initialisers (`Acc acc{}` zeroes them) because
// __shared__ arrays of them cannot have constructors.
struct Welford {
  float count;
  float mean;
  float m2;

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

// Sums around a shift: one thread's view of one channel.
struct Shifted {
  float shift;
  float sum;
  float sumsq;

  __device__ void push(float x, bool first) {
    if (first) shift = x;
    const float d = x - shift;
    sum += d;
    sumsq += d * d;
  }
  __device__ Welford welford(float count) const {
    if (count == 0.0F) return {0.0F, 0.0F, 0.0F};
    const float mean_d = sum / count;
    return {count, shift + mean_d, fmaxf(sumsq - sum * mean_d, 0.0F)};
  }
};

// Sums of g and g * (x - mean) for the backward pass, g the gradient reaching the BN output.
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

// Loads a statistics thread issues before it sums any of them. With one at a time each thread
// waited on memory latency and the pass ran well under the copy bandwidth. Eight 16-byte packs
// take stats_nhwc 127 registers in fp16 and 128 in bf16, two blocks an SM, where four took 80 and
// three blocks (the reductions' grids follow the occupancy): a third more bytes in flight an SM,
// and bf16 ResNet-50, whose batch norms all take these passes, ran 1.3 % faster (H100, bs256).
constexpr int kLoadsAhead = 8;

// ---- geometry ----

// NHWC: `rows` rows of `channels` values, `packs` = channels / kPack packs a row. A block is
// `tx` packs (a power of two, >= packs when packs <= kBlock) by `ty` = kBlock / tx rows.
struct Nhwc {
  std::int64_t rows;
  int channels;
  int packs;
  int tx;
  int ty;
};

// NCHW: `planes` = N * C planes of `area` values (area a multiple of the pack).
struct Nchw {
  std::int64_t batch;
  int channels;
  std::int64_t area;
};

// A thread's place in an NHWC block: its channel pack and its row within the block.
struct NhwcLane {
  int pack;
  int row;
};

__device__ __forceinline__ NhwcLane nhwc_lane(const Nhwc& g) {
  const int lane_c = static_cast<int>(threadIdx.x) % g.tx;
  return {static_cast<int>(blockIdx.x) * g.tx + lane_c, static_cast<int>(threadIdx.x) / g.tx};
}

// The rows [begin, end) of an NHWC reduction block's split (blockIdx.y).
struct RowSplit {
  std::int64_t begin;
  std::int64_t end;
};

__device__ __forceinline__ RowSplit row_split(const Nhwc& g, std::int64_t rows_per_split) {
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_split;
  return {r0, imin(g.rows, r0 + rows_per_split)};
}

// An NCHW reduction block (c, split): the packs [begin, end) of channel c's N * area / P.
template <int P>
struct PackSplit {
  int c;
  std::uint32_t area_packs;
  std::int64_t begin;
  std::int64_t end;

  // Where pack j of the channel starts.
  __device__ std::int64_t offset(const Nchw& g, std::int64_t j) const {
    const auto n = static_cast<std::uint32_t>(j) / area_packs;
    const std::uint32_t s = static_cast<std::uint32_t>(j) - n * area_packs;
    return (static_cast<std::int64_t>(n) * g.channels + c) * g.area + s * P;
  }
};

template <int P>
__device__ __forceinline__ PackSplit<P> pack_split(const Nchw& g, std::int64_t packs_per_split) {
  const auto area_packs = static_cast<std::uint32_t>(g.area / P);
  const std::int64_t total = g.batch * area_packs;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.y) * packs_per_split;
  return {static_cast<int>(blockIdx.x), area_packs, j0, imin(total, j0 + packs_per_split)};
}

// The channel of NCHW pack q.
template <int P>
__device__ __forceinline__ int nchw_channel(const Nchw& g, std::int64_t q) {
  const auto plane = static_cast<std::uint32_t>(q / static_cast<std::uint32_t>(g.area / P));
  return static_cast<int>(plane % static_cast<std::uint32_t>(g.channels));
}

// The elementwise passes' grid-stride loops: f(at) (or f(at, row)) for the offset of each NHWC
// row pack this thread takes, f(q, c) for each NCHW pack q (of channel c).
template <int P, class F>
__device__ __forceinline__ void for_each_nhwc_row(const Nhwc& g, const NhwcLane& lane, F&& f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.y) * g.ty;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * g.ty + lane.row; r < g.rows;
       r += stride) {
    if constexpr (std::is_invocable_v<F&, std::int64_t, std::int64_t>) {
      f(r * g.channels + lane.pack * P, r);
    } else {
      f(r * g.channels + lane.pack * P);
    }
  }
}

template <int P, class F>
__device__ __forceinline__ void for_each_nchw_pack(const Nchw& g, std::int64_t packs, F&& f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < packs;
       q += stride) {
    f(q, nchw_channel<P>(g, q));
  }
}

// A per-channel value for element k of a pack: its own (NHWC, a channel per element) or the
// plane's (NCHW, one channel for the pack).
template <int P>
__device__ __forceinline__ float of(const float (&v)[P], int k) {
  return v[k];
}
__device__ __forceinline__ float of(float v, int /*k*/) {
  return v;
}

// Folds the rows of an NHWC block's tile (each thread's accumulators, already stored) into row 0
// with a fixed tree, then row 0 stores its packs as this split's partials of their channels.
template <int P, class Acc>
__device__ void merge_tile(Acc (&tile)[kBlock][P], const Nhwc& g, const NhwcLane& lane,
                           Acc* partial) {
  __syncthreads();
  for (int step = g.ty / 2; step > 0; step /= 2) {
    if (lane.row < step) {
#pragma unroll
      for (int k = 0; k < P; ++k) tile[threadIdx.x][k].merge(tile[threadIdx.x + step * g.tx][k]);
    }
    __syncthreads();
  }
  if (lane.row == 0 && lane.pack < g.packs) {
#pragma unroll
    for (int k = 0; k < P; ++k)
      partial[blockIdx.y * g.channels + lane.pack * P + k] = tile[threadIdx.x][k];
  }
}

// What a BN elementwise pass needs per channel; inference passes the running variance instead
// of invstd (invstd null) and takes invstd = 1 / sqrt(var + eps).
struct Channels {
  const float* mean;
  const float* invstd;
  const float* var;
  float eps;
  const float* gamma;
  const float* beta;

  __device__ float inv(int c) const {
    return invstd != nullptr ? invstd[c] : 1.0F / sqrtf(var[c] + eps);
  }
};

// ---- statistics (training forward) ----

// grid (ceil(packs / tx), splits); partial is [splits][channels].
template <class T, int P>
__global__ void stats_nhwc(const T* x, Nhwc g, std::int64_t rows_per_split, Welford* partial) {
  __shared__ Welford tile[kBlock][P];
  const NhwcLane lane = nhwc_lane(g);
  const RowSplit rows = row_split(g, rows_per_split);
  Shifted acc[P] = {};
  float count = 0.0F;
  if (lane.pack < g.packs) {
    // kLoadsAhead rows are loaded before any is summed; the rows and their order are those of a
    // plain loop over r, r + ty, ...
    for (std::int64_t r = rows.begin + lane.row; r < rows.end; r += kLoadsAhead * g.ty) {
      float v[kLoadsAhead][P];
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        const std::int64_t ru = r + u * g.ty;
        if (ru < rows.end) load_pack(x + ru * g.channels + lane.pack * P, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        if (r + u * g.ty >= rows.end) break;
#pragma unroll
        for (int k = 0; k < P; ++k) acc[k].push(v[u][k], count == 0.0F);
        count += 1.0F;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < P; ++k) tile[threadIdx.x][k] = acc[k].welford(count);
  merge_tile(tile, g, lane, partial);
}

// grid (channels, splits), block kBlock: block (c, split) covers packs [j0, j1) of channel c's
// N * area / P packs.
template <class T, int P>
__global__ void stats_nchw(const T* x, Nchw g, std::int64_t packs_per_split, Welford* partial) {
  const PackSplit<P> split = pack_split<P>(g, packs_per_split);
  Shifted acc{};
  float count = 0.0F;
  // As in stats_nhwc: kLoadsAhead packs in flight, summed in the order of a plain loop.
  const std::int64_t step = static_cast<std::int64_t>(blockDim.x);
  for (std::int64_t j = split.begin + threadIdx.x; j < split.end; j += kLoadsAhead * step) {
    float v[kLoadsAhead][P];
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) {
      const std::int64_t ju = j + u * step;
      if (ju < split.end) load_pack(x + split.offset(g, ju), v[u]);
    }
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) {
      if (j + u * step >= split.end) break;
#pragma unroll
      for (int k = 0; k < P; ++k) {
        acc.push(v[u][k], count == 0.0F);
        count += 1.0F;
      }
    }
  }
  const Welford w = block_merge(acc.welford(count));
  if (threadIdx.x == 0) partial[blockIdx.y * g.channels + split.c] = w;
}

// The merges of a channel's splits: a warp per channel, lane l taking splits l, l + 32, ..., then
// a fixed shuffle tree over the lanes (deterministic). A thread per channel walking all splits
// in turn (hundreds: up to four blocks an SM per tile) waited on one load at a time.
template <class Acc>
__device__ Acc merge_splits(const Acc* partial, int channels, std::int64_t splits, int c) {
  Acc acc{};
  const int lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll 4
  for (std::int64_t s = lane; s < splits; s += 32) acc.merge(partial[s * channels + c]);
  for (int off = 16; off > 0; off /= 2) acc.merge(acc.shfl_down(off));
  return acc;
}

// The warp's channel in a grid of finalize_grid(channels) blocks; whole warps leave together, so
// the shuffles of merge_splits always see all 32 lanes.
__device__ __forceinline__ int warp_channel() {
  return static_cast<int>(blockIdx.x) * (kBlock / 32) + static_cast<int>(threadIdx.x) / 32;
}

// Where the training forward's statistics go, per channel.
struct StatsOut {
  float eps;
  float momentum;
  float* save_mean;
  float* save_invstd;
  float* running_mean;
  float* running_var;

  __device__ float invstd_of(const Welford& acc) const {
    return 1.0F / sqrtf(acc.m2 / acc.count + eps);
  }

  // Channel c's merged statistics: saved for the backward pass, folded into the running ones;
  // returns the inverse deviation. The running statistics are read before anything is stored:
  // the pointers may alias as far as the compiler knows, so a load after a store would wait for
  // it, one memory round trip more in these one-wave kernels.
  __device__ float finish(int c, const Welford& acc) const {
    const float old_mean = running_mean[c];
    const float old_var = running_var[c];
    const float var_unbiased = acc.m2 / (acc.count - 1.0F);
    const float invstd = invstd_of(acc);
    save_mean[c] = acc.mean;
    save_invstd[c] = invstd;
    // Each product and sum rounded as written: left to the compiler, a kernel may fuse either
    // product into an FMA, and two kernels that finalize alike would differ in the last bit.
    running_mean[c] =
        __fadd_rn(__fmul_rn(1.0F - momentum, old_mean), __fmul_rn(momentum, acc.mean));
    running_var[c] =
        __fadd_rn(__fmul_rn(1.0F - momentum, old_var), __fmul_rn(momentum, var_unbiased));
    return invstd;
  }
};

// A reduction's second launch: every channel's partials merged (merge_splits) and handed to
// `out`, a warp a channel, in a grid of finalize_grid(channels) blocks.
template <class Acc, class Out>
__global__ void finalize_partials(const Acc* partial, int channels, std::int64_t splits, Out out) {
  const int c = warp_channel();
  if (c >= channels) return;
  const Acc acc = merge_splits(partial, channels, splits, c);
  if (threadIdx.x % 32 == 0) out.finish(c, acc);
}

// What a finalize reads, per channel but the count of values summed.
struct SumsIn {
  const float* sum;
  const float* sqsum;
  const float* gamma;
  const float* beta;
  double count;
  double inv_count;  // 1 / count: products where divisions would cost dozens of fp64 instructions
};

// Channel c's (count, mean, M2) from its sum and sum of squares. The variance, E[x^2] - E[x]^2,
// is taken in double: in fp32 it cancels where the mean is large against the deviation.
__device__ __forceinline__ Welford from_sums(const SumsIn& in, int c) {
  const double mean = static_cast<double>(in.sum[c]) * in.inv_count;
  // Rounded as written (StatsOut::finish says why).
  const double var = fmax(
      __dsub_rn(__dmul_rn(static_cast<double>(in.sqsum[c]), in.inv_count), __dmul_rn(mean, mean)),
      0.0);
  return Welford{static_cast<float>(in.count), static_cast<float>(mean),
                 static_cast<float>(var * in.count)};
}

// From a convolution's per-channel sums (cuDNN's statistics epilogue): the channel's (count,
// mean, M2) handed to StatsOut::finish as the statistics pass's would be, and the next
// convolution's prologue scale = gamma * invstd and bias = beta - mean * scale in its dtype T
// (none where `scale` is null).
template <class T>
__global__ void finalize_sums(SumsIn in, int channels, StatsOut out, T* scale, T* bias) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= channels) return;
  // Every load issued before the first store (StatsOut::finish says why).
  const float g = scale != nullptr ? in.gamma[c] : 0.0F;
  const float b = scale != nullptr ? in.beta[c] : 0.0F;
  const Welford acc = from_sums(in, c);
  const float invstd = out.finish(c, acc);
  if (scale == nullptr) return;
  const float k = g * invstd;
  scale[c] = from_float<T>(k);
  bias[c] = from_float<T>(__fsub_rn(b, __fmul_rn(acc.mean, k)));  // as written (finish)
}

// finalize_sums with the prologue, then scale_bias_relu_packs over x with that scale and bias:
// every block makes each channel's in shared memory (2 * channels floats), block 0 also stores what
// finalize_sums stores. One launch where the two took two, each a few microseconds of a small
// batch's step.
template <class T, class S, int P>
__global__ void finalize_scale_bias_relu_nhwc(const T* x, T* y, std::int64_t packs,
                                              int channel_packs, SumsIn in, StatsOut out, S* scale,
                                              S* bias) {
  extern __shared__ float prologue[];
  const int channels = channel_packs * P;
  float* const s = prologue;
  float* const b = prologue + channels;
  for (int c = static_cast<int>(threadIdx.x); c < channels; c += static_cast<int>(blockDim.x)) {
    const float g = in.gamma[c];
    const float be = in.beta[c];
    const Welford acc = from_sums(in, c);
    const float invstd = blockIdx.x == 0 ? out.finish(c, acc) : out.invstd_of(acc);
    const float k = g * invstd;
    const S ks = from_float<S>(k);
    const S bs = from_float<S>(__fsub_rn(be, __fmul_rn(acc.mean, k)));
    if (blockIdx.x == 0) {
      scale[c] = ks;
      bias[c] = bs;
    }
    s[c] = to_float(ks);
    b[c] = to_float(bs);
  }
  __syncthreads();
  scale_bias_relu_packs<P>(
      x, y, packs, channel_packs, [&](int c) { return s[c]; }, [&](int c) { return b[c]; });
}

// ---- forward elementwise pass: y = [relu]((x - mean) * invstd * gamma + beta [+ residual]) ----

template <bool kResidual, bool kRelu, int P, class T, class C>
__device__ __forceinline__ void apply_pack(const T* x, const T* residual, T* y, std::int64_t at,
                                           const C& mean, const C& scale, const C& beta) {
  float v[P];
  load_pack(x + at, v);
  float res[P] = {};
  if constexpr (kResidual) load_pack(residual + at, res);
#pragma unroll
  for (int k = 0; k < P; ++k) {
    float o = bn_value(v[k], of(mean, k), of(scale, k), of(beta, k));
    if constexpr (kResidual) o += res[k];
    v[k] = kRelu ? relu(o) : o;
  }
  store_pack(y + at, v);
}

template <class T, int P, bool kResidual, bool kRelu>
__global__ void apply_nhwc(const T* x, const T* residual, T* y, Nhwc g, Channels ch) {
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  float mean[P], scale[P], beta[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = lane.pack * P + k;
    mean[k] = ch.mean[c];
    scale[k] = ch.inv(c) * ch.gamma[c];
    beta[k] = ch.beta[c];
  }
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t at) {
    apply_pack<kResidual, kRelu, P>(x, residual, y, at, mean, scale, beta);
  });
}

// The statistics of the tile of channels a block of an NHWC pass takes (tx * P of them, from
// blockIdx.x * tx * P), made from the sums with finalize_sums' code (without the prologue) into
// shared memory: each channel's mean, scale (invstd * gamma) and beta, `width` floats apart from
// `values`. The blocks of the first row (blockIdx.y 0, each channel once) also store what
// finalize_sums stores. The caller waits (__syncthreads) before it reads them.
__device__ __forceinline__ void finalize_tile(const Nhwc& g, int width, const SumsIn& in,
                                              const StatsOut& out, float* values) {
  const int first = static_cast<int>(blockIdx.x) * width;
  for (int j = static_cast<int>(threadIdx.x); j < width && first + j < g.channels;
       j += static_cast<int>(blockDim.x)) {
    const int c = first + j;
    const float gamma = in.gamma[c];
    const float beta = in.beta[c];
    const Welford acc = from_sums(in, c);
    const float invstd = blockIdx.y == 0 ? out.finish(c, acc) : out.invstd_of(acc);
    values[j] = acc.mean;
    values[width + j] = invstd * gamma;
    values[2 * width + j] = beta;
  }
}

// This thread's P channels of a tile finalize_tile made: v[0] the means, v[1] the scales, v[2]
// the betas.
template <int P>
__device__ __forceinline__ void tile_channel_values(const Nhwc& g, int width, const NhwcLane& lane,
                                                    const float* values, float (&v)[3][P]) {
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int j = (lane.pack - static_cast<int>(blockIdx.x) * g.tx) * P + k;
#pragma unroll
    for (int q = 0; q < 3; ++q) v[q][k] = values[q * width + j];
  }
}

// apply_nhwc with the statistics from the sums (finalize_tile): one launch where the finalize
// and the apply took two.
template <class T, int P, bool kResidual, bool kRelu>
__global__ void finalize_apply_nhwc(const T* x, const T* residual, T* y, Nhwc g, SumsIn in,
                                    StatsOut out) {
  extern __shared__ float tile_channels[];
  const int width = g.tx * P;
  finalize_tile(g, width, in, out, tile_channels);
  __syncthreads();
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  float v[3][P];
  tile_channel_values<P>(g, width, lane, tile_channels, v);
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t at) {
    apply_pack<kResidual, kRelu, P>(x, residual, y, at, v[0], v[1], v[2]);
  });
}

template <class T, int P, bool kResidual, bool kRelu>
__global__ void apply_nchw(const T* x, const T* residual, T* y, Nchw g, std::int64_t packs,
                           Channels ch) {
  for_each_nchw_pack<P>(g, packs, [&](std::int64_t q, int c) {
    const float scale = ch.inv(c) * ch.gamma[c];
    apply_pack<kResidual, kRelu, P>(x, residual, y, q * P, ch.mean[c], scale, ch.beta[c]);
  });
}

// y = relu(bn(x) + bn(r)) over the P elements at `at`: two batch norms' outputs summed in fp32,
// rounded once.
template <int P, class T, class C>
__device__ __forceinline__ void apply_add_pack(const T* x, const T* r, T* y, std::int64_t at,
                                               const C (&xs)[3], const C (&rs)[3]) {
  float v[P];
  float w[P];
  load_pack(x + at, v);
  load_pack(r + at, w);
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const float o = bn_value(v[k], of(xs[0], k), of(xs[1], k), of(xs[2], k)) +
                    bn_value(w[k], of(rs[0], k), of(rs[1], k), of(rs[2], k));
    v[k] = relu(o);
  }
  store_pack(y + at, v);
}

template <class T, int P>
__global__ void apply_add_nhwc(const T* x, const T* r, T* y, Nhwc g, Channels ch, Channels rch) {
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  // Per channel of each: mean, scale (invstd * gamma) and beta.
  float xs[3][P];
  float rs[3][P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = lane.pack * P + k;
    xs[0][k] = ch.mean[c];
    xs[1][k] = ch.inv(c) * ch.gamma[c];
    xs[2][k] = ch.beta[c];
    rs[0][k] = rch.mean[c];
    rs[1][k] = rch.inv(c) * rch.gamma[c];
    rs[2][k] = rch.beta[c];
  }
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t at) { apply_add_pack<P>(x, r, y, at, xs, rs); });
}

// apply_add_nhwc with both batch norms' statistics from their sums (finalize_tile each): one
// launch where their two finalizes and the apply took three.
template <class T, int P>
__global__ void finalize_apply_add_nhwc(const T* x, const T* r, T* y, Nhwc g, SumsIn in,
                                        StatsOut out, SumsIn rin, StatsOut rout) {
  extern __shared__ float tile_channels[];
  const int width = g.tx * P;
  float* const r_values = tile_channels + 3 * width;
  finalize_tile(g, width, in, out, tile_channels);
  finalize_tile(g, width, rin, rout, r_values);
  __syncthreads();
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  float xs[3][P];
  float rs[3][P];
  tile_channel_values<P>(g, width, lane, tile_channels, xs);
  tile_channel_values<P>(g, width, lane, r_values, rs);
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t at) { apply_add_pack<P>(x, r, y, at, xs, rs); });
}

template <class T, int P>
__global__ void apply_add_nchw(const T* x, const T* r, T* y, Nchw g, std::int64_t packs,
                               Channels ch, Channels rch) {
  for_each_nchw_pack<P>(g, packs, [&](std::int64_t q, int c) {
    const float xs[3] = {ch.mean[c], ch.inv(c) * ch.gamma[c], ch.beta[c]};
    const float rs[3] = {rch.mean[c], rch.inv(c) * rch.gamma[c], rch.beta[c]};
    apply_add_pack<P>(x, r, y, q * P, xs, rs);
  });
}

// ---- backward ----

// Per channel, what the fused ReLU's decision is recomputed from: the forward's mean, its scale
// invstd * gamma (the same product the forward took) and beta.
struct ReluChannels {
  const float* mean;
  const float* invstd;
  const float* gamma;
  const float* beta;
};

// The backward's operands of the P elements at `at`: g, the gradient reaching the BN output, and
// x. With the fused ReLU, g is dy where the forward's pre-activation bn(x) was positive, computed
// again from x by the forward's expression (bn_value) rather than read from the stored output y:
// one tensor less to read in each pass. It differs from the rule on the rounded y only where a
// positive pre-activation rounds to zero (below 2^-25 in fp16), where either gradient is right.
template <bool kRelu, int P, class C>
__device__ __forceinline__ void relu_mask(float (&g)[P], const float (&vx)[P], const C& mean,
                                          const C& scale, const C& beta) {
  if constexpr (kRelu) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (!(bn_value(vx[k], of(mean, k), of(scale, k), of(beta, k)) > 0.0F)) g[k] = 0.0F;
    }
  }
}

// dy's and x's packs at one place, kept as loaded until they are used.
template <class T, int P>
struct GradPacks {
  Pack<T, P> dy;
  Pack<T, P> x;
};

template <class T, int P>
__device__ __forceinline__ GradPacks<T, P> load_grad_packs(const T* dy, const T* x,
                                                           std::int64_t at) {
  return {load_raw<T, P>(dy + at), load_raw<T, P>(x + at)};
}

// Rows of its channels a thread of grad_sums_nhwc (and of the pair's grad_sums_add_nhwc) loads
// before it sums any: with one at a time each thread waited on the memory for every row. Four
// rows take the fp16 ReLU variant 96 registers and the pair's 111, two blocks an SM (reduction_for
// plans the grid by the occupancy), where two rows took 80, three blocks: a third more bytes in
// flight an SM, and fp16 ResNet-50 ran 0.8 to 2.0 % faster (H100, bs256 to bs32, two calls).
// Eight rows in the single sums (128 registers, still two blocks) ran 1 % slower at bs32. The
// elementwise dx pass keeps one row: two (bounded to three blocks an SM) and four (two blocks)
// ran within 0.2 % of it (fp16 ResNet-50, H100, bs32 to 256).
constexpr int kGradRowsAhead = 4;

// Where the backward's NHWC passes read the gradient reaching the batch norm's output (or its
// fused ReLU's) for the P channels of `pack` at NHWC row `row` (element offset `at`): a tensor
// shaped as x (StoredGrad), or the max pool's backward gathered as it is loaded (PooledGrad).
template <class T, int P>
struct StoredGrad {
  static constexpr int kRowsAhead = kGradRowsAhead;
  const T* dy;

  __device__ __forceinline__ Pack<T, P> load(std::int64_t /*row*/, int /*pack*/,
                                             std::int64_t at) const {
    return load_raw<T, P>(dy + at);
  }
};

// The gradient of the max pool's input: pool::gather_nhwc's sum over the windows whose maximum
// the element is, rounded to T as the pool's backward stores it, so that the batch norm's passes
// see the values they would read from that tensor. The stem's pool takes the cell kernels below.
template <class T, int P, class Pos>
struct PooledGrad {
  static constexpr int kRowsAhead = kGradRowsAhead;
  const T* dy;  // the pool's output gradient
  const Pos* where;
  pool::PoolGeom g;

  __device__ __forceinline__ Pack<T, P> load(std::int64_t row, int pack,
                                             std::int64_t /*at*/) const {
    // Rows number below 2^31 (check_size): 32-bit divisions, a fraction of 64-bit ones' cost.
    const auto r = static_cast<std::uint32_t>(row);
    const std::uint32_t nh = r / static_cast<std::uint32_t>(g.w);
    const std::uint32_t n = nh / static_cast<std::uint32_t>(g.h);
    const auto h = static_cast<int>(nh - n * static_cast<std::uint32_t>(g.h));
    const auto w = static_cast<int>(r - nh * static_cast<std::uint32_t>(g.w));
    float sum[P];
    pool::gather_nhwc<T, P, Pos>(dy, where, g, static_cast<int>(n), h, w, pack, sum);
    Pack<T, P> out;
#pragma unroll
    for (int k = 0; k < P; ++k) out.v[k] = from_float<T>(sum[k]);
    return out;
  }
};

template <bool kRelu, class T, int P, class C>
__device__ __forceinline__ void grad_operands(const GradPacks<T, P>& in, float (&g)[P],
                                              float (&vx)[P], const C& mean, const C& scale,
                                              const C& beta) {
  to_floats(in.dy, g);
  to_floats(in.x, vx);
  relu_mask<kRelu>(g, vx, mean, scale, beta);
}

template <bool kRelu, class T, int P, class C>
__device__ __forceinline__ void load_grad(const T* dy, const T* x, std::int64_t at, float (&g)[P],
                                          float (&vx)[P], const C& mean, const C& scale,
                                          const C& beta) {
  grad_operands<kRelu>(load_grad_packs<T, P>(dy, x, at), g, vx, mean, scale, beta);
}

// What grad_operands needs per channel of NHWC pack `pack`: the mean, and with the ReLU the
// forward's scale and beta.
template <bool kRelu, int P>
struct ReluPack {
  float mean[P];
  float scale[P] = {};
  float beta[P] = {};
};

template <bool kRelu, int P>
__device__ __forceinline__ ReluPack<kRelu, P> relu_pack(const ReluChannels& ch, int pack) {
  ReluPack<kRelu, P> v;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = pack * P + k;
    v.mean[k] = ch.mean[c];
    if constexpr (kRelu) {
      v.scale[k] = ch.invstd[c] * ch.gamma[c];
      v.beta[k] = ch.beta[c];
    }
  }
  return v;
}

// Adds one place's g and g * (x - mean) to the sums.
template <bool kRelu, class T, int P>
__device__ __forceinline__ void add_grad_sums(const GradPacks<T, P>& in,
                                              const ReluPack<kRelu, P>& v, GradSums (&acc)[P]) {
  float grad[P], vx[P];
  grad_operands<kRelu>(in, grad, vx, v.mean, v.scale, v.beta);
#pragma unroll
  for (int k = 0; k < P; ++k) {
    acc[k].dy += grad[k];
    acc[k].dy_xmu += grad[k] * (vx[k] - v.mean[k]);
  }
}

// The frame of the backward's NHWC sums kernels: a thread's sums of g and g * (x - mean) over
// its rows of the block's split, `add(lane, rows, v, acc)` given its pack's channel values, then
// the block's merge into the split's partials.
template <bool kRelu, int P, class Add>
__device__ __forceinline__ void grad_sums_block(const ReluChannels& ch, const Nhwc& g,
                                                std::int64_t rows_per_split, GradSums* partial,
                                                Add&& add) {
  __shared__ GradSums tile[kBlock][P];
  const NhwcLane lane = nhwc_lane(g);
  const RowSplit rows = row_split(g, rows_per_split);
  GradSums acc[P] = {};
  if (lane.pack < g.packs) add(lane, rows, relu_pack<kRelu, P>(ch, lane.pack), acc);
#pragma unroll
  for (int k = 0; k < P; ++k) tile[threadIdx.x][k] = acc[k];
  merge_tile(tile, g, lane, partial);
}

template <class T, int P, bool kRelu, class Grad = StoredGrad<T, P>>
__global__ void grad_sums_nhwc(Grad dy, const T* x, ReluChannels ch, Nhwc g,
                               std::int64_t rows_per_split, GradSums* partial) {
  auto add = [&](const NhwcLane& lane, const RowSplit& rows, const ReluPack<kRelu, P>& v,
                 GradSums(&acc)[P]) {
    // Grad::kRowsAhead rows loaded before any is summed, in the order of a plain loop over r,
    // r + ty, ...
    for (std::int64_t r = rows.begin + lane.row; r < rows.end; r += Grad::kRowsAhead * g.ty) {
      GradPacks<T, P> held[Grad::kRowsAhead];
#pragma unroll
      for (int u = 0; u < Grad::kRowsAhead; ++u) {
        const std::int64_t ru = r + u * g.ty;
        const std::int64_t at = ru * g.channels + lane.pack * P;
        if (ru < rows.end) held[u] = {dy.load(ru, lane.pack, at), load_raw<T, P>(x + at)};
      }
#pragma unroll
      for (int u = 0; u < Grad::kRowsAhead; ++u) {
        if (r + u * g.ty >= rows.end) break;
        add_grad_sums<kRelu>(held[u], v, acc);
      }
    }
  };
  grad_sums_block<kRelu, P>(ch, g, rows_per_split, partial, add);
}

template <class T, int P, bool kRelu>
__global__ void grad_sums_nchw(const T* dy, const T* x, ReluChannels ch, Nchw g,
                               std::int64_t packs_per_split, GradSums* partial) {
  const PackSplit<P> split = pack_split<P>(g, packs_per_split);
  const float m = ch.mean[split.c];
  const float scale = kRelu ? ch.invstd[split.c] * ch.gamma[split.c] : 0.0F;
  const float beta = kRelu ? ch.beta[split.c] : 0.0F;
  GradSums acc{};
  for (std::int64_t j = split.begin + threadIdx.x; j < split.end; j += blockDim.x) {
    const std::int64_t at = split.offset(g, j);
    float grad[P], vx[P];
    load_grad<kRelu>(dy, x, at, grad, vx, m, scale, beta);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      acc.dy += grad[k];
      acc.dy_xmu += grad[k] * (vx[k] - m);
    }
  }
  const GradSums sums = block_merge(acc);
  if (threadIdx.x == 0) partial[blockIdx.y * g.channels + split.c] = sums;
}

// Where the backward's parameter gradients go, per channel.
struct GradsOut {
  const float* invstd;
  float* dgamma;
  float* dbeta;

  __device__ void finish(int c, const GradSums& acc) const {
    dgamma[c] = acc.dy_xmu * invstd[c];
    dbeta[c] = acc.dy;
  }
};

// What the dx pass needs per channel.
struct GradChannels {
  const float* gamma;
  const float* beta;  // null without the fused ReLU
  const float* mean;
  const float* invstd;
  const float* dgamma;
  const float* dbeta;
  float inv_count;
};

// dx = gamma * invstd * (g - sum(g)/M - xhat * sum(g * xhat)/M), xhat = (x - mean) * invstd, with
// dgamma = sum(g * xhat) and dbeta = sum(g) already computed, taken per channel as a line in g and
// x - mean: dx = scale * g + (x - mean) * slope + offset, scale = gamma * invstd. Two values a
// channel beside the mean and scale the ReLU's mask reads anyway, where the expression above held
// three: the NHWC dx pass with the mask took 72 registers with them in fp16 and bf16 (three blocks
// of 256 threads an SM), 63 and 64 now (four), without spilling (ptxas -v, sm_90).
struct DxLine {
  float slope;
  float offset;
};

__device__ __forceinline__ DxLine dx_line(float scale, float invstd, float dgamma, float dbeta,
                                          float inv_count) {
  return {-scale * invstd * (dgamma * inv_count), -scale * (dbeta * inv_count)};
}

__device__ __forceinline__ float bn_dx(float g, float x, float mean, float scale, float slope,
                                       float offset) {
  return fmaf(scale, g, fmaf(x - mean, slope, offset));
}

// dx of the P elements at `at` from their packs of dy and x, with the per-channel values of
// bn_dx. `scale` is also the forward's scale of x - mean, which the ReLU's mask recomputes the
// forward's output with.
template <bool kRelu, int P, class T, class C>
__device__ __forceinline__ void dx_pack(const GradPacks<T, P>& in, T* dx, std::int64_t at,
                                        const C& mean, const C& scale, const C& slope,
                                        const C& offset, const C& beta) {
  float grad[P], vx[P];
  grad_operands<kRelu>(in, grad, vx, mean, scale, beta);
#pragma unroll
  for (int k = 0; k < P; ++k) {
    grad[k] = bn_dx(grad[k], vx[k], of(mean, k), of(scale, k), of(slope, k), of(offset, k));
  }
  store_pack(dx + at, grad);
}

// bn_dx's values for the P channels of NHWC pack `pack`.
template <int P>
struct DxPackLine {
  float mean[P];
  float scale[P];
  float slope[P];
  float offset[P];
};

template <int P>
__device__ __forceinline__ DxPackLine<P> dx_pack_line(const GradChannels& ch, int pack) {
  DxPackLine<P> l;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = pack * P + k;
    const float inv = ch.invstd[c];
    l.mean[k] = ch.mean[c];
    l.scale[k] = ch.gamma[c] * inv;
    const DxLine line = dx_line(l.scale[k], inv, ch.dgamma[c], ch.dbeta[c], ch.inv_count);
    l.slope[k] = line.slope;
    l.offset[k] = line.offset;
  }
  return l;
}

template <class T, int P, bool kRelu, class Grad = StoredGrad<T, P>>
__global__ void dx_nhwc(Grad dy, const T* x, T* dx, Nhwc g, GradChannels ch) {
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  const DxPackLine<P> l = dx_pack_line<P>(ch, lane.pack);
  float beta[P] = {};
  if constexpr (kRelu) {
#pragma unroll
    for (int k = 0; k < P; ++k) beta[k] = ch.beta[lane.pack * P + k];
  }
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t at, std::int64_t row) {
    const GradPacks<T, P> in{dy.load(row, lane.pack, at), load_raw<T, P>(x + at)};
    dx_pack<kRelu, P>(in, dx, at, l.mean, l.scale, l.slope, l.offset, beta);
  });
}

// ---- the stem's backward: its max pool's, ReLU's and batch norm's by cells ----
//
// grad_sums_nhwc's and dx_nhwc's work with the gradient gathered from the stem's pool a cell of
// 2 x 2 inputs at a time (pool_geometry.cuh): `g` counts the cells as its rows.

// Elements of T a thread of the cell kernels takes: 8 bytes. A cell's twelve packs (x, dy and
// positions for four places) are loaded before any is used, and with 16 bytes the passes took
// 131 to 211 registers in fp16 and bf16 (ptxas, sm_90), one block an SM; 80 to 122 with 8.
template <class T>
inline constexpr int kCellPack = kPack<T> / 2;

// The pool's output gradient and its windows' maxima's positions.
template <class T, class Pos>
struct StemPool {
  const T* dy;
  const Pos* where;
  pool::PoolGeom geom;
  pool::StemCells cells;
};

// A cell's four inputs for channel pack `pack`: each one's gradient (as the pool's backward
// stores it) and x, its element offset, and whether it lies in the plane.
template <class T, int P>
struct CellOperands {
  GradPacks<T, P> in[4];
  std::int64_t at[4];
  bool held[4];
};

template <class T, int P, class Pos>
__device__ __forceinline__ CellOperands<T, P> cell_operands(const StemPool<T, Pos>& src, const T* x,
                                                            std::int64_t cell, int pack) {
  const pool::PoolGeom g = pool::geometry<true>(src.geom);
  const pool::StemCell c = pool::stem_cell(src.cells, static_cast<std::uint32_t>(cell));
  CellOperands<T, P> o;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    o.held[k] = pool::holds_input(g, c, k);
    o.at[k] = pool::input_at(g, c, k) + pack * P;
    if (o.held[k]) o.in[k].x = load_raw<T, P>(x + o.at[k]);
  }
  Pack<T, P> grad[4];
  pool::cell_grads<T, P>(src.dy, src.where, g, c, pack, grad);
#pragma unroll
  for (int k = 0; k < 4; ++k) o.in[k].dy = grad[k];
  return o;
}

// Three blocks an SM where the registers allow it without spilling (80: fp16 and fp32; bf16
// spills 62 to 72 bytes there, so two; ptxas, sm_90): with two the fp16 pass ran at 1.59 TB/s,
// 0.397 ms at batch 256, with three 1.82 TB/s, 0.349 ms (H100, Nsight Compute, 2026-12-06).
template <class T>
inline constexpr int kStemSumsBlocks = std::is_same_v<T, __nv_bfloat16> ? 2 : 3;

template <class T, int P, class Pos>
__global__ void __launch_bounds__(kBlock, kStemSumsBlocks<T>)
    grad_sums_stem_nhwc(StemPool<T, Pos> src, const T* x, ReluChannels ch, Nhwc g,
                        std::int64_t rows_per_split, GradSums* partial) {
  auto add = [&](const NhwcLane& lane, const RowSplit& rows, const ReluPack<true, P>& v,
                 GradSums(&acc)[P]) {
    for (std::int64_t r = rows.begin + lane.row; r < rows.end; r += g.ty) {
      const CellOperands<T, P> o = cell_operands<T, P>(src, x, r, lane.pack);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (o.held[k]) add_grad_sums<true>(o.in[k], v, acc);
      }
    }
  };
  grad_sums_block<true, P>(ch, g, rows_per_split, partial, add);
}

template <class T, int P, class Pos>
__global__ void dx_stem_nhwc(StemPool<T, Pos> src, const T* x, T* dx, Nhwc g, GradChannels ch) {
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  const DxPackLine<P> l = dx_pack_line<P>(ch, lane.pack);
  float beta[P];
#pragma unroll
  for (int k = 0; k < P; ++k) beta[k] = ch.beta[lane.pack * P + k];
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t /*at*/, std::int64_t cell) {
    const CellOperands<T, P> o = cell_operands<T, P>(src, x, cell, lane.pack);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (o.held[k])
        dx_pack<true, P>(o.in[k], dx, o.at[k], l.mean, l.scale, l.slope, l.offset, beta);
    }
  });
}

template <class T, int P, bool kRelu>
__global__ void dx_nchw(const T* dy, const T* x, T* dx, Nchw g, std::int64_t packs,
                        GradChannels ch) {
  for_each_nchw_pack<P>(g, packs, [&](std::int64_t q, int c) {
    const float inv = ch.invstd[c];
    const float scale = ch.gamma[c] * inv;
    const DxLine line = dx_line(scale, inv, ch.dgamma[c], ch.dbeta[c], ch.inv_count);
    dx_pack<kRelu, P>(load_grad_packs<T, P>(dy, x, q * P), dx, q * P, ch.mean[c], scale, line.slope,
                      line.offset, kRelu ? ch.beta[c] : 0.0F);
  });
}

// ---- the backward of a block output's two batch norms (batch_norm_add_backward) ----
//
// A projection block's output is relu(bn(x) + bn(r)): below the ReLU one gradient dy reaches
// both batch norms, and as the largest tensor of the block's backward it was read four times by
// two backwards of two passes each. These kernels read it twice: the sums of both in one pass,
// both dx in another. Each batch norm's values are taken in the order and with the expressions of
// grad_sums_nhwc and dx_nhwc (without the ReLU), and the sums split as theirs are, so the
// gradients are those two backwards' to the bit.

// Where the pair's sums go: partial is [splits][2 * channels], x's channels then r's, so that one
// finalize_partials launch over 2 * channels merges both (PairGradsOut finishes them).
template <class T, int P>
__global__ void grad_sums_add_nhwc(const T* dy, const T* x, const T* r, const float* x_mean,
                                   const float* r_mean, Nhwc g, std::int64_t rows_per_split,
                                   GradSums* partial) {
  __shared__ GradSums tile[kBlock][P];
  const NhwcLane lane = nhwc_lane(g);
  const RowSplit rows = row_split(g, rows_per_split);
  // sum(dy) is the same sum for both batch norms; sum(dy * (v - mean)) one each.
  float sum_dy[P] = {}, dy_xmu[P] = {}, dy_rmu[P] = {};
  if (lane.pack < g.packs) {
    float mx[P], mr[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      mx[k] = x_mean[lane.pack * P + k];
      mr[k] = r_mean[lane.pack * P + k];
    }
    for (std::int64_t row = rows.begin + lane.row; row < rows.end; row += kGradRowsAhead * g.ty) {
      Pack<T, P> held_dy[kGradRowsAhead], held_x[kGradRowsAhead], held_r[kGradRowsAhead];
#pragma unroll
      for (int u = 0; u < kGradRowsAhead; ++u) {
        const std::int64_t ru = row + u * g.ty;
        if (ru < rows.end) {
          const std::int64_t at = ru * g.channels + lane.pack * P;
          held_dy[u] = load_raw<T, P>(dy + at);
          held_x[u] = load_raw<T, P>(x + at);
          held_r[u] = load_raw<T, P>(r + at);
        }
      }
#pragma unroll
      for (int u = 0; u < kGradRowsAhead; ++u) {
        if (row + u * g.ty >= rows.end) break;
        float grad[P], vx[P], vr[P];
        to_floats(held_dy[u], grad);
        to_floats(held_x[u], vx);
        to_floats(held_r[u], vr);
#pragma unroll
        for (int k = 0; k < P; ++k) {
          sum_dy[k] += grad[k];
          dy_xmu[k] += grad[k] * (vx[k] - mx[k]);
          dy_rmu[k] += grad[k] * (vr[k] - mr[k]);
        }
      }
    }
  }
  // merge_tile stores a split's partials `channels` apart: 2 * channels here, r's C further on.
  Nhwc pair = g;
  pair.channels = 2 * g.channels;
#pragma unroll
  for (int k = 0; k < P; ++k) tile[threadIdx.x][k] = {sum_dy[k], dy_xmu[k]};
  merge_tile(tile, pair, lane, partial);
  __syncthreads();  // the first merge's last reads of the tile before it is written again
#pragma unroll
  for (int k = 0; k < P; ++k) tile[threadIdx.x][k] = {sum_dy[k], dy_rmu[k]};
  merge_tile(tile, pair, lane, partial + g.channels);
}

// GradsOut of both batch norms over 2 * channels merged channels, x's first.
struct PairGradsOut {
  GradsOut x;
  GradsOut r;
  int channels;

  __device__ void finish(int c, const GradSums& acc) const {
    if (c < channels) {
      x.finish(c, acc);
    } else {
      r.finish(c - channels, acc);
    }
  }
};

template <class T, int P>
__global__ void dx_add_nhwc(const T* dy, const T* x, const T* r, T* dx, T* dr, Nhwc g,
                            GradChannels xc, GradChannels rc) {
  const NhwcLane lane = nhwc_lane(g);
  if (lane.pack >= g.packs) return;
  const DxPackLine<P> lx = dx_pack_line<P>(xc, lane.pack);
  const DxPackLine<P> lr = dx_pack_line<P>(rc, lane.pack);
  for_each_nhwc_row<P>(g, lane, [&](std::int64_t at) {
    float grad[P], vx[P], vr[P];
    to_floats(load_raw<T, P>(dy + at), grad);
    to_floats(load_raw<T, P>(x + at), vx);
    to_floats(load_raw<T, P>(r + at), vr);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      vx[k] = bn_dx(grad[k], vx[k], lx.mean[k], lx.scale[k], lx.slope[k], lx.offset[k]);
      vr[k] = bn_dx(grad[k], vr[k], lr.mean[k], lr.scale[k], lr.slope[k], lr.offset[k]);
    }
    store_pack(dx + at, vx);
    store_pack(dr + at, vr);
  });
}

// ---- resident: one launch, its operands kept in registers ----
//
// Where a tensor is small enough for the whole grid to hold it in registers at once (most of
// ResNet-50's batch norms at small batches), statistics, their merge and the elementwise pass
// are one cooperative launch: each thread loads its R rows once, the grid merges the
// per-channel sums between two grid-wide barriers, and the same registers give the output. The
// three-launch path above reads x twice and pays two more launches and their ramps, which is
// what sets the time of a tensor of a few MB. Only NHWC with full packs takes this path.

// The grid's warps take the channels in turn, each merging its channel's splits in a fixed order
// (merge_splits): the same result on every run. Whole warps enter or leave together.
template <class F>
__device__ __forceinline__ void for_each_grid_channel(int channels, F&& f) {
  constexpr int kWarps = kBlock / 32;
  const std::int64_t block = static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * gridDim.y * kWarps;
  for (std::int64_t c = block * kWarps + threadIdx.x / 32; c < channels; c += warps) {
    f(static_cast<int>(c));
  }
}

// At least two blocks an SM: a deeper hold at one block an SM holds no more, and hides less of
// the memory's latency. At this bound the deeper backward (8 rows of x and of dy) fits in 128
// registers in every dtype (ptxas -v, sm_90); with three values a channel for its dx (bn_dx's
// earlier form) it spilled up to 176 bytes a thread in fp16 and bf16.
constexpr int kResidentBlocksPerSm = 2;

// Every channel's partials (one a split: gridDim.y of them) merged by the grid's warps and
// finished by `out`, between two grid-wide barriers: the first waits for every block's partials,
// the second makes every channel's result visible to every block.
template <class Acc, class Out>
__device__ __forceinline__ void merge_across_grid(const Acc* partial, int channels,
                                                  const Out& out) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  grid.sync();
  for_each_grid_channel(channels, [&](int c) {
    const Acc merged = merge_splits(partial, channels, gridDim.y, c);
    if (threadIdx.x % 32 == 0) out.finish(c, merged);
  });
  grid.sync();
}

// Thread (pack, row) of block (tile, split) holds rows first + k * ty, k < R.
template <int R>
__device__ __forceinline__ std::int64_t resident_first_row(const Nhwc& g, const NhwcLane& lane) {
  return static_cast<std::int64_t>(blockIdx.y) * g.ty * R + lane.row;
}

// A held pack: 16 bytes of T, as four 32-bit registers.
template <class T>
__device__ __forceinline__ uint4 load_held(const T* p) {
  return *reinterpret_cast<const uint4*>(p);
}

template <class T, int P>
__device__ __forceinline__ void unpack(const uint4& held, float (&out)[P]) {
  static_assert(sizeof(Pack<T, P>) == sizeof(uint4));
  Pack<T, P> pk;
  memcpy(&pk, &held, sizeof(pk));
#pragma unroll
  for (int k = 0; k < P; ++k) out[k] = to_float(pk.v[k]);
}

// An empty asm that claims to change the held registers, so that the compiler converts them again
// after the grid's barrier instead of keeping the floats it converted before it alive across it,
// which doubles the registers a held row takes (and halves the rows a grid can hold).
__device__ __forceinline__ void keep_packed(uint4& held) {
  asm volatile("" : "+r"(held.x), "+r"(held.y), "+r"(held.z), "+r"(held.w));
}

// grid (tiles, splits) of a ResidentPlan, launched cooperatively; partial is [splits][channels].
template <class T, int P, int R, bool kResidual, bool kRelu>
__global__ void __launch_bounds__(kBlock, kResidentBlocksPerSm)
    resident_forward_nhwc(const T* x, const T* residual, T* y, Nhwc g, const float* gamma,
                          const float* beta, StatsOut out, Welford* partial) {
  __shared__ Welford tile[kBlock][P];
  const NhwcLane lane = nhwc_lane(g);
  const bool active = lane.pack < g.packs;
  const std::int64_t first = resident_first_row<R>(g, lane);
  const std::int64_t column = static_cast<std::int64_t>(lane.pack) * P;
  uint4 held[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const std::int64_t r = first + k * g.ty;
    if (active && r < g.rows) held[k] = load_held(x + r * g.channels + column);
  }
  Shifted acc[P] = {};
  float count = 0.0F;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (!active || first + k * g.ty >= g.rows) break;
    float v[P];
    unpack<T>(held[k], v);
#pragma unroll
    for (int e = 0; e < P; ++e) acc[e].push(v[e], count == 0.0F);
    count += 1.0F;
  }
#pragma unroll
  for (int e = 0; e < P; ++e) tile[threadIdx.x][e] = acc[e].welford(count);
  merge_tile(tile, g, lane, partial);
  merge_across_grid(partial, g.channels, out);

  if (!active) return;
  float mean[P], scale[P], shift[P];
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const auto c = static_cast<int>(column) + e;
    mean[e] = out.save_mean[c];
    scale[e] = out.save_invstd[c] * gamma[c];
    shift[e] = beta[c];
  }
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const std::int64_t r = first + k * g.ty;
    if (r >= g.rows) break;
    const std::int64_t at = r * g.channels + column;
    keep_packed(held[k]);
    float v[P];
    unpack<T>(held[k], v);
    float res[P] = {};
    if constexpr (kResidual) load_pack(residual + at, res);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      float o = bn_value(v[e], mean[e], scale[e], shift[e]);
      if constexpr (kResidual) o += res[e];
      v[e] = kRelu ? relu(o) : o;
    }
    store_pack(y + at, v);
  }
}

// The backward in one launch: dy and x held, their sums merged across the grid, then dx.
template <class T, int P, int R, bool kRelu>
__global__ void __launch_bounds__(kBlock, kResidentBlocksPerSm)
    resident_backward_nhwc(const T* dy, const T* x, T* dx, Nhwc g, ReluChannels relu_ch,
                           float inv_count, GradsOut out, GradSums* partial) {
  __shared__ GradSums tile[kBlock][P];
  const NhwcLane lane = nhwc_lane(g);
  const bool active = lane.pack < g.packs;
  const std::int64_t first = resident_first_row<R>(g, lane);
  const std::int64_t column = static_cast<std::int64_t>(lane.pack) * P;
  uint4 held_dy[R];
  uint4 held_x[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const std::int64_t r = first + k * g.ty;
    if (active && r < g.rows) {
      const std::int64_t at = r * g.channels + column;
      held_dy[k] = load_held(dy + at);
      held_x[k] = load_held(x + at);
    }
  }
  float mean[P] = {}, scale[P] = {}, shift[P] = {};
  if (active) {
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const auto c = static_cast<int>(column) + e;
      mean[e] = relu_ch.mean[c];
      scale[e] = relu_ch.invstd[c] * relu_ch.gamma[c];
      if constexpr (kRelu) shift[e] = relu_ch.beta[c];
    }
  }
  GradSums acc[P] = {};
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (!active || first + k * g.ty >= g.rows) break;
    float grad[P], vx[P];
    unpack<T>(held_dy[k], grad);
    unpack<T>(held_x[k], vx);
    relu_mask<kRelu>(grad, vx, mean, scale, shift);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      acc[e].dy += grad[e];
      acc[e].dy_xmu += grad[e] * (vx[e] - mean[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < P; ++e) tile[threadIdx.x][e] = acc[e];
  merge_tile(tile, g, lane, partial);
  merge_across_grid(partial, g.channels, out);

  if (!active) return;
  float slope[P], offset[P];
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const auto c = static_cast<int>(column) + e;
    const DxLine line =
        dx_line(scale[e], relu_ch.invstd[c], out.dgamma[c], out.dbeta[c], inv_count);
    slope[e] = line.slope;
    offset[e] = line.offset;
  }
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const std::int64_t r = first + k * g.ty;
    if (r >= g.rows) break;
    keep_packed(held_dy[k]);
    keep_packed(held_x[k]);
    float grad[P], vx[P];
    unpack<T>(held_dy[k], grad);
    unpack<T>(held_x[k], vx);
    relu_mask<kRelu>(grad, vx, mean, scale, shift);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      grad[e] = bn_dx(grad[e], vx[e], mean[e], scale[e], slope[e], offset[e]);
    }
    store_pack(dx + r * g.channels + column, grad);
  }
}

// ---- a convolution output's sums, by a pass of their own ----
//
// Where the batch norm's statistics are not summed in the convolution's epilogue
// (CudaBackendOptions::conv_sums), a pass over the output sums each channel and its squares
// as cuDNN's epilogue would, for the same finalize.

struct Sums {
  float sum;
  float sqsum;

  __device__ void merge(const Sums& o) {
    sum += o.sum;
    sqsum += o.sqsum;
  }
  __device__ Sums shfl_down(int off) const {
    return {__shfl_down_sync(0xffffffffu, sum, off), __shfl_down_sync(0xffffffffu, sqsum, off)};
  }
};

struct SumsOut {
  float* sum;
  float* sqsum;

  __device__ void finish(int c, const Sums& acc) const {
    sum[c] = acc.sum;
    sqsum[c] = acc.sqsum;
  }
};

// grid (tiles, splits) of reduction_for; partial is [splits][channels]. With kMerged the grid is
// launched cooperatively (all of it resident) and merges the partials itself after a grid-wide
// barrier, one launch where finalize_partials would be a second.
template <class T, int P, bool kMerged>
__global__ void channel_sums_nhwc(const T* y, Nhwc g, std::int64_t rows_per_split, Sums* partial,
                                  SumsOut out) {
  __shared__ Sums tile[kBlock][P];
  const NhwcLane lane = nhwc_lane(g);
  const RowSplit rows = row_split(g, rows_per_split);
  Sums acc[P] = {};
  if (lane.pack < g.packs) {
    // kLoadsAhead rows loaded before any is summed, in the order of a plain loop.
    for (std::int64_t r = rows.begin + lane.row; r < rows.end; r += kLoadsAhead * g.ty) {
      Pack<T, P> held[kLoadsAhead];
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        const std::int64_t ru = r + u * g.ty;
        if (ru < rows.end) held[u] = load_raw<T, P>(y + ru * g.channels + lane.pack * P);
      }
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        if (r + u * g.ty >= rows.end) break;
        float v[P];
        to_floats(held[u], v);
#pragma unroll
        for (int k = 0; k < P; ++k) {
          acc[k].sum += v[k];
          acc[k].sqsum += v[k] * v[k];
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < P; ++k) tile[threadIdx.x][k] = acc[k];
  merge_tile(tile, g, lane, partial);
  if constexpr (kMerged) {
    cooperative_groups::this_grid().sync();
    for_each_grid_channel(g.channels, [&](int c) {
      const Sums merged = merge_splits(partial, g.channels, gridDim.y, c);
      if (threadIdx.x % 32 == 0) out.finish(c, merged);
    });
  }
}

// ---- host side ----

const float* f32(const TensorView& t) {
  return static_cast<const float*>(t.data);
}
float* f32_out(const TensorView& t) {
  return static_cast<float*>(t.data);
}

// Whether d and its buffers take 16-byte packs: channels (NHWC) or H*W (NCHW) a multiple of the
// pack, every pointer 16-byte aligned (the engine's allocator aligns to 512 bytes). ResNet's
// tensors are, except NCHW planes of 7x7; those run one element per access.
bool packable(const TensorDesc& d, std::initializer_list<const void*> pointers) {
  const std::int64_t pack = 16 / static_cast<std::int64_t>(dtype_size(d.dtype()));
  const std::int64_t inner = d.layout() == Layout::nhwc ? d.dim(1) : d.dim(2) * d.dim(3);
  return inner % pack == 0 && aligned_16(pointers);
}

// The kernels index packs of a channel and planes with 32 bits.
Status check_size(const TensorDesc& d, std::string_view op) {
  if (d.numel() < (std::int64_t{1} << 32) &&
      d.dim(0) * d.dim(2) * d.dim(3) < (std::int64_t{1} << 31)) {
    return Status::ok();
  }
  return error(Errc::unsupported, std::string(op) + ": " + d.str() +
                                      " has more elements than the CUDA kernels index (2^32)");
}

// `max_tx`: the most packs of a row a block covers.
Nhwc nhwc_of(const TensorDesc& d, int pack, int max_tx = kBlock) {
  Nhwc g{};
  g.rows = d.dim(0) * d.dim(2) * d.dim(3);
  g.channels = static_cast<int>(d.dim(1));
  g.packs = static_cast<int>(d.dim(1) / pack);
  g.tx = 1;
  while (g.tx < g.packs && g.tx < max_tx) g.tx *= 2;
  g.ty = kBlock / g.tx;
  return g;
}

Nchw nchw_of(const TensorDesc& d) {
  return {d.dim(0), static_cast<int>(d.dim(1)), d.dim(2) * d.dim(3)};
}

// Blocks of `kernel` an SM runs at once, as its registers and shared memory (`shared` bytes of
// dynamic shared memory a block) allow. Asked once per kernel, shared size and device: every
// launch of the batch norm passes sizes its grid by it, and eager steps launch hundreds of them.
template <class... Params>
Result<int> blocks_per_sm(void (*kernel)(Params...), std::size_t shared = 0) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, std::size_t, int>, int> known;
  int device = 0;
  DLPROBE_CUDA_CHECK(cudaGetDevice(&device));
  const std::tuple<const void*, std::size_t, int> key{reinterpret_cast<const void*>(kernel), shared,
                                                      device};
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0;
  DLPROBE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, shared));
  known.emplace(key, per_sm);
  return per_sm;
}

// The split of a reduction: plan_channel_reduce over the rows (NHWC) or packs (NCHW) of a
// channel, in one wave of the reduction kernel's blocks: `per_sm` an SM, four at most (more splits
// would only lengthen the merge of their partials).
struct Reduction {
  dim3 grid;
  std::int64_t per_split = 0;
  std::int64_t splits = 1;
};

// A reduction's blocks cover at most a warp's width of packs (512 bytes of a row) and so at
// least 8 rows: a channel has one partial a split, each written, read and merged (by the finalize
// launch, or in the resident kernels between the grid's two barriers), so blocks one row tall
// make the merge rather than the tensor set the time. With a block as wide as the row (256 packs
// of ResNet-50's 2048 channels) the fp16 bs256 step's widest batch norms wrote 523 partials a
// channel, 8.6 MB, and their finalize took 11 us a launch on an H200 (Nsight Compute,
// 2026-12-05); the resident kernels always took this width.
constexpr int kReduceTx = 32;

Nhwc reduction_nhwc_of(const TensorDesc& d, int pack) {
  return nhwc_of(d, pack, kReduceTx);
}

Reduction reduction_for(const KernelContext& ctx, const TensorDesc& d, int pack, int per_sm) {
  Reduction r;
  ChannelReducePlan plan;
  const std::int64_t blocks = static_cast<std::int64_t>(std::clamp(per_sm, 1, 4)) * ctx.sm_count;
  if (d.layout() == Layout::nhwc) {
    const Nhwc g = reduction_nhwc_of(d, pack);
    const int tiles = (g.packs + g.tx - 1) / g.tx;
    plan = plan_channel_reduce(g.rows, tiles, blocks, 16 * g.ty);
    r.grid = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(plan.splits));
  } else {
    const std::int64_t packs = d.dim(0) * d.dim(2) * d.dim(3) / pack;
    plan = plan_channel_reduce(packs, d.dim(1), blocks, 4 * kBlock);
    r.grid = dim3(static_cast<unsigned>(d.dim(1)), static_cast<unsigned>(plan.splits));
  }
  r.per_split = plan.rows_per_split;
  r.splits = plan.splits;
  return r;
}

// The grids of an elementwise pass over d: enough blocks to fill the GPU, each thread looping.
// NHWC takes the blocks the GPU runs at once (`per_sm` of the kernel an SM): with eight an SM
// whatever the kernel, the batch norm passes whose registers allow three or four ran in two to
// three waves, the last part full.
dim3 nhwc_grid(const KernelContext& ctx, const TensorDesc& d, int pack, int per_sm) {
  const Nhwc g = nhwc_of(d, pack);
  const int tiles = (g.packs + g.tx - 1) / g.tx;
  const std::int64_t row_blocks = (g.rows + g.ty - 1) / g.ty;
  const std::int64_t want = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::max(per_sm, 1)) * ctx.sm_count / tiles);
  return dim3(static_cast<unsigned>(tiles),
              static_cast<unsigned>(std::min<std::int64_t>({row_blocks, want, 65535})));
}

dim3 nchw_grid(const KernelContext& ctx, const TensorDesc& d, int pack) {
  return dim3(grid_for(d.numel() / pack, ctx.sm_count));
}

// The finalize kernels' grid: a warp per channel.
unsigned finalize_grid(int channels) {
  constexpr int kWarps = kBlock / 32;
  return static_cast<unsigned>((channels + kWarps - 1) / kWarps);
}

// The start every launch shares: d within what the kernels index, then f.operator()<T, P>() with
// d's element type and the pack its buffers `pointers` take.
template <class F>
Status dispatch(std::string_view op, const TensorDesc& d,
                std::initializer_list<const void*> pointers, F&& f) {
  DLPROBE_RETURN_IF_ERROR(check_size(d, op));
  const bool wide = packable(d, pointers);
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    if (wide) return f.template operator()<T, kPack<T>>();
    return f.template operator()<T, 1>();
  });
}

// A reduction's split over d and its partials: an accumulator per channel and split.
template <class Acc>
struct Partials {
  Reduction red;
  Scratch buffer;
  Acc* acc() const { return static_cast<Acc*>(buffer.data()); }
};

// `per_sm`: blocks of the reduction kernel an SM runs at once; `sets` of d's channels a split
// (two where one pass sums two batch norms).
template <class Acc>
Result<Partials<Acc>> partials(const KernelContext& ctx, const TensorDesc& d, int pack, int per_sm,
                               std::string_view op, int sets = 1) {
  const Reduction red = reduction_for(ctx, d, pack, per_sm);
  DLPROBE_ASSIGN_OR_RETURN(
      Scratch buffer,
      scratch(ctx, static_cast<std::size_t>(sets * d.dim(1) * red.splits) * sizeof(Acc), op));
  return Partials<Acc>{red, std::move(buffer)};
}

template <class T, int P, bool kResidual, bool kRelu>
Status launch_apply(const KernelContext& ctx, const TensorDesc& d, const T* x, const T* residual,
                    T* y, const Channels& ch) {
  if (d.layout() == Layout::nhwc) {
    auto* kernel = apply_nhwc<T, P, kResidual, kRelu>;
    DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(kernel));
    kernel<<<nhwc_grid(ctx, d, P, per_sm), kBlock, 0, ctx.stream>>>(x, residual, y, nhwc_of(d, P),
                                                                    ch);
  } else {
    apply_nchw<T, P, kResidual, kRelu><<<nchw_grid(ctx, d, P), kBlock, 0, ctx.stream>>>(
        x, residual, y, nchw_of(d), d.numel() / P, ch);
  }
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

// f.operator()<kResidual, kRelu>() for the epilogue the step asked for. The residual sum always
// meets a ReLU in ResNet; BatchNormEpilogue says so.
template <class F>
auto with_epilogue(const BatchNormEpilogue& epi, F&& f) {
  if (epi.residual != nullptr) return f.template operator()<true, true>();
  if (epi.relu) return f.template operator()<false, true>();
  return f.template operator()<false, false>();
}

// The forward's elementwise pass, with the epilogue the step asked for.
template <class T, int P>
Status apply(const KernelContext& ctx, const TensorDesc& d, const TensorView& x,
             const BatchNormEpilogue& epi, const TensorView& y, const Channels& ch) {
  const auto* xp = static_cast<const T*>(x.data);
  const auto* residual =
      epi.residual != nullptr ? static_cast<const T*>(epi.residual->data) : nullptr;
  auto* yp = static_cast<T*>(y.data);
  return with_epilogue(epi, [&]<bool kResidual, bool kRelu>() {
    return launch_apply<T, P, kResidual, kRelu>(ctx, d, xp, residual, yp, ch);
  });
}

// Blocks of `kernel` the GPU runs at once: what a cooperative launch of it may have. None where
// the device takes no cooperative launch.
template <class... Params>
Result<std::int64_t> resident_blocks(const KernelContext& ctx, void (*kernel)(Params...)) {
  if (!ctx.cooperative) return 0;
  DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(kernel));
  return static_cast<std::int64_t>(per_sm) * ctx.sm_count;
}

// `kernel` over `grid` (kBlock threads a block) as a cooperative launch: every block resident at
// once, so that the grid may wait for all of its blocks.
template <class... Params, class... Args>
Status launch_cooperative(const KernelContext& ctx, dim3 grid, void (*kernel)(Params...),
                          Args&&... args) {
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kBlock);
  config.stream = ctx.stream;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  DLPROBE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  return Status::ok();
}

// The resident kernel of the two depths (rows a thread holds) that fits g: its depth and split;
// none where neither fits. A shallow depth spreads a small tensor over more blocks; a deep one
// holds a larger one.
template <int kShallow, int kDeep, class... Params>
Result<std::optional<ResidentPlan>> resident_plan(const KernelContext& ctx, const Nhwc& g,
                                                  void (*shallow)(Params...),
                                                  void (*deep)(Params...)) {
  const int tiles = (g.packs + g.tx - 1) / g.tx;
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t shallow_blocks, resident_blocks(ctx, shallow));
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t deep_blocks, resident_blocks(ctx, deep));
  const ResidentDepth depths[] = {{kShallow, shallow_blocks}, {kDeep, deep_blocks}};
  return plan_resident_reduce(g.rows, tiles, g.ty, depths);
}

// resident_plan's kernel, launched cooperatively with its partials; false where neither fits (the
// caller takes the three-launch path).
template <class Acc, int kShallow, int kDeep, class... Params, class... Args>
Result<bool> launch_resident(const KernelContext& ctx, const Nhwc& g, std::string_view op,
                             void (*shallow)(Params...), void (*deep)(Params...), Args&&... args) {
  const int tiles = (g.packs + g.tx - 1) / g.tx;
  DLPROBE_ASSIGN_OR_RETURN(const std::optional<ResidentPlan> plan,
                           (resident_plan<kShallow, kDeep>(ctx, g, shallow, deep)));
  if (!plan) return false;
  DLPROBE_ASSIGN_OR_RETURN(
      Scratch partial,
      scratch(ctx, static_cast<std::size_t>(g.channels * plan->splits) * sizeof(Acc), op));
  // The partials' buffer is the kernels' last argument.
  DLPROBE_RETURN_IF_ERROR(launch_cooperative(
      ctx, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(plan->splits)),
      plan->depth == kShallow ? shallow : deep, std::forward<Args>(args)...,
      static_cast<Acc*>(partial.data())));
  return true;
}

// Where a training forward's statistics go (StatsOut), from the op's arguments.
StatsOut stats_out(const BatchNormParams& p, const TensorView& running_mean,
                   const TensorView& running_var, const TensorView& save_mean,
                   const TensorView& save_invstd) {
  return {static_cast<float>(p.eps), static_cast<float>(p.momentum), f32_out(save_mean),
          f32_out(save_invstd),      f32_out(running_mean),          f32_out(running_var)};
}

// What a finalize reads (SumsIn) and where its statistics go (StatsOut).
SumsIn sums_in(const Backend::BatchNormFinalize& f) {
  const auto n = static_cast<double>(f.count);
  return {f32(f.sum), f32(f.sqsum), f32(f.gamma), f32(f.beta), n, 1.0 / n};
}

StatsOut stats_out(const Backend::BatchNormFinalize& f) {
  return stats_out(f.p, f.running_mean, f.running_var, f.save_mean, f.save_invstd);
}

const void* residual_data(const BatchNormEpilogue& epi) {
  return epi.residual != nullptr ? epi.residual->data : nullptr;
}

}  // namespace

// The training forward's statistics pass and their merge: the batch's mean and inverse deviation
// saved, the running statistics a step towards them (`out`).
template <class T, int P>
Status statistics(const KernelContext& ctx, const TensorDesc& d, const T* xp, const StatsOut& out,
                  std::string_view op) {
  const int channels = static_cast<int>(d.dim(1));
  DLPROBE_ASSIGN_OR_RETURN(const int per_sm, d.layout() == Layout::nhwc
                                                 ? blocks_per_sm(stats_nhwc<T, P>)
                                                 : blocks_per_sm(stats_nchw<T, P>));
  DLPROBE_ASSIGN_OR_RETURN(const Partials<Welford> partial,
                           partials<Welford>(ctx, d, P, per_sm, op));
  const Reduction& red = partial.red;
  Welford* acc = partial.acc();
  if (d.layout() == Layout::nhwc) {
    stats_nhwc<T, P>
        <<<red.grid, kBlock, 0, ctx.stream>>>(xp, reduction_nhwc_of(d, P), red.per_split, acc);
  } else {
    stats_nchw<T, P><<<red.grid, kBlock, 0, ctx.stream>>>(xp, nchw_of(d), red.per_split, acc);
  }
  DLPROBE_CUDA_CHECK_LAUNCH();
  finalize_partials<<<finalize_grid(channels), kBlock, 0, ctx.stream>>>(acc, channels, red.splits,
                                                                        out);
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

Status launch_batch_norm_train_forward(const KernelContext& ctx, const TensorView& x,
                                       const TensorView& gamma, const TensorView& beta,
                                       const TensorView& running_mean,
                                       const TensorView& running_var, const TensorView& y,
                                       const TensorView& save_mean, const TensorView& save_invstd,
                                       const BatchNormParams& p, const BatchNormEpilogue& epi) {
  constexpr std::string_view op = "batch_norm_train_forward";
  const TensorDesc& d = x.desc;
  const StatsOut out = stats_out(p, running_mean, running_var, save_mean, save_invstd);
  return dispatch(op, d, {x.data, y.data, residual_data(epi)}, [&]<class T, int P>() -> Status {
    const auto* xp = static_cast<const T*>(x.data);
    if constexpr (P == kPack<T>) {
      if (d.layout() == Layout::nhwc) {
        const auto* residual = static_cast<const T*>(residual_data(epi));
        auto* yp = static_cast<T*>(y.data);
        DLPROBE_ASSIGN_OR_RETURN(const bool done,
                                 with_epilogue(epi, [&]<bool kResidual, bool kRelu>() {
                                   const Nhwc g = reduction_nhwc_of(d, P);
                                   return launch_resident<Welford, 4, 16>(
                                       ctx, g, op, resident_forward_nhwc<T, P, 4, kResidual, kRelu>,
                                       resident_forward_nhwc<T, P, 16, kResidual, kRelu>, xp,
                                       residual, yp, g, f32(gamma), f32(beta), out);
                                 }));
        if (done) return Status::ok();
      }
    }
    DLPROBE_RETURN_IF_ERROR((statistics<T, P>(ctx, d, xp, out, op)));
    const Channels ch{f32(save_mean), f32(save_invstd), nullptr, 0.0F, f32(gamma), f32(beta)};
    return apply<T, P>(ctx, d, x, epi, y, ch);
  });
}

Status launch_batch_norm_statistics(const KernelContext& ctx, const TensorView& x,
                                    const TensorView& running_mean, const TensorView& running_var,
                                    const TensorView& save_mean, const TensorView& save_invstd,
                                    const BatchNormParams& p) {
  constexpr std::string_view op = "batch_norm_statistics";
  const StatsOut out = stats_out(p, running_mean, running_var, save_mean, save_invstd);
  return dispatch(op, x.desc, {x.data}, [&]<class T, int P>() -> Status {
    return statistics<T, P>(ctx, x.desc, static_cast<const T*>(x.data), out, op);
  });
}

Status launch_batch_norm_inference_forward(const KernelContext& ctx, const TensorView& x,
                                           const TensorView& gamma, const TensorView& beta,
                                           const TensorView& running_mean,
                                           const TensorView& running_var, const TensorView& y,
                                           const BatchNormParams& p, const BatchNormEpilogue& epi) {
  return dispatch("batch_norm_inference_forward", x.desc, {x.data, y.data, residual_data(epi)},
                  [&]<class T, int P>() -> Status {
                    const Channels ch{f32(running_mean),         nullptr,    f32(running_var),
                                      static_cast<float>(p.eps), f32(gamma), f32(beta)};
                    return apply<T, P>(ctx, x.desc, x, epi, y, ch);
                  });
}

Status launch_batch_norm_finalize(const KernelContext& ctx, const Backend::BatchNormFinalize& f) {
  const auto channels = static_cast<int>(f.gamma.desc.numel());
  const dim3 grid(static_cast<unsigned>((channels + kBlock - 1) / kBlock));
  const bool prologue = f.scale.data != nullptr;
  const DType t = prologue ? f.scale.desc.dtype() : DType::fp32;
  return dispatch_floating(t, [&]<class T>(TypeTag<T>) -> Status {
    finalize_sums<T><<<grid, kBlock, 0, ctx.stream>>>(
        sums_in(f), channels, stats_out(f), prologue ? static_cast<T*>(f.scale.data) : nullptr,
        prologue ? static_cast<T*>(f.bias.data) : nullptr);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_finalize_scale_bias_relu(const KernelContext& ctx,
                                       const Backend::BatchNormFinalize& f, const TensorView& x,
                                       const TensorView& y) {
  const TensorDesc& d = x.desc;
  if (d.layout() != Layout::nhwc || f.scale.desc.dtype() != f.bias.desc.dtype()) {
    return error(Errc::unsupported,
                 "finalize_scale_bias_relu: NHWC x, scale and bias of one dtype");
  }
  const auto channels = static_cast<int>(d.dim(1));
  const StatsOut out = stats_out(f);
  const SumsIn in = sums_in(f);
  const std::size_t shared = 2 * static_cast<std::size_t>(channels) * sizeof(float);
  return dispatch_floating(d.dtype(), [&]<class T>(TypeTag<T>) -> Status {
    return dispatch_floating(f.scale.desc.dtype(), [&]<class S>(TypeTag<S>) -> Status {
      const auto* xp = static_cast<const T*>(x.data);
      auto* yp = static_cast<T*>(y.data);
      auto* sp = static_cast<S*>(f.scale.data);
      auto* bp = static_cast<S*>(f.bias.data);
      constexpr int P = kPack<T>;
      if (channels % P == 0 && aligned_16({xp, yp})) {
        const std::int64_t packs = d.numel() / P;
        finalize_scale_bias_relu_nhwc<T, S, P>
            <<<grid_for(packs, ctx.sm_count), kBlock, shared, ctx.stream>>>(
                xp, yp, packs, channels / P, in, out, sp, bp);
      } else {
        finalize_scale_bias_relu_nhwc<T, S, 1>
            <<<grid_for(d.numel(), ctx.sm_count), kBlock, shared, ctx.stream>>>(
                xp, yp, d.numel(), channels, in, out, sp, bp);
      }
      DLPROBE_CUDA_CHECK_LAUNCH();
      return Status::ok();
    });
  });
}

Status launch_batch_norm_finalize_apply(const KernelContext& ctx,
                                        const Backend::BatchNormFinalize& f, const TensorView& x,
                                        const TensorView& y, const BatchNormEpilogue& epi) {
  const SumsIn in = sums_in(f);
  const StatsOut out = stats_out(f);
  return dispatch(
      "batch_norm_finalize_apply", x.desc, {x.data, y.data, residual_data(epi)},
      [&]<class T, int P>() -> Status {
        if (x.desc.layout() != Layout::nhwc) {
          return error(Errc::unsupported, "batch_norm_finalize_apply: NHWC only");
        }
        const auto* xp = static_cast<const T*>(x.data);
        const auto* rp =
            epi.residual != nullptr ? static_cast<const T*>(epi.residual->data) : nullptr;
        auto* yp = static_cast<T*>(y.data);
        const Nhwc g = nhwc_of(x.desc, P);
        const std::size_t shared = 3 * static_cast<std::size_t>(g.tx) * P * sizeof(float);
        return with_epilogue(epi, [&]<bool kResidual, bool kRelu>() -> Status {
          auto* kernel = finalize_apply_nhwc<T, P, kResidual, kRelu>;
          DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(kernel, shared));
          kernel<<<nhwc_grid(ctx, x.desc, P, per_sm), kBlock, shared, ctx.stream>>>(xp, rp, yp, g,
                                                                                    in, out);
          DLPROBE_CUDA_CHECK_LAUNCH();
          return Status::ok();
        });
      });
}

Status launch_batch_norm_apply(const KernelContext& ctx, const TensorView& x,
                               const TensorView& gamma, const TensorView& beta,
                               const TensorView& save_mean, const TensorView& save_invstd,
                               const TensorView& y, const BatchNormEpilogue& epi) {
  return dispatch("batch_norm_apply", x.desc, {x.data, y.data, residual_data(epi)},
                  [&]<class T, int P>() -> Status {
                    const Channels ch{f32(save_mean), f32(save_invstd), nullptr,
                                      0.0F,           f32(gamma),       f32(beta)};
                    return apply<T, P>(ctx, x.desc, x, epi, y, ch);
                  });
}

Status launch_batch_norm_apply_add(const KernelContext& ctx, const TensorView& x,
                                   const SavedBatchNorm& xn, const TensorView& r,
                                   const SavedBatchNorm& rn, const TensorView& y) {
  const TensorDesc& d = x.desc;
  return dispatch(
      "batch_norm_apply_add", d, {x.data, r.data, y.data}, [&]<class T, int P>() -> Status {
        const Channels ch{f32(xn.mean), f32(xn.invstd), nullptr, 0.0F, f32(xn.gamma), f32(xn.beta)};
        const Channels rch{f32(rn.mean), f32(rn.invstd), nullptr,
                           0.0F,         f32(rn.gamma),  f32(rn.beta)};
        const auto* xp = static_cast<const T*>(x.data);
        const auto* rp = static_cast<const T*>(r.data);
        auto* yp = static_cast<T*>(y.data);
        if (d.layout() == Layout::nhwc) {
          auto* kernel = apply_add_nhwc<T, P>;
          DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(kernel));
          kernel<<<nhwc_grid(ctx, d, P, per_sm), kBlock, 0, ctx.stream>>>(xp, rp, yp, nhwc_of(d, P),
                                                                          ch, rch);
        } else {
          apply_add_nchw<T, P><<<nchw_grid(ctx, d, P), kBlock, 0, ctx.stream>>>(
              xp, rp, yp, nchw_of(d), d.numel() / P, ch, rch);
        }
        DLPROBE_CUDA_CHECK_LAUNCH();
        return Status::ok();
      });
}

Status launch_batch_norm_finalize_apply_add(const KernelContext& ctx,
                                            const Backend::BatchNormFinalize& f,
                                            const TensorView& x,
                                            const Backend::BatchNormFinalize& rf,
                                            const TensorView& r, const TensorView& y) {
  const SumsIn in = sums_in(f);
  const StatsOut out = stats_out(f);
  const SumsIn rin = sums_in(rf);
  const StatsOut rout = stats_out(rf);
  return dispatch("batch_norm_finalize_apply_add", x.desc, {x.data, r.data, y.data},
                  [&]<class T, int P>() -> Status {
                    if (x.desc.layout() != Layout::nhwc) {
                      return error(Errc::unsupported, "batch_norm_finalize_apply_add: NHWC only");
                    }
                    const Nhwc g = nhwc_of(x.desc, P);
                    // Both batch norms' mean, scale and beta for the block's tile of channels:
                    // at most a block's width of the widest packs, within the 48 KiB a launch
                    // may take without opting in to more.
                    const std::size_t shared =
                        6 * static_cast<std::size_t>(g.tx) * P * sizeof(float);
                    static_assert(6 * kBlock * kPack<__half> * sizeof(float) <= 48 * 1024);
                    auto* kernel = finalize_apply_add_nhwc<T, P>;
                    DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(kernel, shared));
                    kernel<<<nhwc_grid(ctx, x.desc, P, per_sm), kBlock, shared, ctx.stream>>>(
                        static_cast<const T*>(x.data), static_cast<const T*>(r.data),
                        static_cast<T*>(y.data), g, in, out, rin, rout);
                    DLPROBE_CUDA_CHECK_LAUNCH();
                    return Status::ok();
                  });
}

// launch_batch_norm_add_backward's two passes, where the tensors are too large for the
// one-launch kernels; `each` (the two backwards) where they are not: they read each tensor once,
// which two passes cannot beat.
template <class T, int P, class Each>
Status add_backward_passes(const KernelContext& ctx, const TensorView& dy,
                           const Backend::BatchNormGrads& x, const Backend::BatchNormGrads& r,
                           Each&& each) {
  constexpr std::string_view op = "batch_norm_add_backward";
  const TensorDesc& d = x.x.desc;
  const Nhwc gs = reduction_nhwc_of(d, P);
  DLPROBE_ASSIGN_OR_RETURN(const std::optional<ResidentPlan> resident,
                           (resident_plan<4, 8>(ctx, gs, resident_backward_nhwc<T, P, 4, false>,
                                                resident_backward_nhwc<T, P, 8, false>)));
  if (resident) return each();
  // grad_sums_nhwc's split, so that each batch norm's partials are the ones its own backward
  // would merge.
  DLPROBE_ASSIGN_OR_RETURN(const int sums_per_sm, blocks_per_sm(grad_sums_nhwc<T, P, false>));
  DLPROBE_ASSIGN_OR_RETURN(const Partials<GradSums> partial,
                           partials<GradSums>(ctx, d, P, sums_per_sm, op, 2));
  const Reduction& red = partial.red;
  GradSums* acc = partial.acc();
  const int channels = gs.channels;
  const auto* dyp = static_cast<const T*>(dy.data);
  const auto* xp = static_cast<const T*>(x.x.data);
  const auto* rp = static_cast<const T*>(r.x.data);
  grad_sums_add_nhwc<T, P><<<red.grid, kBlock, 0, ctx.stream>>>(
      dyp, xp, rp, f32(x.save_mean), f32(r.save_mean), gs, red.per_split, acc);
  DLPROBE_CUDA_CHECK_LAUNCH();
  const PairGradsOut out{{f32(x.save_invstd), f32_out(x.dgamma), f32_out(x.dbeta)},
                         {f32(r.save_invstd), f32_out(r.dgamma), f32_out(r.dbeta)},
                         channels};
  finalize_partials<<<finalize_grid(2 * channels), kBlock, 0, ctx.stream>>>(acc, 2 * channels,
                                                                            red.splits, out);
  DLPROBE_CUDA_CHECK_LAUNCH();
  const float inv_count = 1.0F / static_cast<float>(d.dim(0) * d.dim(2) * d.dim(3));
  auto line_of = [&](const Backend::BatchNormGrads& b) {
    return GradChannels{f32(b.gamma),  nullptr,      f32(b.save_mean), f32(b.save_invstd),
                        f32(b.dgamma), f32(b.dbeta), inv_count};
  };
  auto* kernel = dx_add_nhwc<T, P>;
  DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(kernel));
  kernel<<<nhwc_grid(ctx, d, P, per_sm), kBlock, 0, ctx.stream>>>(
      dyp, xp, rp, static_cast<T*>(x.dx.data), static_cast<T*>(r.dx.data), nhwc_of(d, P),
      line_of(x), line_of(r));
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

// The backward's three launches over NHWC: the sums of g and g * (x - mean) split over the rows,
// their merge into dgamma and dbeta, then the dx pass. `rows` is what the kernels step over as
// NHWC rows of x's channels: x itself, or the stem pool's cells; `dy` says where g comes from.
template <int P, class Src, class T, class... SumsParams, class... DxParams>
Status backward_passes_nhwc(const KernelContext& ctx, const TensorDesc& rows,
                            void (*sums)(SumsParams...), void (*dx_kernel)(DxParams...),
                            const Src& dy, const T* x, T* dx, const ReluChannels& relu,
                            const GradChannels& ch, const GradsOut& out, std::string_view op) {
  const int channels = static_cast<int>(rows.dim(1));
  DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(sums));
  DLPROBE_ASSIGN_OR_RETURN(const Partials<GradSums> partial,
                           partials<GradSums>(ctx, rows, P, per_sm, op));
  const Reduction& red = partial.red;
  GradSums* acc = partial.acc();
  sums<<<red.grid, kBlock, 0, ctx.stream>>>(dy, x, relu, reduction_nhwc_of(rows, P), red.per_split,
                                            acc);
  DLPROBE_CUDA_CHECK_LAUNCH();
  finalize_partials<<<finalize_grid(channels), kBlock, 0, ctx.stream>>>(acc, channels, red.splits,
                                                                        out);
  DLPROBE_CUDA_CHECK_LAUNCH();
  DLPROBE_ASSIGN_OR_RETURN(const int dx_per_sm, blocks_per_sm(dx_kernel));
  dx_kernel<<<nhwc_grid(ctx, rows, P, dx_per_sm), kBlock, 0, ctx.stream>>>(dy, x, dx,
                                                                           nhwc_of(rows, P), ch);
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

Status launch_batch_norm_backward(const KernelContext& ctx, const TensorView& dy,
                                  const TensorView* relu_beta, const TensorView& x,
                                  const TensorView& gamma, const TensorView& save_mean,
                                  const TensorView& save_invstd, const TensorView& dx,
                                  const TensorView& dgamma, const TensorView& dbeta) {
  constexpr std::string_view op = "batch_norm_backward";
  const TensorDesc& d = x.desc;
  const int channels = static_cast<int>(d.dim(1));
  const auto count = static_cast<float>(d.dim(0) * d.dim(2) * d.dim(3));
  return dispatch(op, d, {dy.data, x.data, dx.data}, [&]<class T, int P>() -> Status {
    const auto* dyp = static_cast<const T*>(dy.data);
    const auto* xp = static_cast<const T*>(x.data);
    auto* dxp = static_cast<T*>(dx.data);
    const float* mean = f32(save_mean);
    const Nhwc gs = reduction_nhwc_of(d, P);  // the one-launch kernels' blocks
    const Nchw gc = nchw_of(d);
    const bool nhwc = d.layout() == Layout::nhwc;
    const std::int64_t packs = d.numel() / P;
    const float* beta = relu_beta != nullptr ? f32(*relu_beta) : nullptr;
    const ReluChannels relu{mean, f32(save_invstd), f32(gamma), beta};
    const GradChannels ch{f32(gamma),  beta,       mean,        f32(save_invstd),
                          f32(dgamma), f32(dbeta), 1.0F / count};
    const GradsOut out{f32(save_invstd), f32_out(dgamma), f32_out(dbeta)};
    // The two passes, with the ReLU's mask fused in or not.
    auto passes = [&](auto relu_tag) -> Status {
      constexpr bool kRelu = decltype(relu_tag)::value;
      if constexpr (P == kPack<T>) {
        if (nhwc) {
          DLPROBE_ASSIGN_OR_RETURN(
              const bool done,
              (launch_resident<GradSums, 4, 8>(ctx, gs, op, resident_backward_nhwc<T, P, 4, kRelu>,
                                               resident_backward_nhwc<T, P, 8, kRelu>, dyp, xp, dxp,
                                               gs, relu, ch.inv_count, out)));
          if (done) return Status::ok();
        }
      }
      if (nhwc) {
        using Grad = StoredGrad<T, P>;
        return backward_passes_nhwc<P>(ctx, d, grad_sums_nhwc<T, P, kRelu, Grad>,
                                       dx_nhwc<T, P, kRelu, Grad>, Grad{dyp}, xp, dxp, relu, ch,
                                       out, op);
      }
      DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(grad_sums_nchw<T, P, kRelu>));
      DLPROBE_ASSIGN_OR_RETURN(const Partials<GradSums> partial,
                               partials<GradSums>(ctx, d, P, per_sm, op));
      const Reduction& red = partial.red;
      GradSums* acc = partial.acc();
      grad_sums_nchw<T, P, kRelu>
          <<<red.grid, kBlock, 0, ctx.stream>>>(dyp, xp, relu, gc, red.per_split, acc);
      DLPROBE_CUDA_CHECK_LAUNCH();
      finalize_partials<<<finalize_grid(channels), kBlock, 0, ctx.stream>>>(acc, channels,
                                                                            red.splits, out);
      DLPROBE_CUDA_CHECK_LAUNCH();
      dx_nchw<T, P, kRelu>
          <<<nchw_grid(ctx, d, P), kBlock, 0, ctx.stream>>>(dyp, xp, dxp, gc, packs, ch);
      DLPROBE_CUDA_CHECK_LAUNCH();
      return Status::ok();
    };
    if (beta != nullptr) return passes(std::true_type{});
    return passes(std::false_type{});
  });
}

Status launch_batch_norm_relu_backward_from_pool(
    const KernelContext& ctx, const TensorView& dy, const PoolPositions& where,
    const MaxPool2dParams& p, const TensorView& x, const TensorView& gamma, const TensorView& beta,
    const TensorView& save_mean, const TensorView& save_invstd, const TensorView& dx,
    const TensorView& dgamma, const TensorView& dbeta) {
  constexpr std::string_view op = "batch_norm_relu_backward_from_pool";
  const TensorDesc& d = x.desc;
  const void* positions = where.bytes != nullptr ? where.bytes : where.values;
  if (d.layout() != Layout::nhwc || !packable(d, {dy.data, x.data, dx.data, positions})) {
    return error(Errc::unsupported,
                 std::string(op) + ": " + d.str() + " is not NHWC in 16-byte channel packs");
  }
  const auto count = static_cast<float>(d.dim(0) * d.dim(2) * d.dim(3));
  DLPROBE_RETURN_IF_ERROR(check_size(d, op));
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    constexpr int P = kPack<T>;
    const float* mean = f32(save_mean);
    const ReluChannels relu{mean, f32(save_invstd), f32(gamma), f32(beta)};
    const GradChannels ch{f32(gamma),  f32(beta),  mean,        f32(save_invstd),
                          f32(dgamma), f32(dbeta), 1.0F / count};
    const GradsOut out{f32(save_invstd), f32_out(dgamma), f32_out(dbeta)};
    const pool::PoolGeom g = pool::geom_of(d, dy.desc, p);
    const auto* dyp = static_cast<const T*>(dy.data);
    const auto* xp = static_cast<const T*>(x.data);
    auto* dxp = static_cast<T*>(dx.data);
    // The passes for each way the positions come and each pool geometry.
    auto passes = [&](const auto* at) -> Status {
      using Pos = std::remove_cv_t<std::remove_pointer_t<decltype(at)>>;
      if (pool::is_stem_pool(g)) {
        const pool::StemCells cells = pool::stem_cells(g);
        DLPROBE_ASSIGN_OR_RETURN(const TensorDesc cell_rows,
                                 TensorDesc::make({d.dim(0), d.dim(1), cells.rows, cells.cols},
                                                  d.dtype(), Layout::nhwc));
        return backward_passes_nhwc<kCellPack<T>>(
            ctx, cell_rows, grad_sums_stem_nhwc<T, kCellPack<T>, Pos>,
            dx_stem_nhwc<T, kCellPack<T>, Pos>, StemPool<T, Pos>{dyp, at, g, cells}, xp, dxp, relu,
            ch, out, op);
      }
      using Grad = PooledGrad<T, P, Pos>;
      return backward_passes_nhwc<P>(ctx, d, grad_sums_nhwc<T, P, true, Grad>,
                                     dx_nhwc<T, P, true, Grad>, Grad{dyp, at, g}, xp, dxp, relu, ch,
                                     out, op);
    };
    if (where.bytes != nullptr) return passes(where.bytes);
    return passes(static_cast<const T*>(where.values));
  });
}

Status launch_batch_norm_add_backward(const KernelContext& ctx, const TensorView& dy,
                                      const Backend::BatchNormGrads& x,
                                      const Backend::BatchNormGrads& r) {
  constexpr std::string_view op = "batch_norm_add_backward";
  const TensorDesc& d = x.x.desc;
  auto each = [&]() -> Status {
    for (const Backend::BatchNormGrads* b : {&x, &r}) {
      DLPROBE_RETURN_IF_ERROR(launch_batch_norm_backward(ctx, dy, nullptr, b->x, b->gamma,
                                                         b->save_mean, b->save_invstd, b->dx,
                                                         b->dgamma, b->dbeta));
    }
    return Status::ok();
  };
  if (d.layout() != Layout::nhwc) return each();
  return dispatch(op, d, {dy.data, x.x.data, r.x.data, x.dx.data, r.dx.data},
                  [&]<class T, int P>() -> Status {
                    if constexpr (P != kPack<T>) {
                      return each();
                    } else {
                      return add_backward_passes<T, P>(ctx, dy, x, r, each);
                    }
                  });
}

Status launch_channel_sums(const KernelContext& ctx, const TensorView& y, const TensorView& sum,
                           const TensorView& sqsum) {
  constexpr std::string_view op = "channel_sums";
  const TensorDesc& d = y.desc;
  if (d.layout() != Layout::nhwc) {
    return error(Errc::unsupported, std::string(op) + ": NHWC only, not " + d.str());
  }
  const int channels = static_cast<int>(d.dim(1));
  const SumsOut out{f32_out(sum), f32_out(sqsum)};
  return dispatch(op, d, {y.data}, [&]<class T, int P>() -> Status {
    const auto* yp = static_cast<const T*>(y.data);
    const Nhwc g = reduction_nhwc_of(d, P);
    DLPROBE_ASSIGN_OR_RETURN(const int per_sm, blocks_per_sm(channel_sums_nhwc<T, P, true>));
    DLPROBE_ASSIGN_OR_RETURN(const Partials<Sums> partial, partials<Sums>(ctx, d, P, per_sm, op));
    const Reduction& red = partial.red;
    // One launch where the device takes cooperative launches and the split fits the GPU at once
    // (reduction_for's grid may pass it by a tile's worth of blocks); else the merge in a second.
    DLPROBE_ASSIGN_OR_RETURN(const std::int64_t resident,
                             resident_blocks(ctx, channel_sums_nhwc<T, P, true>));
    if (static_cast<std::int64_t>(red.grid.x) * red.grid.y <= resident) {
      return launch_cooperative(ctx, red.grid, channel_sums_nhwc<T, P, true>, yp, g, red.per_split,
                                partial.acc(), out);
    }
    channel_sums_nhwc<T, P, false>
        <<<red.grid, kBlock, 0, ctx.stream>>>(yp, g, red.per_split, partial.acc(), out);
    DLPROBE_CUDA_CHECK_LAUNCH();
    finalize_partials<<<finalize_grid(channels), kBlock, 0, ctx.stream>>>(partial.acc(), channels,
                                                                          red.splits, out);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace dlprobe::cuda
