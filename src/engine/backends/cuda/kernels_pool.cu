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
template <class T, int P, bool kWhere, bool kFromBn>
__global__ void pool_window_nhwc(const T* x, T* y, std::uint8_t* where, PoolGeom g,
                                 PoolInputFromBatchNorm from_bn) {
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
template <class T, int P>
__global__ void pool_gather_nhwc(const T* dy, const std::uint8_t* where, T* dx, PoolGeom g) {
  NhwcPlace place;
  if (!nhwc_place(g.h, g.w, g.c / P, place)) return;
  const int h = place.row;
  const int w = place.col;
  const int pk = place.pk;
  const std::int64_t out_plane = static_cast<std::int64_t>(place.n) * g.oh * g.ow * g.c + pk * P;
  const Covering cover = covering(g, h, w);
  float sum[P] = {};
  for (int oh = cover.oh0; oh <= cover.oh1; ++oh) {
    for (int ow = cover.ow0; ow <= cover.ow1; ++ow) {
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

// ---- ResNet's stem pool (3x3, stride 2, padding 1) over NHWC packs ----
//
// The pool every step runs, on the largest tensor the stem writes (the batch norm's output of
// 112x112x64 an image), gets kernels of its own. A thread walks one output column of a strip of
// kStemStripRows output rows downwards, so the input row two windows share (a window's last,
// the next one's first) is kept in registers instead of being loaded and normalised again, and
// the grid holds no more blocks than fill the GPU, each thread taking strip after strip. The
// general kernels above give a block an output row (two blocks of 256 threads for 56 x 8 packs,
// the second a quarter idle) and a thread one window: at fp16 batch 256 on an H200 their three
// launches took 0.94 ms a step at 1.5 to 1.8 TB/s (Nsight Compute, 2026-12-05).
constexpr int kStemStripRows = 8;

// Strips of output rows an image has.
__host__ __device__ __forceinline__ int stem_strips(const PoolGeom& g) {
  return (g.oh + kStemStripRows - 1) / kStemStripRows;
}

bool is_stem_pool(const PoolGeom& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 2 && g.sw == 2 && g.ph == 1 && g.pw == 1;
}

// A thread's strip: image n, output column `col` (or the input column, in the gather), the
// strip's first output row and the channel pack pk, from its index in
// [0, N * strips * cols * packs): packs fastest, so that a warp's loads are contiguous.
struct StemStrip {
  int n, col, row0, pk;
};

__device__ __forceinline__ StemStrip stem_strip(std::int64_t item, const PoolGeom& g, int pack,
                                                int cols) {
  const int packs = g.c / pack;
  const int strips = stem_strips(g);
  StemStrip s;
  s.pk = static_cast<int>(item % packs);
  std::int64_t rest = item / packs;
  s.col = static_cast<int>(rest % cols);
  rest /= cols;
  s.row0 = static_cast<int>(rest % strips) * kStemStripRows;
  s.n = static_cast<int>(rest / strips);
  return s;
}

// The grid-stride loop over the strips.
template <class F>
__device__ __forceinline__ void for_each_strip(std::int64_t items, F&& f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < items; item += stride) {
    f(item);
  }
}

// One input row of a window's three columns 2 * ow - 1 .. 2 * ow + 1 as the pool compares them
// (pool_input), kept as T: every value the comparison sees is one T holds.
template <class T, int P>
struct WindowRow {
  Pack<T, P> v[3];
};

// Input row h's three columns for output column ow; a column outside the image is not loaded.
template <bool kFromBn, class T, int P>
__device__ __forceinline__ WindowRow<T, P> load_window_row(const T* plane, const PoolGeom& g, int h,
                                                           int ow, const BnChannel (&bn)[P]) {
  WindowRow<T, P> row{};
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    const int w = 2 * ow - 1 + s;
    if (w < 0 || w >= g.w) continue;
    row.v[s] = load_raw<T, P>(plane + (static_cast<std::int64_t>(h) * g.w + w) * g.c);
    if constexpr (kFromBn) {
#pragma unroll
      for (int k = 0; k < P; ++k) {
        row.v[s].v[k] = from_float<T>(pool_input<kFromBn, T>(to_float(row.v[s].v[k]), bn[k]));
      }
    }
  }
  return row;
}

// window_max's comparison over one row r of the window (r * 3 + s its positions), in its order.
template <class T, int P>
__device__ __forceinline__ void window_row_max(const WindowRow<T, P>& row, int r, int ow,
                                               const PoolGeom& g, float (&best)[P], int (&at)[P]) {
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    const int w = 2 * ow - 1 + s;
    if (w < 0 || w >= g.w) continue;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float v = to_float(row.v[s].v[k]);
      if (v > best[k] || isnan(v)) {
        best[k] = v;
        at[k] = r * 3 + s;
      }
    }
  }
}

// The window pass of the forward (kWhere false: the maxima into y) or of the backward (kWhere:
// their places into `where`), as pool_window_nhwc computes them: the same comparisons in the same
// order, so the same maxima and places.
template <class T, int P, bool kWhere, bool kFromBn>
__global__ void stem_pool_window_nhwc(const T* x, T* y, std::uint8_t* where, PoolGeom g,
                                      PoolInputFromBatchNorm from_bn, std::int64_t items) {
  for_each_strip(items, [&](std::int64_t item) {
    const StemStrip s = stem_strip(item, g, P, g.ow);
    const T* plane = x + static_cast<std::int64_t>(s.n) * g.h * g.w * g.c + s.pk * P;
    BnChannel bn[P];
#pragma unroll
    for (int k = 0; k < P; ++k) bn[k] = bn_channel<kFromBn>(from_bn, s.pk * P + k);
    const int row_end = min(s.row0 + kStemStripRows, g.oh);
    // Input row 2 * oh - 1, the window's first: the row above the image for oh = 0.
    WindowRow<T, P> top{};
    if (s.row0 > 0) top = load_window_row<kFromBn, T, P>(plane, g, 2 * s.row0 - 1, s.col, bn);
    for (int oh = s.row0; oh < row_end; ++oh) {
      float best[P];
      int at[P];
#pragma unroll
      for (int k = 0; k < P; ++k) {
        best[k] = -INFINITY;
        at[k] = (oh == 0 ? 3 : 0) + (s.col == 0 ? 1 : 0);  // the first place inside the image
      }
      if (oh > 0) window_row_max(top, 0, s.col, g, best, at);
      // Row 2 * oh lies in the image for every output row; row 2 * oh + 1 may not.
      window_row_max(load_window_row<kFromBn, T, P>(plane, g, 2 * oh, s.col, bn), 1, s.col, g, best,
                     at);
      if (2 * oh + 1 < g.h) {
        top = load_window_row<kFromBn, T, P>(plane, g, 2 * oh + 1, s.col, bn);
        window_row_max(top, 2, s.col, g, best, at);
      }
      const std::int64_t out =
          ((static_cast<std::int64_t>(s.n) * g.oh + oh) * g.ow + s.col) * g.c + s.pk * P;
      store_window<kWhere>(y, where, out, best, at);
    }
  });
}

// One output row's gradients and places at the one or two windows whose columns hold input
// column w: window w / 2 for an even w; (w - 1) / 2 and (w + 1) / 2 for an odd one, the second
// where it exists.
template <class T, int P>
struct GatherRow {
  Pack<T, P> dy[2];
  BytePack<P> where[2];
};

__device__ __forceinline__ int stem_windows_of(int w, int ow_count) {
  return (w % 2 == 1 && (w + 1) / 2 < ow_count) ? 2 : 1;
}

template <class T, int P>
__device__ __forceinline__ GatherRow<T, P> load_gather_row(const T* dy, const std::uint8_t* where,
                                                           std::int64_t row_at, int w,
                                                           const PoolGeom& g) {
  GatherRow<T, P> row{};
  const int ow0 = w / 2;
  const int windows = stem_windows_of(w, g.ow);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (j >= windows) break;
    const std::int64_t at = row_at + static_cast<std::int64_t>(ow0 + j) * g.c;
    row.dy[j] = load_raw<T, P>(dy + at);
    row.where[j] = *reinterpret_cast<const BytePack<P>*>(where + at);
  }
  return row;
}

// Adds to sum the gradients of the row's windows whose maximum is input column w at window row
// r (r * 3 + s its place), windows in column order.
template <class T, int P>
__device__ __forceinline__ void gather_row(const GatherRow<T, P>& row, int r, int w,
                                           const PoolGeom& g, float (&sum)[P]) {
  const int windows = stem_windows_of(w, g.ow);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (j >= windows) break;
    // Column w is place 1 of window w / 2 for an even w, else place 2 of the first window and
    // place 0 of the second.
    const int self = r * 3 + (w % 2 == 0 ? 1 : (j == 0 ? 2 : 0));
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (row.where[j].v[k] == self) sum[k] += to_float(row.dy[j].v[k]);
    }
  }
}

// The backward's second pass, as pool_gather_nhwc computes it (each input element's sum over the
// windows whose maximum it is, windows by row, then column): a thread walks one input column
// down the input rows 2 * oh and 2 * oh + 1 of a strip of output rows oh, keeping the output row
// that two input rows share (row oh + 1 for input rows 2 * oh + 1 and 2 * oh + 2).
template <class T, int P>
__global__ void stem_pool_gather_nhwc(const T* dy, const std::uint8_t* where, T* dx, PoolGeom g,
                                      std::int64_t items) {
  for_each_strip(items, [&](std::int64_t item) {
    const StemStrip s = stem_strip(item, g, P, g.w);
    const std::int64_t out_plane = static_cast<std::int64_t>(s.n) * g.oh * g.ow * g.c + s.pk * P;
    const std::int64_t in_plane = static_cast<std::int64_t>(s.n) * g.h * g.w * g.c + s.pk * P;
    const int row_end = min(s.row0 + kStemStripRows, g.oh);
    const auto row_at = [&](int oh) {
      return out_plane + static_cast<std::int64_t>(oh) * g.ow * g.c;
    };
    const auto store = [&](int h, const float(&sum)[P]) {
      store_pack(dx + in_plane + (static_cast<std::int64_t>(h) * g.w + s.col) * g.c, sum);
    };
    GatherRow<T, P> cur = load_gather_row<T, P>(dy, where, row_at(s.row0), s.col, g);
    for (int oh = s.row0; oh < row_end; ++oh) {
      // Input row 2 * oh: place row 1 of window row oh alone.
      float sum[P] = {};
      gather_row(cur, 1, s.col, g, sum);
      store(2 * oh, sum);
      if (2 * oh + 1 >= g.h) break;
      // Input row 2 * oh + 1: place row 2 of window row oh, then place row 0 of row oh + 1.
      float odd[P] = {};
      gather_row(cur, 2, s.col, g, odd);
      if (oh + 1 < g.oh) {
        cur = load_gather_row<T, P>(dy, where, row_at(oh + 1), s.col, g);
        gather_row(cur, 0, s.col, g, odd);
      }
      store(2 * oh + 1, odd);
    }
  });
}

// The strips of the stem pool's kernels over `cols` columns of n images.
std::int64_t stem_strip_items(const PoolGeom& g, std::int64_t n, int cols, int pack) {
  return n * stem_strips(g) * cols * (g.c / pack);
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

unsigned blocks_for(std::int64_t items) {
  return static_cast<unsigned>((items + kBlock - 1) / kBlock);
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
    const auto forward_nhwc = [&](auto pack_tag, auto bn_tag) {
      constexpr int P = decltype(pack_tag)::value;
      constexpr bool kFromBn = decltype(bn_tag)::value;
      if constexpr (P > 1) {
        if (is_stem_pool(g)) {
          const std::int64_t items = stem_strip_items(g, x.desc.dim(0), g.ow, P);
          stem_pool_window_nhwc<T, P, false, kFromBn>
              <<<grid_for(items, ctx.sm_count), kBlock, 0, ctx.stream>>>(xp, yp, nullptr, g, bn,
                                                                         items);
          return;
        }
      }
      const dim3 grid(planes, blocks_for(std::int64_t{g.ow} * g.c / P));
      pool_window_nhwc<T, P, false, kFromBn>
          <<<grid, kBlock, 0, ctx.stream>>>(xp, yp, nullptr, g, bn);
    };
    const auto forward_nhwc_of = [&](auto pack_tag) {
      if (from_bn != nullptr) {
        forward_nhwc(pack_tag, std::true_type{});
      } else {
        forward_nhwc(pack_tag, std::false_type{});
      }
    };
    if (wide) {
      forward_nhwc_of(std::integral_constant<int, kPack<T>>{});
    } else if (nhwc) {
      forward_nhwc_of(std::integral_constant<int, 1>{});
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
    const std::int64_t images = x.desc.dim(0);
    const auto n = static_cast<unsigned>(images);
    const PoolInputFromBatchNorm bn = from_bn != nullptr ? *from_bn : PoolInputFromBatchNorm{};
    if (nhwc) {
      auto passes = [&](auto pack_tag, auto bn_tag) {
        constexpr int P = decltype(pack_tag)::value;
        constexpr bool kFromBn = decltype(bn_tag)::value;
        if constexpr (P > 1) {
          if (is_stem_pool(g)) {
            const std::int64_t windows = stem_strip_items(g, images, g.ow, P);
            stem_pool_window_nhwc<T, P, true, kFromBn>
                <<<grid_for(windows, ctx.sm_count), kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g, bn,
                                                                             windows);
            const std::int64_t columns = stem_strip_items(g, images, g.w, P);
            stem_pool_gather_nhwc<T, P><<<grid_for(columns, ctx.sm_count), kBlock, 0, ctx.stream>>>(
                dyp, wp, dxp, g, columns);
            return;
          }
        }
        const dim3 grid(n * static_cast<unsigned>(g.oh), blocks_for(std::int64_t{g.ow} * g.c / P));
        pool_window_nhwc<T, P, true, kFromBn>
            <<<grid, kBlock, 0, ctx.stream>>>(xp, nullptr, wp, g, bn);
        pool_gather_nhwc<T, P>
            <<<dim3(n * static_cast<unsigned>(g.h), blocks_for(std::int64_t{g.w} * g.c / P)),
               kBlock, 0, ctx.stream>>>(dyp, wp, dxp, g);
      };
      const auto passes_of = [&](auto pack_tag) {
        if (from_bn != nullptr) {
          passes(pack_tag, std::true_type{});
        } else {
          passes(pack_tag, std::false_type{});
        }
      };
      if (wide) {
        passes_of(std::integral_constant<int, kPack<T>>{});
      } else {
        passes_of(std::integral_constant<int, 1>{});
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
