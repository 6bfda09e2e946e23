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

// The positions the backward's first pass stores, P of them (one byte each) as one access.
template <int P>
struct alignas(P) BytePack {
  std::uint8_t v[P];
};

// P positions at `at` as ints: bytes (the backward's own first pass), or small integers in the
// activation dtype (what batch_norm_relu_max_pool_train_forward stores for the backward).
template <class Pos, int P>
__device__ __forceinline__ void load_positions(const Pos* at, int (&out)[P]) {
  if constexpr (std::is_same_v<Pos, std::uint8_t>) {
    const BytePack<P> b = *reinterpret_cast<const BytePack<P>*>(at);
#pragma unroll
    for (int k = 0; k < P; ++k) out[k] = b.v[k];
  } else {
    float v[P];
    load_pack<Pos, P>(at, v);
#pragma unroll
    for (int k = 0; k < P; ++k) out[k] = static_cast<int>(v[k]);
  }
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
// windows by row, then column. `g` has passed through geometry<kStemPool>.
template <class T, int P, bool kStemPool, class Pos>
__device__ __forceinline__ void gather_nhwc(const T* dy, const Pos* where, const PoolGeom& g, int n,
                                            int h, int w, int pk, float (&sum)[P]) {
  const std::int64_t out_plane = static_cast<std::int64_t>(n) * g.oh * g.ow * g.c + pk * P;
  const Covering cover = covering(g, h, w);
  // The stem's windows (3x3, stride 2) cover an input with at most 2 x 2 of them: a loop of that
  // fixed count unrolls, so that every window's loads are in flight at once, where a loop over the
  // run-time cover waits on each window's in turn. Skipped windows keep the order of the sums.
  const int rows = kStemPool ? 2 : cover.oh1 - cover.oh0 + 1;
  const int cols = kStemPool ? 2 : cover.ow1 - cover.ow0 + 1;
#pragma unroll
  for (int k = 0; k < P; ++k) sum[k] = 0.0F;
#pragma unroll
  for (int i = 0; i < rows; ++i) {
#pragma unroll
    for (int j = 0; j < cols; ++j) {
      const int oh = cover.oh0 + i;
      const int ow = cover.ow0 + j;
      if (oh > cover.oh1 || ow > cover.ow1) continue;
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

}  // namespace dlprobe::cuda::pool
