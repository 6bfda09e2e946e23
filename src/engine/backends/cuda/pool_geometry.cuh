// A max pool's geometry and the gather of its backward, shared by the pool's kernels and the
// batch norm's backward that takes the pool's gradient as it loads it (kernels_batch_norm.cu's
// PooledGrad), so that both add the same windows' gradients in the same order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_common.cuh"

namespace dlprobe::cuda::pool {

// Plane sizes of one max pool: input H x W, output OH x OW, C channels; 32-bit within a plane
// (the host checks that a plane fits), 64-bit plane offsets.
struct PoolGeom {
  int c, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
};

inline PoolGeom geom_of(const TensorDesc& x, const TensorDesc& y, const MaxPool2dParams& p) {
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
inline bool is_stem_pool(const PoolGeom& g) {
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

// P positions as ints from their pack as it is in memory (cuda_common.cuh's Pack): bytes (the
// backward's own first pass), or small integers in the activation dtype (what
// batch_norm_relu_max_pool_train_forward stores for the backward).
template <class Pos, int P>
__device__ __forceinline__ void positions_of(const Pack<Pos, P>& pack, int (&out)[P]) {
#pragma unroll
  for (int k = 0; k < P; ++k) {
    if constexpr (std::is_same_v<Pos, std::uint8_t>) {
      out[k] = pack.v[k];
    } else {
      out[k] = static_cast<int>(to_float(pack.v[k]));
    }
  }
}

// P positions at `at` as ints.
template <class Pos, int P>
__device__ __forceinline__ void load_positions(const Pos* at, int (&out)[P]) {
  positions_of<Pos, P>(load_raw<Pos, P>(at), out);
}

// The output windows that hold input (h, w): oh with oh*sh - ph <= h <= oh*sh - ph + kh - 1, and
// likewise ow, clipped to the output.
struct Covering {
  int oh0, oh1, ow0, ow1;
};

__device__ __forceinline__ Covering covering(const PoolGeom& g, int h, int w) {
  return {max(floor_div(h + g.ph - g.kh, g.sh) + 1, 0), min(floor_div(h + g.ph, g.sh), g.oh - 1),
          max(floor_div(w + g.pw - g.kw, g.sw) + 1, 0), min(floor_div(w + g.pw, g.sw), g.ow - 1)};
}

// Where input (h, w) lies in output window (oh, ow), as the window pass numbers the positions
// (r * kw + s for input row h0 + r, column w0 + s).
__device__ __forceinline__ int position_in(const PoolGeom& g, int h, int w, int oh, int ow) {
  return (h - (oh * g.sh - g.ph)) * g.kw + (w - (ow * g.sw - g.pw));
}

// The gradient of input (n, h, w) for channel pack pk (NHWC, P channels): the sum of dy over the
// windows whose maximum it is (`where` holds each window's maximum's position, laid out as dy),
// windows by row, then column. The stem's pool gathers by cells instead (below).
template <class T, int P, class Pos>
__device__ __forceinline__ void gather_nhwc(const T* dy, const Pos* where, const PoolGeom& g, int n,
                                            int h, int w, int pk, float (&sum)[P]) {
  const std::int64_t out_plane = static_cast<std::int64_t>(n) * g.oh * g.ow * g.c + pk * P;
  const Covering cover = covering(g, h, w);
#pragma unroll
  for (int k = 0; k < P; ++k) sum[k] = 0.0F;
  for (int oh = cover.oh0; oh <= cover.oh1; ++oh) {
    for (int ow = cover.ow0; ow <= cover.ow1; ++ow) {
      const int self = position_in(g, h, w, oh, ow);
      const std::int64_t at = out_plane + static_cast<std::int64_t>(oh * g.ow + ow) * g.c;
      int idx[P];
      load_positions<Pos, P>(where + at, idx);
      float d[P];
      load_pack(dy + at, d);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        if (idx[k] == self) sum[k] += d[k];
      }
    }
  }
}

// ---- the stem's pool (3x3, stride 2, padding 1) gathered by cells ----
//
// Input rows 2i - 1 and 2i and columns 2j - 1 and 2j form cell (i, j) (row -1 and column -1
// left out, as row H and column W), and the windows that hold any of its four inputs are the
// four of rows i - 1, i and columns j - 1, j. A thread that takes a cell reads those four windows'
// gradients and positions once for the four inputs, where an input at a time reads 2.25 windows
// on average for each: the batch norm's passes that gathered input by input ran at 1.2 and
// 1.7 TB/s (Nsight Compute, ResNet-50 fp16 bs256 on an H100), a third to a half of the memory's.
// Each input's gradient is still the sum over its windows by row, then column, so the values are
// gather_nhwc's to the bit.

// Cells a plane: H / 2 + 1 by W / 2 + 1.
struct StemCells {
  int rows;
  int cols;
};

inline StemCells stem_cells(const PoolGeom& g) {
  return {g.h / 2 + 1, g.w / 2 + 1};
}

// Cell (n, i, j). Input k of the cell (0 to 3) is at row 2i - 1 + k / 2, column 2j - 1 + k % 2;
// window q (0 to 3) at row i - 1 + q / 2, column j - 1 + q % 2.
struct StemCell {
  int n;
  int i;
  int j;
};

// Cell `index` of N planes of cells, as NHWC rows number them (32-bit: a step's cells are fewer
// than its input's rows, which check_size keeps below 2^31).
__device__ __forceinline__ StemCell stem_cell(const StemCells& cells, std::uint32_t index) {
  const std::uint32_t ni = index / static_cast<std::uint32_t>(cells.cols);
  const std::uint32_t n = ni / static_cast<std::uint32_t>(cells.rows);
  return {static_cast<int>(n), static_cast<int>(ni - n * static_cast<std::uint32_t>(cells.rows)),
          static_cast<int>(index - ni * static_cast<std::uint32_t>(cells.cols))};
}

__device__ __forceinline__ bool holds_input(const PoolGeom& g, const StemCell& c, int k) {
  const int h = 2 * c.i - 1 + k / 2;
  const int w = 2 * c.j - 1 + k % 2;
  return h >= 0 && h < g.h && w >= 0 && w < g.w;
}

__device__ __forceinline__ bool holds_window(const PoolGeom& g, const StemCell& c, int q) {
  const int oh = c.i - 1 + q / 2;
  const int ow = c.j - 1 + q % 2;
  return oh >= 0 && oh < g.oh && ow >= 0 && ow < g.ow;
}

// Element offsets (NHWC, channel 0) of input k and window q.
__device__ __forceinline__ std::int64_t input_at(const PoolGeom& g, const StemCell& c, int k) {
  const int h = 2 * c.i - 1 + k / 2;
  const int w = 2 * c.j - 1 + k % 2;
  return ((static_cast<std::int64_t>(c.n) * g.h + h) * g.w + w) * g.c;
}

__device__ __forceinline__ std::int64_t window_at(const PoolGeom& g, const StemCell& c, int q) {
  const int oh = c.i - 1 + q / 2;
  const int ow = c.j - 1 + q % 2;
  return ((static_cast<std::int64_t>(c.n) * g.oh + oh) * g.ow + ow) * g.c;
}

// Where input k lies in window q (r * 3 + s), or -1 where the window does not hold it: an odd
// input row (k / 2 == 0) is the last row of window row i - 1 and the first of row i, an even one
// the middle row of row i only; columns alike.
__host__ __device__ constexpr int cell_position(int k, int q) {
  const int r = k / 2 == 0 ? (q / 2 == 0 ? 2 : 0) : (q / 2 == 0 ? -1 : 1);
  const int s = k % 2 == 0 ? (q % 2 == 0 ? 2 : 0) : (q % 2 == 0 ? -1 : 1);
  return r < 0 || s < 0 ? -1 : r * 3 + s;
}

// The gradients of the cell's four inputs for channel pack pk: each the sum of dy over the
// windows whose maximum it is, by row, then column, rounded to T as the pool's backward stores it
// (an input outside the plane gets zeros). All four windows' loads are issued before any sum.
template <class T, int P, class Pos>
__device__ __forceinline__ void cell_grads(const T* dy, const Pos* where, const PoolGeom& g,
                                           const StemCell& c, int pk, Pack<T, P> (&grad)[4]) {
  Pack<T, P> d[4];
  Pack<Pos, P> at[4];
  bool held[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    held[q] = holds_window(g, c, q);
    if (held[q]) {
      const std::int64_t off = window_at(g, c, q) + pk * P;
      d[q] = load_raw<T, P>(dy + off);
      at[q] = load_raw<Pos, P>(where + off);
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float sum[P] = {};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int self = cell_position(k, q);
      if (self < 0 || !held[q]) continue;
      int idx[P];
      positions_of<Pos, P>(at[q], idx);
      float v[P];
      to_floats(d[q], v);
#pragma unroll
      for (int e = 0; e < P; ++e) {
        if (idx[e] == self) sum[e] += v[e];
      }
    }
#pragma unroll
    for (int e = 0; e < P; ++e) grad[k].v[e] = from_float<T>(sum[e]);
  }
}

}  // namespace dlprobe::cuda::pool
