// Max pooling. The forward keeps no indices (batch_norm_relu_max_pool_train_forward may keep the
// maxima's places for the stem's fused backward): the backward finds each window's maximum again
// in x, with the same rule as the forward and PyTorch (start below every value, move on a strictly
// greater value or a NaN), then each input element gathers the gradients of the windows whose
// maximum it is (see the backward's two passes below). Where x, a batch norm's ReLU output, is
// never stored, the forward and the backward's first pass compute it from the batch norm's input.
#include "cuda_common.cuh"
#include "pool_geometry.cuh"

namespace dlprobe::cuda {
namespace {

using pool::cell_grads;
using pool::covering;
using pool::Covering;
using pool::gather_nhwc;
using pool::geom_of;
using pool::geometry;
using pool::holds_input;
using pool::input_at;
using pool::is_stem_pool;
using pool::PoolGeom;
using pool::position_in;
using pool::stem_cells;
using pool::StemCell;
using pool::StemCells;

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
// for ResNet-50's stem at batch 256 on an H200. The batch norm before the stem's pool may take
// the second pass into its own (launch_batch_norm_relu_backward_from_pool).

// What a window pass stores for P neighbouring outputs at `out`, laid out as y: the maxima into y
// (the forward); their positions in the window into `where` as bytes (the backward's first pass);
// or both, the positions as small integers in y's dtype (a forward that keeps them for the
// backward, batch_norm_relu_max_pool_train_forward's).
enum class Store { values, positions, values_and_positions };

template <Store kStore, class T, int P>
__device__ void store_window(T* y, void* where, std::int64_t out, const float (&best)[P],
                             const int (&at)[P]) {
  if constexpr (kStore == Store::positions) {
    Pack<std::uint8_t, P> pos;
#pragma unroll
    for (int k = 0; k < P; ++k) pos.v[k] = static_cast<std::uint8_t>(at[k]);
    *reinterpret_cast<Pack<std::uint8_t, P>*>(static_cast<std::uint8_t*>(where) + out) = pos;
  } else {
    store_pack(y + out, best);
    if constexpr (kStore == Store::values_and_positions) {
      float pos[P];
#pragma unroll
      for (int k = 0; k < P; ++k) pos[k] = static_cast<float>(at[k]);
      store_pack(static_cast<T*>(where) + out, pos);
    }
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
template <class T, int P, Store kStore, bool kFromBn, bool kStemPool>
__global__ void pool_window_nhwc(const T* x, T* y, void* where, PoolGeom geom,
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
  store_window<kStore>(y, where, (static_cast<std::int64_t>(blockIdx.x) * g.ow + ow) * g.c + pk * P,
                       best, pos);
}

// NCHW, one element a thread: grid (N * C planes, ceil(OH * OW / kBlock)).
template <class T, Store kStore, bool kFromBn = false>
__global__ void pool_window_nchw(const T* x, T* y, void* where, PoolGeom g,
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
  store_window<kStore>(y, where, static_cast<std::int64_t>(blockIdx.x) * g.oh * g.ow + i, best, at);
}

// grid (N * H, ceil(W * C/P / kBlock)).
template <class T, int P>
__global__ void pool_gather_nhwc(const T* dy, const std::uint8_t* where, T* dx, PoolGeom g) {
  NhwcPlace place;
  if (!nhwc_place(g.h, g.w, g.c / P, place)) return;
  float sum[P];
  gather_nhwc<T, P>(dy, where, g, place.n, place.row, place.col, place.pk, sum);
  store_pack(dx + (static_cast<std::int64_t>(blockIdx.x) * g.w + place.col) * g.c + place.pk * P,
             sum);
}

// The stem's pool by cells of 2 x 2 inputs (pool_geometry.cuh): grid (N * cell rows,
// ceil(cell columns * C/P / kBlock)).
template <class T, int P>
__global__ void pool_gather_stem_nhwc(const T* dy, const std::uint8_t* where, T* dx, PoolGeom geom,
                                      StemCells cells) {
  const PoolGeom g = geometry<true>(geom);
  NhwcPlace place;
  if (!nhwc_place(cells.rows, cells.cols, g.c / P, place)) return;
  const StemCell c{place.n, place.row, place.col};
  Pack<T, P> grad[4];
  cell_grads<T, P>(dy, where, g, c, place.pk, grad);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (holds_input(g, c, k)) {
      *reinterpret_cast<Pack<T, P>*>(dx + input_at(g, c, k) + place.pk * P) = grad[k];
    }
  }
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
  return d.dim(1) % pack == 0 && aligned_16(pointers);
}

unsigned blocks_for(std::int64_t items, int block = kBlock) {
  return static_cast<unsigned>((items + block - 1) / block);
}

// The block size of a grid whose rows hold `items` threads each: half a block where that divides a
// row and a whole one does not, so that no block is left part idle at each row's end (a gather
// over ResNet's stem input by rows, fp16: 896 threads a row, which blocks of 256 leave an eighth
// idle).
int row_block(std::int64_t items) {
  return items % kBlock != 0 && items % (kBlock / 2) == 0 ? kBlock / 2 : kBlock;
}

// The backward's first pass over NHWC (grid (N * OH, ceil(OW * C/P / kBlock))): each window's
// maximum position into `where`, laid out as the pool's output.
template <class T, int P, bool kStemPool>
void window_positions_nhwc(const KernelContext& ctx, const T* x, std::uint8_t* where,
                           const PoolGeom& g, unsigned n, const PoolInputFromBatchNorm* from_bn) {
  const dim3 grid(n * static_cast<unsigned>(g.oh), blocks_for(std::int64_t{g.ow} * g.c / P));
  if (from_bn != nullptr) {
    pool_window_nhwc<T, P, Store::positions, true, kStemPool>
        <<<grid, kBlock, 0, ctx.stream>>>(x, nullptr, where, g, *from_bn);
  } else {
    pool_window_nhwc<T, P, Store::positions, false, kStemPool>
        <<<grid, kBlock, 0, ctx.stream>>>(x, nullptr, where, g, {});
  }
}

}  // namespace

Status launch_max_pool2d_forward(const KernelContext& ctx, const TensorView& x, const TensorView& y,
                                 const MaxPool2dParams& p, const PoolInputFromBatchNorm* from_bn,
                                 void* positions) {
  constexpr std::string_view op = "max_pool2d_forward";
  DLPROBE_RETURN_IF_ERROR(check_pool_size(x.desc, op));
  const PoolGeom g = geom_of(x.desc, y.desc, p);
  const bool nhwc = x.desc.layout() == Layout::nhwc;
  const bool wide = nhwc && pool_packable(x.desc, {x.data, y.data, positions});
  if (positions != nullptr && (!wide || from_bn == nullptr)) {
    return error(Errc::unsupported, std::string(op) +
                                        ": positions are kept only from a batch "
                                        "norm's output in NHWC 16-byte channel packs");
  }
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
      if (positions != nullptr) {
        pool_window_nhwc<T, P, Store::values_and_positions, true, kStemPool>
            <<<grid, kBlock, 0, ctx.stream>>>(xp, yp, positions, g, bn);
      } else if (from_bn != nullptr) {
        pool_window_nhwc<T, P, Store::values, true, kStemPool>
            <<<grid, kBlock, 0, ctx.stream>>>(xp, yp, nullptr, g, bn);
      } else {
        pool_window_nhwc<T, P, Store::values, false, kStemPool>
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
      pool_window_nchw<T, Store::values, true>
          <<<dim3(planes, blocks_for(std::int64_t{g.oh} * g.ow)), kBlock, 0, ctx.stream>>>(
              xp, yp, nullptr, g, bn);
    } else {
      pool_window_nchw<T, Store::values>
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
        window_positions_nhwc<T, P, kStemPool>(ctx, xp, wp, g, n, from_bn);
        if constexpr (kStemPool) {
          const StemCells cells = stem_cells(g);
          const std::int64_t row = std::int64_t{cells.cols} * g.c / P;
          const int block = row_block(row);
          pool_gather_stem_nhwc<T, P>
              <<<dim3(n * static_cast<unsigned>(cells.rows), blocks_for(row, block)), block, 0,
                 ctx.stream>>>(dyp, wp, dxp, g, cells);
        } else {
          const std::int64_t row = std::int64_t{g.w} * g.c / P;
          const int block = row_block(row);
          pool_gather_nhwc<T, P><<<dim3(n * static_cast<unsigned>(g.h), blocks_for(row, block)),
                                   block, 0, ctx.stream>>>(dyp, wp, dxp, g);
        }
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
        pool_window_nchw<T, Store::positions, true>
            <<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g, bn);
      } else {
        pool_window_nchw<T, Store::positions><<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g);
      }
      pool_gather_nchw<T>
          <<<dim3(planes, blocks_for(std::int64_t{g.h} * g.w)), kBlock, 0, ctx.stream>>>(dyp, wp,
                                                                                         dxp, g);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_max_pool2d_positions(const KernelContext& ctx, const TensorView& x,
                                   const TensorDesc& dy, std::uint8_t* where,
                                   const MaxPool2dParams& p,
                                   const PoolInputFromBatchNorm* from_bn) {
  constexpr std::string_view op = "max_pool2d_positions";
  DLPROBE_RETURN_IF_ERROR(check_pool_size(x.desc, op));
  const PoolGeom g = geom_of(x.desc, dy, p);
  if (g.kh * g.kw > 255) {
    return error(Errc::unsupported, std::string(op) + ": windows of more than 255 positions");
  }
  if (x.desc.layout() != Layout::nhwc || !pool_packable(x.desc, {x.data, where})) {
    return error(Errc::unsupported,
                 std::string(op) + ": " + x.desc.str() + " is not NHWC in 16-byte channel packs");
  }
  return dispatch_floating(x.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const auto* xp = static_cast<const T*>(x.data);
    const auto n = static_cast<unsigned>(x.desc.dim(0));
    if (is_stem_pool(g)) {
      window_positions_nhwc<T, kPack<T>, true>(ctx, xp, where, g, n, from_bn);
    } else {
      window_positions_nhwc<T, kPack<T>, false>(ctx, xp, where, g, n, from_bn);
    }
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace dlprobe::cuda
