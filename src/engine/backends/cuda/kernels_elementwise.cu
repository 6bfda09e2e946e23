// Elementwise kernels (fill, cast, ReLU, add), global average pooling and the bias-gradient column
// sum. Arithmetic is in fp32 whatever the storage type: for one add or compare, fp32 then one
// rounding to fp16/bf16 gives the correctly rounded result (fp32 has more than twice their
// precision), which is also what PyTorch computes.
#include "cuda_common.cuh"

namespace dlprobe::cuda {
namespace {

// Elements per pack for a map over these types: the widest 16-byte access of any of them.
template <class Ty, class Ta, class Tb>
inline constexpr int kMapPack = 16 /
                                static_cast<int>(std::max({sizeof(Ty), sizeof(Ta), sizeof(Tb)}));

// y[i] = op(a[i]), op(a[i], b[i]) or op(a[i], b[i], c[i]) (kArity 1, 2, 3) over n elements; `vec`
// when every pointer is aligned for packs of P, so the bulk moves P elements per access. `y` may
// alias an input: each element is read before the same thread writes it.
template <int kArity, int P, class Ty, class Ta, class Tb, class Op>
__global__ void map_kernel(Ty* y, const Ta* a, const Tb* b, const Tb* c, std::int64_t n, bool vec,
                           Op op) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vec) {
    const std::int64_t packs = n / P;
    for (std::int64_t q = first; q < packs; q += stride) {
      float va[P];
      float vy[P];
      load_pack(a + q * P, va);
      if constexpr (kArity == 1) {
#pragma unroll
        for (int k = 0; k < P; ++k) vy[k] = op(va[k]);
      } else if constexpr (kArity == 2) {
        float vb[P];
        load_pack(b + q * P, vb);
#pragma unroll
        for (int k = 0; k < P; ++k) vy[k] = op(va[k], vb[k]);
      } else {
        float vb[P];
        float vc[P];
        load_pack(b + q * P, vb);
        load_pack(c + q * P, vc);
#pragma unroll
        for (int k = 0; k < P; ++k) vy[k] = op(va[k], vb[k], vc[k]);
      }
      store_pack(y + q * P, vy);
    }
    done = packs * P;
  }
  for (std::int64_t i = done + first; i < n; i += stride) {
    if constexpr (kArity == 1) {
      y[i] = from_float<Ty>(op(to_float(a[i])));
    } else if constexpr (kArity == 2) {
      y[i] = from_float<Ty>(op(to_float(a[i]), to_float(b[i])));
    } else {
      y[i] = from_float<Ty>(op(to_float(a[i]), to_float(b[i]), to_float(c[i])));
    }
  }
}

template <int kArity, class Ty, class Ta, class Tb, class Op>
Status launch_map(const KernelContext& ctx, Ty* y, const Ta* a, const Tb* b, std::int64_t n, Op op,
                  const Tb* c = nullptr) {
  constexpr int P = kMapPack<Ty, Ta, Tb>;
  auto aligned = [](const void* p, std::size_t size) {
    return reinterpret_cast<std::uintptr_t>(p) % (P * size) == 0;
  };
  bool vec = aligned(y, sizeof(Ty)) && aligned(a, sizeof(Ta));
  if constexpr (kArity >= 2) vec = vec && aligned(b, sizeof(Tb));
  if constexpr (kArity == 3) vec = vec && aligned(c, sizeof(Tb));
  const std::int64_t work = vec ? std::max<std::int64_t>(n / P, 1) : n;
  map_kernel<kArity, P>
      <<<grid_for(work, ctx.sm_count), kBlock, 0, ctx.stream>>>(y, a, b, c, n, vec, op);
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

// An elementwise op whose operands all have the dtype of `a`, the first input: y = op(a, b, c),
// with b and c (untyped data pointers) as far as kArity goes.
template <int kArity, class Op>
Status launch_map_one_dtype(const KernelContext& ctx, Op op, const TensorView& y,
                            const TensorView& a, const void* b = nullptr, const void* c = nullptr) {
  return dispatch_floating(a.desc.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_map<kArity>(ctx, static_cast<T*>(y.data), static_cast<const T*>(a.data),
                              static_cast<const T*>(b), a.desc.numel(), op,
                              static_cast<const T*>(c));
  });
}

template <class T>
__global__ void fill_kernel(T* y, std::int64_t n, T value) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = value;
  }
}

template <class T>
Status fill_typed(const KernelContext& ctx, void* data, std::int64_t n, T value) {
  fill_kernel<<<grid_for(n, ctx.sm_count), kBlock, 0, ctx.stream>>>(static_cast<T*>(data), n,
                                                                    value);
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

struct Identity {
  __device__ float operator()(float v) const { return v; }
};
struct Relu {
  // `v < 0 ? 0 : v` lets NaN through, as torch.relu does.
  __device__ float operator()(float v) const { return v < 0.0F ? 0.0F : v; }
};
struct ReluBackward {
  __device__ float operator()(float dy, float y) const { return y > 0.0F ? dy : 0.0F; }
};
// The sum of two gradient terms a + b, masked by the ReLU's output y (arguments a, y, b).
struct ReluBackwardAdd {
  __device__ float operator()(float a, float y, float b) const { return y > 0.0F ? a + b : 0.0F; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// One warp per (n, c) row of H*W contiguous elements (NCHW).
template <class T>
__global__ void gap_forward_nchw(const T* x, T* y, std::int64_t rows, std::int64_t area) {
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       row < rows; row += warps) {
    const T* src = x + row * area;
    float sum = 0.0F;
    for (std::int64_t s = lane; s < area; s += 32) sum += to_float(src[s]);
    sum = warp_sum(sum);
    if (lane == 0) y[row] = from_float<T>(sum / static_cast<float>(area));
  }
}

// One thread per (n, c), channels fastest, so neighbouring threads read neighbouring elements
// (NHWC).
template <class T>
__global__ void gap_forward_nhwc(const T* x, T* y, std::int64_t batch, std::int64_t channels,
                                 std::int64_t area) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < batch * channels; i += stride) {
    const std::int64_t n = i / channels;
    const std::int64_t c = i % channels;
    const T* src = x + n * area * channels + c;
    float sum = 0.0F;
    for (std::int64_t s = 0; s < area; ++s) sum += to_float(src[s * channels]);
    y[i] = from_float<T>(sum / static_cast<float>(area));
  }
}

template <class T>
__global__ void gap_backward(const T* dy, T* dx, std::int64_t channels, std::int64_t area,
                             std::int64_t total, bool nhwc) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t row = nhwc ? (i / (area * channels)) * channels + i % channels : i / area;
    dx[i] = from_float<T>(to_float(dy[row]) / static_cast<float>(area));
  }
}

// NHWC in packs of P channels: a pack of dx takes the pack of dy at its image and channels. The
// element-wise kernel above took 90 us for ResNet-50's 51 MB at fp16 batch 256 on an H200 (Nsight
// Compute, 2026-12-05): two 64-bit divisions and a two-byte store an element.
template <class T, int P>
__global__ void gap_backward_nhwc(const T* dy, T* dx, std::int64_t packs, std::int64_t area,
                                  std::int64_t total_packs) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       q < total_packs; q += stride) {
    const std::int64_t image = q / (area * packs);
    float v[P];
    load_pack(dy + (image * packs + q % packs) * P, v);
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] /= static_cast<float>(area);
    store_pack(dx + q * P, v);
  }
}

// One thread per element of dst (rows of dst_c channels).
template <class T>
__global__ void copy_channels(const T* src, T* dst, std::int64_t rows, int src_c, int dst_c) {
  const std::int64_t n = rows * dst_c;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t r = i / dst_c;
    const auto c = static_cast<int>(i - r * dst_c);
    dst[i] = c < src_c ? src[r * src_c + c] : from_float<T>(0.0F);
  }
}

// Rows of src_c <= 4 channels into rows of four, the rest zero (the stem's images padded for
// cuDNN's four-channel engines): a thread a row, one 4-element store. The element-wise kernel
// above, a 64-bit division and a two-byte store an element, ran at 1.4 TB/s on ResNet-50's
// images at fp16 batch 256 on an H200 (Nsight Compute, 2026-12-05).
template <class T>
__global__ void pad_rows_to_four(const T* src, T* dst, std::int64_t rows, int src_c) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride) {
    Pack<T, 4> row;
#pragma unroll
    for (int c = 0; c < 4; ++c) row.v[c] = c < src_c ? src[r * src_c + c] : from_float<T>(0.0F);
    *reinterpret_cast<Pack<T, 4>*>(dst + r * 4) = row;
  }
}

// The stem as a 4x4 convolution over 16 channels (see launch_stem_to_depth): channel q of a
// depth pixel is (row parity, column parity, image channel), q = (2 * bh + bw) * 4 + c.
constexpr int kDepthChannels = static_cast<int>(kStemDepthChannels);
static_assert(kDepthChannels == 2 * 2 * 4, "a 2x2 patch of up to four channels");

// xd[n, u, v, q] = x[n, 2u - 4 + bh, 2v - 4 + bw, c], zero outside the image and past its
// channels: a thread a depth pixel, two 8-element stores.
template <class T>
__global__ void stem_to_depth(const T* x, T* xd, std::int64_t pixels, int h, int w, int c_in,
                              int u_size, int v_size) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < pixels; i += stride) {
    const auto v = static_cast<int>(i % v_size);
    const auto u = static_cast<int>((i / v_size) % u_size);
    const std::int64_t n = i / (static_cast<std::int64_t>(v_size) * u_size);
    Pack<T, 8> half[2];
#pragma unroll
    for (int q = 0; q < kDepthChannels; ++q) {
      const int row = 2 * u - 4 + (q >> 3);
      const int col = 2 * v - 4 + ((q >> 2) & 1);
      const int c = q & 3;
      half[q >> 3].v[q & 7] = c < c_in && row >= 0 && row < h && col >= 0 && col < w
                                  ? x[((n * h + row) * w + col) * c_in + c]
                                  : from_float<T>(0.0F);
    }
    auto* out = reinterpret_cast<Pack<T, 8>*>(xd + i * kDepthChannels);
    out[0] = half[0];
    out[1] = half[1];
  }
}

// The stem's weights to depth and their gradient back, a thread an element of `to`:
// - to depth, wd[k, a, b, q] = w[k, 2a + bh - 1, 2b + bw - 1, c] (NHWC weights [K, 7, 7, C]), zero
//   where the 8x8 window the 4x4 one covers reaches past the 7x7 kernel or past C;
// - back, dw[k, r, s, c] = dwd[k, (r + 1) / 2, (s + 1) / 2, q]: each weight's gradient is the one
//   of the depth weight that holds it.
template <class T, bool kToDepth>
__global__ void stem_weights(const T* from, T* to, std::int64_t n, int c_in) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if constexpr (kToDepth) {
      const auto q = static_cast<int>(i % kDepthChannels);
      const auto b = static_cast<int>((i / kDepthChannels) % 4);
      const auto a = static_cast<int>((i / (4 * kDepthChannels)) % 4);
      const std::int64_t k = i / (16 * kDepthChannels);
      const int r = 2 * a + (q >> 3) - 1;
      const int s = 2 * b + ((q >> 2) & 1) - 1;
      const int c = q & 3;
      to[i] = c < c_in && r >= 0 && s >= 0 ? from[((k * 7 + r) * 7 + s) * c_in + c]
                                           : from_float<T>(0.0F);
    } else {
      const auto c = static_cast<int>(i % c_in);
      const auto s = static_cast<int>((i / c_in) % 7);
      const auto r = static_cast<int>((i / (7 * c_in)) % 7);
      const std::int64_t k = i / (49 * c_in);
      const int q = (((r + 1) & 1) * 2 + ((s + 1) & 1)) * 4 + c;
      to[i] = from[((k * 4 + (r + 1) / 2) * 4 + (s + 1) / 2) * kDepthChannels + q];
    }
  }
}

// y = relu(x * scale + bias), scale and bias per channel (scale_bias_relu_packs).
template <class T, class S, int P>
__global__ void scale_bias_relu_nhwc(const T* x, const S* scale, const S* bias, T* y,
                                     std::int64_t packs, int channel_packs) {
  scale_bias_relu_packs<P>(
      x, y, packs, channel_packs, [&](int c) { return to_float(scale[c]); },
      [&](int c) { return to_float(bias[c]); });
}

template <class T>
__global__ void column_sum_kernel(const T* dy, T* db, std::int64_t rows, std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < cols;
       o += stride) {
    float sum = 0.0F;
    for (std::int64_t n = 0; n < rows; ++n) sum += to_float(dy[n * cols + o]);
    db[o] = from_float<T>(sum);
  }
}

}  // namespace

Status launch_fill(const KernelContext& ctx, const TensorView& t, double value) {
  const std::int64_t n = t.desc.numel();
  switch (t.desc.dtype()) {
    case DType::fp64:
      return fill_typed(ctx, t.data, n, value);
    case DType::int32:
      return fill_typed(ctx, t.data, n, static_cast<std::int32_t>(value));
    case DType::int64:
      return fill_typed(ctx, t.data, n, static_cast<std::int64_t>(value));
    default:
      break;
  }
  // Through fp32, as the host tensors convert fp64 to fp16/bf16.
  const auto f = static_cast<float>(value);
  return dispatch_floating(t.desc.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T converted;
    if constexpr (std::is_same_v<T, float>) {
      converted = f;
    } else if constexpr (std::is_same_v<T, __half>) {
      converted = __float2half_rn(f);
    } else {
      converted = __float2bfloat16_rn(f);
    }
    return fill_typed(ctx, t.data, n, converted);
  });
}

// Up to kCastsPerLaunch (src, dst, numel) triples and the blocks of each: 96 * 24 bytes, 97 block
// offsets and the count (2,696 bytes), within the 4 KiB of kernel parameters every CUDA version
// takes.
struct CastTable {
  const void* src[kCastsPerLaunch];
  void* dst[kCastsPerLaunch];
  std::int64_t numel[kCastsPerLaunch];
  // Pair k has the blocks [first_block[k], first_block[k + 1]).
  int first_block[kCastsPerLaunch + 1];
  int count;
};

// Elements a thread moves at most per pass of its pair, in packs: a pair has blocks in proportion
// to its size, about this many elements a thread.
constexpr int kCastElementsPerThread = 16;

// A one-dimensional grid over every pair: a block finds its pair by binary search in first_block,
// then its threads stride over the pair in packs of P wherever both pointers allow it. (The grid
// it replaced gave every pair as many blocks as the largest needed and moved one element per
// access.) Nsight Compute times ResNet-50's fp16 weight cast (55 tensors, 25.5 M elements) at
// 38.7 us on an H200, 75 % of the DRAM bandwidth.
template <int P, class Tin, class Tout>
__global__ void cast_many_kernel(CastTable t) {
  const int block = static_cast<int>(blockIdx.x);
  int lo = 0;
  int hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const auto* src = static_cast<const Tin*>(t.src[lo]);
  auto* dst = static_cast<Tout*>(t.dst[lo]);
  const std::int64_t n = t.numel[lo];
  const std::int64_t stride =
      static_cast<std::int64_t>(t.first_block[lo + 1] - t.first_block[lo]) * blockDim.x;
  const std::int64_t first =
      static_cast<std::int64_t>(block - t.first_block[lo]) * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (reinterpret_cast<std::uintptr_t>(src) % (P * sizeof(Tin)) == 0 &&
      reinterpret_cast<std::uintptr_t>(dst) % (P * sizeof(Tout)) == 0) {
    const std::int64_t packs = n / P;
    for (std::int64_t q = first; q < packs; q += stride) {
      float v[P];
      load_pack<Tin, P>(src + q * P, v);
      store_pack<Tout, P>(dst + q * P, v);
    }
    done = packs * P;
  }
  for (std::int64_t i = done + first; i < n; i += stride) {
    dst[i] = from_float<Tout>(to_float(src[i]));
  }
}

Status launch_cast_many(const KernelContext& ctx, std::span<const TensorView> src,
                        std::span<const TensorView> dst) {
  if (src.empty()) return Status::ok();
  return dispatch_floating(src[0].desc.dtype(), [&](auto in) {
    using Tin = typename decltype(in)::type;
    return dispatch_floating(dst[0].desc.dtype(), [&](auto out) -> Status {
      using Tout = typename decltype(out)::type;
      constexpr int P = kMapPack<Tout, Tin, Tin>;
      constexpr int kThreads = 256;
      for (std::size_t first = 0; first < src.size(); first += kCastsPerLaunch) {
        const std::size_t count = std::min(kCastsPerLaunch, src.size() - first);
        CastTable t{};
        t.count = static_cast<int>(count);
        int blocks = 0;
        for (std::size_t k = 0; k < count; ++k) {
          t.src[k] = src[first + k].data;
          t.dst[k] = dst[first + k].data;
          t.numel[k] = src[first + k].desc.numel();
          t.first_block[k] = blocks;
          // At least one block, so that every pair's range is non-empty for the search.
          constexpr std::int64_t kPerBlock = std::int64_t{kThreads} * kCastElementsPerThread;
          blocks += static_cast<int>(
              std::clamp<std::int64_t>((t.numel[k] + kPerBlock - 1) / kPerBlock, 1, 1 << 16));
        }
        t.first_block[count] = blocks;
        cast_many_kernel<P, Tin, Tout>
            <<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(t);
        DLPROBE_CUDA_CHECK_LAUNCH();
      }
      return Status::ok();
    });
  });
}

Status launch_cast(const KernelContext& ctx, const TensorView& src, const TensorView& dst) {
  return dispatch_floating(src.desc.dtype(), [&](auto in) {
    using Tin = typename decltype(in)::type;
    return dispatch_floating(dst.desc.dtype(), [&](auto out) {
      using Tout = typename decltype(out)::type;
      return launch_map<1>(ctx, static_cast<Tout*>(dst.data), static_cast<const Tin*>(src.data),
                           static_cast<const Tin*>(nullptr), src.desc.numel(), Identity{});
    });
  });
}

Status launch_relu_forward(const KernelContext& ctx, const TensorView& x, const TensorView& y) {
  return launch_map_one_dtype<1>(ctx, Relu{}, y, x);
}

Status launch_relu_backward(const KernelContext& ctx, const TensorView& dy, const TensorView& y,
                            const TensorView& dx) {
  return launch_map_one_dtype<2>(ctx, ReluBackward{}, dx, dy, y.data);
}

Status launch_relu_backward_add(const KernelContext& ctx, const TensorView& a, const TensorView& b,
                                const TensorView& y, const TensorView& dx) {
  return launch_map_one_dtype<3>(ctx, ReluBackwardAdd{}, dx, a, y.data, b.data);
}

Status launch_add(const KernelContext& ctx, const TensorView& a, const TensorView& b,
                  const TensorView& y) {
  return launch_map_one_dtype<2>(ctx, Add{}, y, a, b.data);
}

Status launch_copy_channels(const KernelContext& ctx, const TensorView& src,
                            const TensorView& dst) {
  const std::int64_t rows = dst.desc.numel() / dst.desc.dim(1);
  const auto src_c = static_cast<int>(src.desc.dim(1));
  const auto dst_c = static_cast<int>(dst.desc.dim(1));
  return dispatch_floating(dst.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const auto* sp = static_cast<const T*>(src.data);
    auto* dp = static_cast<T*>(dst.data);
    if (dst_c == 4 && src_c <= 4 &&
        reinterpret_cast<std::uintptr_t>(dp) % sizeof(Pack<T, 4>) == 0) {
      pad_rows_to_four<<<grid_for(rows, ctx.sm_count), kBlock, 0, ctx.stream>>>(sp, dp, rows,
                                                                                src_c);
    } else {
      copy_channels<<<grid_for(dst.desc.numel(), ctx.sm_count), kBlock, 0, ctx.stream>>>(
          sp, dp, rows, src_c, dst_c);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_stem_to_depth(const KernelContext& ctx, const TensorView& x, const TensorView& xd) {
  const TensorDesc& d = xd.desc;
  const std::int64_t pixels = d.dim(0) * d.dim(2) * d.dim(3);
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    stem_to_depth<<<grid_for(pixels, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(x.data), static_cast<T*>(xd.data), pixels,
        static_cast<int>(x.desc.dim(2)), static_cast<int>(x.desc.dim(3)),
        static_cast<int>(x.desc.dim(1)), static_cast<int>(d.dim(2)), static_cast<int>(d.dim(3)));
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

namespace {

template <bool kToDepth>
Status launch_stem_weights(const KernelContext& ctx, const TensorView& from, const TensorView& to,
                           int c_in) {
  const std::int64_t n = to.desc.numel();
  return dispatch_floating(to.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    stem_weights<T, kToDepth><<<grid_for(n, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(from.data), static_cast<T*>(to.data), n, c_in);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace

Status launch_stem_weights_to_depth(const KernelContext& ctx, const TensorView& w,
                                    const TensorView& wd) {
  return launch_stem_weights<true>(ctx, w, wd, static_cast<int>(w.desc.dim(1)));
}

Status launch_stem_weights_from_depth(const KernelContext& ctx, const TensorView& wd,
                                      const TensorView& w) {
  return launch_stem_weights<false>(ctx, wd, w, static_cast<int>(w.desc.dim(1)));
}

Status launch_global_avg_pool_forward(const KernelContext& ctx, const TensorView& x,
                                      const TensorView& y) {
  const TensorDesc& d = x.desc;
  const std::int64_t area = d.dim(2) * d.dim(3);
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const auto* xp = static_cast<const T*>(x.data);
    auto* yp = static_cast<T*>(y.data);
    if (d.layout() == Layout::nchw) {
      const std::int64_t rows = d.dim(0) * d.dim(1);
      gap_forward_nchw<<<grid_for(rows * 32, ctx.sm_count), kBlock, 0, ctx.stream>>>(xp, yp, rows,
                                                                                     area);
    } else {
      gap_forward_nhwc<<<grid_for(d.dim(0) * d.dim(1), ctx.sm_count), kBlock, 0, ctx.stream>>>(
          xp, yp, d.dim(0), d.dim(1), area);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_global_avg_pool_backward(const KernelContext& ctx, const TensorView& dy,
                                       const TensorView& dx) {
  const TensorDesc& d = dx.desc;
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    constexpr int P = kPack<T>;
    const auto* dyp = static_cast<const T*>(dy.data);
    auto* dxp = static_cast<T*>(dx.data);
    const std::int64_t area = d.dim(2) * d.dim(3);
    const auto aligned = [](const void* p) {
      return reinterpret_cast<std::uintptr_t>(p) % sizeof(Pack<T, P>) == 0;
    };
    if (d.layout() == Layout::nhwc && d.dim(1) % P == 0 && aligned(dyp) && aligned(dxp)) {
      const std::int64_t packs = d.numel() / P;
      gap_backward_nhwc<T, P><<<grid_for(packs, ctx.sm_count), kBlock, 0, ctx.stream>>>(
          dyp, dxp, d.dim(1) / P, area, packs);
    } else {
      gap_backward<<<grid_for(d.numel(), ctx.sm_count), kBlock, 0, ctx.stream>>>(
          dyp, dxp, d.dim(1), area, d.numel(), d.layout() == Layout::nhwc);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_column_sum(const KernelContext& ctx, const TensorView& dy, const TensorView& db) {
  return dispatch_floating(dy.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const std::int64_t cols = dy.desc.dim(1);
    column_sum_kernel<<<grid_for(cols, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(dy.data), static_cast<T*>(db.data), dy.desc.dim(0), cols);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_scale_bias_relu(const KernelContext& ctx, const TensorView& x,
                              const TensorView& scale, const TensorView& bias,
                              const TensorView& y) {
  const TensorDesc& d = x.desc;
  if (d.layout() != Layout::nhwc || scale.desc.dtype() != bias.desc.dtype()) {
    return error(Errc::unsupported, "scale_bias_relu: NHWC x, scale and bias of one dtype");
  }
  const std::int64_t channels = d.dim(1);
  return dispatch_floating(d.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    return dispatch_floating(scale.desc.dtype(), [&](auto stag) -> Status {
      using S = typename decltype(stag)::type;
      const auto* xp = static_cast<const T*>(x.data);
      auto* yp = static_cast<T*>(y.data);
      const auto* sp = static_cast<const S*>(scale.data);
      const auto* bp = static_cast<const S*>(bias.data);
      constexpr int P = kPack<T>;
      if (channels % P == 0 && aligned_16({xp, yp})) {
        const std::int64_t packs = d.numel() / P;
        scale_bias_relu_nhwc<T, S, P><<<grid_for(packs, ctx.sm_count), kBlock, 0, ctx.stream>>>(
            xp, sp, bp, yp, packs, static_cast<int>(channels / P));
      } else {
        scale_bias_relu_nhwc<T, S, 1><<<grid_for(d.numel(), ctx.sm_count), kBlock, 0, ctx.stream>>>(
            xp, sp, bp, yp, d.numel(), static_cast<int>(channels));
      }
      DLPROBE_CUDA_CHECK_LAUNCH();
      return Status::ok();
    });
  });
}

}  // namespace dlprobe::cuda
