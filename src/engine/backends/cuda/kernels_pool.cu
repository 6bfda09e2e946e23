// Max pooling. The forward keeps no indices: the backward finds each window's maximum again in x,
// with the same rule as the forward and PyTorch (start below every value, move on a strictly
// greater value or a NaN, so the first maximum wins), then each input element gathers the
// gradients of the windows whose maximum it is (see the backward's two passes below). Where x,
// a batch norm's ReLU output, is never stored, the forward and the backward's first pass compute
// it from the batch norm's input.
#include "cuda_common.cuh"

namespace dlprobe::cuda {
namespace {

// Plane sizes of one max pool: input H x W, output OH x OW, C channels; 32-bit within a plane
// (the host checks that a plane fits), 64-bit plane offsets.
struct PoolGeom {
  int c, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
};

PoolGeom geom_of(const TensorDesc& x, const TensorDesc& y, const MaxPool2dParams& p) {
  return {
      static_cast<int>(x.dim(1)),    static_cast<int>(x.dim(2)),    static_cast<int>(x.dim(3)),
      static_cast<int>(y.dim(2)),    static_cast<int>(y.dim(3)),    static_cast<int>(p.kernel[0]),
      static_cast<int>(p.kernel[1]), static_cast<int>(p.stride[0]), static_cast<int>(p.stride[1]),
      static_cast<int>(p.pad[0]),    static_cast<int>(p.pad[1])};
}

// ResNet's max pool (3x3, stride 2, padding 1), the one every step runs, with its sizes known when
// compiled: the window loops unroll and the backward's divisions become shifts. Both passes of the
// stem's backward ran at about a quarter of the DRAM bandwidth with the sizes read at run time and
// the batch norm's per-channel values loaded again at each window position (Nsight Compute,
// ResNet-50 fp16 bs256 on an H200: 0.63 and 0.65 ms against 0.19 ms for the forward).
bool is_stem_pool(const PoolGeom& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 2 && g.sw == 2 && g.ph == 1 && g.pw == 1;
}
template <bool kStemPool>
__device__ __forceinline__ PoolGeom geometry(PoolGeom g) {
  if constexpr (kStemPool) {
    g.kh = 3;
    g.kw = 3;
    g.sh = 2;
    g.sw = 2;
    g.ph = 1;
    g.pw = 1;
  }
  return g;
}

// Floor division for a possibly negative numerator and a positive divisor.
__device__ __forceinline__ int floor_div(int a, int b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// The maxima of output window (oh, ow) for P channels and where each is in the window (r * kw +
// s for input h0 + r, w0 + s; the first valid position when the window holds only NaN-free -inf).
// `load(h, w, v)` reads the P values at input (h, w).
template <int P, class Load>
__device__ void window_max(const PoolGeom& g, int oh, int ow, Load load, float (&best)[P],
                           int (&at)[P]) {
  const int h0 = oh * g.sh - g.ph;
  const int w0 = ow * g.sw - g.pw;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    best[k] = -INFINITY;
    at[k] = (max(h0, 0) - h0) * g.kw + (max(w0, 0) - w0);
  }
  for (int r = 0; r < g.kh; ++r) {
    const int h = h0 + r;
    if (h < 0 || h >= g.h) continue;
    for (int s = 0; s < g.kw; ++s) {
      const int w = w0 + s;
      if (w < 0 || w >= g.w) continue;
      float v[P];
      load(h, w, v);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        if (v[k] > best[k] || isnan(v[k])) {
          best[k] = v[k];
          at[k] = r * g.kw + s;
        }
      }
    }
  }
}

// The backward runs in two passes. The first finds each window's maximum once and stores where
// it is in the window (one byte: windows have at most 255 positions, the host checks); the second
// has each input element gather the gradients of the windows whose maximum it is, which needs no
// atomics and adds in a fixed order (windows by row, then column). Finding the maxima from each
// input element instead reads every window about four times (3x3, stride 2), measured at 2.2 ms
// for ResNet-50's stem at batch 256 on an H200.
template <int P>
struct alignas(P) BytePack {
  std::uint8_t v[P];
};

// What a window pass stores for P neighbouring outputs at `out`: the maxima into y (the forward),
// or with kWhere their positions in the window into `where`, laid out as y (the backward's first
// pass).
template <bool kWhere, class T, int P>
__device__ void store_window(T* y, std::uint8_t* where, std::int64_t out, const float (&best)[P],
                             const int (&at)[P]) {
  if constexpr (kWhere) {
    BytePack<P> pos;
#pragma unroll
    for (int k = 0; k < P; ++k) pos.v[k] = static_cast<std::uint8_t>(at[k]);
    *reinterpret_cast<BytePack<P>*>(where + out) = pos;
  } else {
    store_pack(y + out, best);
  }
}

// One channel's batch norm as batch_norm_relu_train_forward applied it: its mean, its scale
// invstd * gamma (the same product) and beta, read once per thread.
struct BnChannel {
  float mean = 0, scale = 0, beta = 0;
};
template <bool kFromBn>
__device__ __forceinline__ BnChannel bn_channel(const PoolInputFromBatchNorm& bn, int c) {
  if constexpr (kFromBn) {
    return {bn.mean[c], bn.invstd[c] * bn.gamma[c], bn.beta[c]};
  } else {
    return {};
  }
}

// The value a window pass compares: x as stored, or with kFromBn the max pool's input computed
// again from the batch norm's input x as batch_norm_relu_train_forward wrote it (rounded to T).
template <bool kFromBn, class T>
__device__ __forceinline__ float pool_input(float x, const BnChannel& bn) {
  if constexpr (kFromBn) {
    return to_float(from_float<T>(relu(bn_value(x, bn.mean, bn.scale, bn.beta))));
  } else {
    return x;
  }
}

// A thread's element in an NHWC grid (N * rows, ceil(cols * packs / kBlock)): image n, its row and
// column, and the channel pack pk; false for a thread past the last column.
struct NhwcPlace {
  int n, row, col, pk;
};

__device__ __forceinline__ bool nhwc_place(int rows, int cols, int packs, NhwcPlace& at) {
  at.n = static_cast<int>(blockIdx.x) / rows;
  at.row = static_cast<int>(blockIdx.x) - at.n * rows;
  const int i = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (i >= cols * packs) return false;
  at.col = i / packs;
  at.pk = i - at.col * packs;
  return true;
}

// NHWC, P channels a thread: grid (N * OH, ceil(OW * C/P / kBlock)).
template <class T, int P, bool kWhere, bool kFromBn, bool kStemPool>
__global__ void pool_window_nhwc(const T* x, T* y, std::uint8_t* where, PoolGeom geom,
                                 PoolInputFromBatchNorm from_bn) {
  const PoolGeom g = geometry<kStemPool>(geom);
  NhwcPlace place;
  if (!nhwc_place(g.oh, g.ow, g.c / P, place)) return;
  const int oh = place.row;
  const int ow = place.col;
  const int pk = place.pk;
  const T* plane = x + static_cast<std::int64_t>(place.n) * g.h * g.w * g.c + pk * P;
  BnChannel bn[P];
#pragma unroll
  for (int k = 0; k < P; ++k) bn[k] = bn_channel<kFromBn>(from_bn, pk * P + k);
  float best[P];
  int pos[P];
  window_max<P>(
      g, oh, ow,
      [&](int h, int w, float(&v)[P]) {
        load_pack(plane + (h * g.w + w) * g.c, v);
#pragma unroll
        for (int k = 0; k < P; ++k) v[k] = pool_input<kFromBn, T>(v[k], bn[k]);
      },
      best, pos);
  store_window<kWhere>(y, where, (static_cast<std::int64_t>(blockIdx.x) * g.ow + ow) * g.c + pk * P,
                       best, pos);
}

// NCHW, one element a thread: grid (N * C planes, ceil(OH * OW / kBlock)).
template <class T, bool kWhere, bool kFromBn = false>
__global__ void pool_window_nchw(const T* x, T* y, std::uint8_t* where, PoolGeom g,
                                 PoolInputFromBatchNorm bn = {}) {
  const int i = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (i >= g.oh * g.ow) return;
  const int oh = i / g.ow;
  const int ow = i - oh * g.ow;
  const T* plane = x + static_cast<std::int64_t>(blockIdx.x) * g.h * g.w;
  float best[1];
  int at[1];
  const BnChannel channel =
      bn_channel<kFromBn>(bn, static_cast<int>(blockIdx.x % static_cast<unsigned>(g.c)));
  window_max<1>(
      g, oh, ow,
      [&](int h, int w, float(&v)[1]) {
        v[0] = pool_input<kFromBn, T>(to_float(plane[h * g.w + w]), channel);
      },
      best, at);
  store_window<kWhere>(y, where, static_cast<std::int64_t>(blockIdx.x) * g.oh * g.ow + i, best, at);
}

// The output windows that hold input (h, w): oh with oh*sh - ph <= h <= oh*sh - ph + kh - 1, and
// likewise ow, clipped to the output.
struct Covering {
  int oh0, oh1, ow0, ow1;
};

__device__ Covering covering(const PoolGeom& g, int h, int w) {
  return {max(floor_div(h + g.ph - g.kh, g.sh) + 1, 0), min(floor_div(h + g.ph, g.sh), g.oh - 1),
          max(floor_div(w + g.pw - g.kw, g.sw) + 1, 0), min(floor_div(w + g.pw, g.sw), g.ow - 1)};
}

// Where input (h, w) lies in output window (oh, ow), as window_max numbers the positions.
__device__ __forceinline__ int position_in(const PoolGeom& g, int h, int w, int oh, int ow) {
  return (h - (oh * g.sh - g.ph)) * g.kw + (w - (ow * g.sw - g.pw));
}

// grid (N * H, ceil(W * C/P / kBlock)).
template <class T, int P, bool kStemPool>
__global__ void pool_gather_nhwc(const T* dy, const std::uint8_t* where, T* dx, PoolGeom geom) {
  const PoolGeom g = geometry<kStemPool>(geom);
  NhwcPlace place;
  if (!nhwc_place(g.h, g.w, g.c / P, place)) return;
  const int h = place.row;
  const int w = place.col;
  const int pk = place.pk;
  const std::int64_t out_plane = static_cast<std::int64_t>(place.n) * g.oh * g.ow * g.c + pk * P;
  const Covering cover = covering(g, h, w);
  // The stem's windows (3x3, stride 2) cover an input with at most 2 x 2 of them: a loop of that
  // fixed count unrolls, so that every window's loads are in flight at once, where a loop over the
  // run-time cover waits on each window's in turn. Skipped windows keep the order of the sums.
  const int rows = kStemPool ? 2 : cover.oh1 - cover.oh0 + 1;
  const int cols = kStemPool ? 2 : cover.ow1 - cover.ow0 + 1;
  float sum[P] = {};
#pragma unroll
  for (int i = 0; i < rows; ++i) {
#pragma unroll
    for (int j = 0; j < cols; ++j) {
      const int oh = cover.oh0 + i;
      const int ow = cover.ow0 + j;
      if (oh > cover.oh1 || ow > cover.ow1) continue;
      const int self = position_in(g, h, w, oh, ow);
      const std::int64_t at = out_plane + static_cast<std::int64_t>(oh * g.ow + ow) * g.c;
      const BytePack<P> idx = *reinterpret_cast<const BytePack<P>*>(where + at);
      float d[P];
      load_pack(dy + at, d);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        if (idx.v[k] == self) sum[k] += d[k];
      }
    }
  }
  store_pack(dx + (static_cast<std::int64_t>(blockIdx.x) * g.w + w) * g.c + pk * P, sum);
}

// grid (N * C planes, ceil(H * W / kBlock)).
template <class T>
__global__ void pool_gather_nchw(const T* dy, const std::uint8_t* where, T* dx, PoolGeom g) {
  const int i = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (i >= g.h * g.w) return;
  const int h = i / g.w;
  const int w = i - h * g.w;
  const std::int64_t out_plane = static_cast<std::int64_t>(blockIdx.x) * g.oh * g.ow;
  const Covering cover = covering(g, h, w);
  float sum = 0.0F;
  for (int oh = cover.oh0; oh <= cover.oh1; ++oh) {
    for (int ow = cover.ow0; ow <= cover.ow1; ++ow) {
      const std::int64_t at = out_plane + oh * g.ow + ow;
      if (where[at] == position_in(g, h, w, oh, ow)) sum += to_float(dy[at]);
    }
  }
  dx[static_cast<std::int64_t>(blockIdx.x) * g.h * g.w + i] = from_float<T>(sum);
}

// A plane's positions (times channels in NHWC) are indexed with 32 bits, and the grid's x
// dimension counts planes or image rows.
Status check_pool_size(const TensorDesc& d, std::string_view op) {
  const std::int64_t plane = d.dim(1) * d.dim(2) * d.dim(3);
  if (plane < (std::int64_t{1} << 31) && d.dim(0) * d.dim(1) * d.dim(2) < (std::int64_t{1} << 31)) {
    return Status::ok();
  }
  return error(Errc::unsupported,
               std::string(op) + ": " + d.str() + " is larger than the CUDA pooling kernels index");
}

bool pool_packable(const TensorDesc& d, std::initializer_list<const void*> pointers) {
  const std::int64_t pack = 16 / static_cast<std::int64_t>(dtype_size(d.dtype()));
  bool ok = d.dim(1) % pack == 0;
  for (const void* p : pointers) ok = ok && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  return ok;
}

unsigned blocks_for(std::int64_t items, int block = kBlock) {
  return static_cast<unsigned>((items + block - 1) / block);
}

// The block size of a grid whose rows hold `items` threads each: half a block where that divides a
// row and a whole one does not, so that no block is left part idle at each row's end (the stem's
// gather: 896 threads a row, which blocks of 256 leave an eighth idle).
int row_block(std::int64_t items) {
  return items % kBlock != 0 && items % (kBlock / 2) == 0 ? kBlock / 2 : kBlock;
}

}  // namespace

Status launch_max_pool2d_forward(const KernelContext& ctx, const TensorView& x, const TensorView& y,
                                 const MaxPool2dParams& p, const PoolInputFromBatchNorm* from_bn) {
  DLPROBE_RETURN_IF_ERROR(check_pool_size(x.desc, "max_pool2d_forward"));
  const PoolGeom g = geom_of(x.desc, y.desc, p);
  const bool nhwc = x.desc.layout() == Layout::nhwc;
  const bool wide = nhwc && pool_packable(x.desc, {x.data, y.data});
  return dispatch_floating(x.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const auto* xp = static_cast<const T*>(x.data);
    auto* yp = static_cast<T*>(y.data);
    const auto planes = static_cast<unsigned>(x.desc.dim(0) * (nhwc ? g.oh : g.c));
    const PoolInputFromBatchNorm bn = from_bn != nullptr ? *from_bn : PoolInputFromBatchNorm{};
    const auto forward_nhwc = [&](auto pack_tag, auto stem_tag) {
      constexpr int P = decltype(pack_tag)::value;
      constexpr bool kStemPool = decltype(stem_tag)::value;
      const dim3 grid(planes, blocks_for(std::int64_t{g.ow} * g.c / P));
      if (from_bn != nullptr) {
        pool_window_nhwc<T, P, false, true, kStemPool>
            <<<grid, kBlock, 0, ctx.stream>>>(xp, yp, nullptr, g, bn);
      } else {
        pool_window_nhwc<T, P, false, false, kStemPool>
            <<<grid, kBlock, 0, ctx.stream>>>(xp, yp, nullptr, g, {});
      }
    };
    if (wide && is_stem_pool(g)) {
      forward_nhwc(std::integral_constant<int, kPack<T>>{}, std::true_type{});
    } else if (wide) {
      forward_nhwc(std::integral_constant<int, kPack<T>>{}, std::false_type{});
    } else if (nhwc) {
      forward_nhwc(std::integral_constant<int, 1>{}, std::false_type{});
    } else if (from_bn != nullptr) {
      pool_window_nchw<T, false, true>
          <<<dim3(planes, blocks_for(std::int64_t{g.oh} * g.ow)), kBlock, 0, ctx.stream>>>(
              xp, yp, nullptr, g, bn);
    } else {
      pool_window_nchw<T, false>
          <<<dim3(planes, blocks_for(std::int64_t{g.oh} * g.ow)), kBlock, 0, ctx.stream>>>(
              xp, yp, nullptr, g);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_max_pool2d_backward(const KernelContext& ctx, const TensorView& dy,
                                  const TensorView& x, const TensorView& dx,
                                  const MaxPool2dParams& p, const PoolInputFromBatchNorm* from_bn) {
  DLPROBE_RETURN_IF_ERROR(check_pool_size(x.desc, "max_pool2d_backward"));
  const PoolGeom g = geom_of(x.desc, dy.desc, p);
  if (g.kh * g.kw > 255) {
    return error(Errc::unsupported, "max_pool2d_backward: windows of more than 255 positions");
  }
  const bool nhwc = x.desc.layout() == Layout::nhwc;
  const bool wide = nhwc && pool_packable(x.desc, {x.data, dy.data, dx.data});
  DLPROBE_ASSIGN_OR_RETURN(
      auto where, scratch(ctx, static_cast<std::size_t>(dy.desc.numel()), "max_pool2d_backward"));
  auto* wp = static_cast<std::uint8_t*>(where.data());
  return dispatch_floating(x.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const auto* dyp = static_cast<const T*>(dy.data);
    const auto* xp = static_cast<const T*>(x.data);
    auto* dxp = static_cast<T*>(dx.data);
    const auto n = static_cast<unsigned>(x.desc.dim(0));
    const PoolInputFromBatchNorm bn = from_bn != nullptr ? *from_bn : PoolInputFromBatchNorm{};
    if (nhwc) {
      auto passes = [&](auto pack_tag, auto stem_tag) {
        constexpr int P = decltype(pack_tag)::value;
        constexpr bool kStemPool = decltype(stem_tag)::value;
        const dim3 grid(n * static_cast<unsigned>(g.oh), blocks_for(std::int64_t{g.ow} * g.c / P));
        if (from_bn != nullptr) {
          pool_window_nhwc<T, P, true, true, kStemPool>
              <<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g, bn);
        } else {
          pool_window_nhwc<T, P, true, false, kStemPool>
              <<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g, {});
        }
        const std::int64_t row = std::int64_t{g.w} * g.c / P;
        const int block = row_block(row);
        pool_gather_nhwc<T, P, kStemPool>
            <<<dim3(n * static_cast<unsigned>(g.h), blocks_for(row, block)), block, 0,
               ctx.stream>>>(dyp, wp, dxp, g);
      };
      if (wide && is_stem_pool(g)) {
        passes(std::integral_constant<int, kPack<T>>{}, std::true_type{});
      } else if (wide) {
        passes(std::integral_constant<int, kPack<T>>{}, std::false_type{});
      } else {
        passes(std::integral_constant<int, 1>{}, std::false_type{});
      }
    } else {
      const unsigned planes = n * static_cast<unsigned>(g.c);
      const dim3 grid(planes, blocks_for(std::int64_t{g.oh} * g.ow));
      if (from_bn != nullptr) {
        pool_window_nchw<T, true, true><<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g, bn);
      } else {
        pool_window_nchw<T, true><<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g);
      }
      pool_gather_nchw<T>
          <<<dim3(planes, blocks_for(std::int64_t{g.h} * g.w)), kBlock, 0, ctx.stream>>>(dyp, wp,
                                                                                         dxp, g);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace dlprobe::cuda
