// Max pooling. The forward keeps no indices: the backward finds each window's maximum again in x,
// with the same rule as the forward and PyTorch (start below every value, move on a strictly
// greater value or a NaN, so the first maximum wins), and each input element gathers the
// gradients of the windows whose maximum it is. Gathering instead of scattering needs no atomics
// and adds each element's contributions in a fixed order (windows by row, then column).
#include "cuda_common.cuh"

namespace dlprobe::cuda {
namespace {

// Sizes and element strides of one rank-4 tensor, by logical dimension (N, C, H, W).
struct Dims {
  std::int64_t size[4];
  std::int64_t stride[4];
  bool nhwc;

  __device__ std::int64_t offset(std::int64_t n, std::int64_t c, std::int64_t h,
                                 std::int64_t w) const {
    return n * stride[0] + c * stride[1] + h * stride[2] + w * stride[3];
  }
  // The logical index of storage position i, so that consecutive threads touch consecutive
  // addresses.
  __device__ void index(std::int64_t i, std::int64_t& n, std::int64_t& c, std::int64_t& h,
                        std::int64_t& w) const {
    if (nhwc) {
      c = i % size[1];
      i /= size[1];
      w = i % size[3];
      i /= size[3];
      h = i % size[2];
      n = i / size[2];
    } else {
      w = i % size[3];
      i /= size[3];
      h = i % size[2];
      i /= size[2];
      c = i % size[1];
      n = i / size[1];
    }
  }
};

Dims dims_of(const TensorDesc& d) {
  Dims out{};
  for (int k = 0; k < 4; ++k) {
    out.size[k] = d.dim(k);
    out.stride[k] = d.stride(k);
  }
  out.nhwc = d.layout() == Layout::nhwc;
  return out;
}

struct Window {
  int kh, kw, sh, sw, ph, pw;
};

Window window_of(const MaxPool2dParams& p) {
  return {static_cast<int>(p.kernel[0]), static_cast<int>(p.kernel[1]),
          static_cast<int>(p.stride[0]), static_cast<int>(p.stride[1]),
          static_cast<int>(p.pad[0]),    static_cast<int>(p.pad[1])};
}

// The maximum of output (n, c, oh, ow)'s window and where it is (h * W + w).
template <class T>
__device__ float window_max(const T* x, const Dims& xd, const Window& win, std::int64_t n,
                            std::int64_t c, std::int64_t oh, std::int64_t ow, std::int64_t& at) {
  const std::int64_t h0 = oh * win.sh - win.ph;
  const std::int64_t w0 = ow * win.sw - win.pw;
  float best = -INFINITY;
  at = imax(h0, 0) * xd.size[3] + imax(w0, 0);
  for (int r = 0; r < win.kh; ++r) {
    const std::int64_t h = h0 + r;
    if (h < 0 || h >= xd.size[2]) continue;
    for (int s = 0; s < win.kw; ++s) {
      const std::int64_t w = w0 + s;
      if (w < 0 || w >= xd.size[3]) continue;
      const float v = to_float(x[xd.offset(n, c, h, w)]);
      if (v > best || isnan(v)) {
        best = v;
        at = h * xd.size[3] + w;
      }
    }
  }
  return best;
}

template <class T>
__global__ void max_pool_forward(const T* x, T* y, Dims xd, Dims yd, Window win,
                                 std::int64_t total) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    std::int64_t n, c, oh, ow, at;
    yd.index(i, n, c, oh, ow);
    y[i] = from_float<T>(window_max(x, xd, win, n, c, oh, ow, at));
  }
}

// Floor division for a possibly negative numerator and a positive divisor.
__device__ __forceinline__ std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

template <class T>
__global__ void max_pool_backward(const T* dy, const T* x, T* dx, Dims xd, Dims yd, Window win,
                                  std::int64_t total) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    std::int64_t n, c, h, w;
    xd.index(i, n, c, h, w);
    // Windows oh with oh*sh - ph <= h <= oh*sh - ph + kh - 1, clipped to the output.
    const std::int64_t oh0 = imax(floor_div(h + win.ph - win.kh, win.sh) + 1, 0);
    const std::int64_t oh1 = imin(floor_div(h + win.ph, win.sh), yd.size[2] - 1);
    const std::int64_t ow0 = imax(floor_div(w + win.pw - win.kw, win.sw) + 1, 0);
    const std::int64_t ow1 = imin(floor_div(w + win.pw, win.sw), yd.size[3] - 1);
    const std::int64_t self = h * xd.size[3] + w;
    float sum = 0.0F;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh) {
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
        std::int64_t at;
        window_max(x, xd, win, n, c, oh, ow, at);
        if (at == self) sum += to_float(dy[yd.offset(n, c, oh, ow)]);
      }
    }
    dx[i] = from_float<T>(sum);
  }
}

}  // namespace

Status launch_max_pool2d_forward(const KernelContext& ctx, const TensorView& x, const TensorView& y,
                                 const MaxPool2dParams& p) {
  return dispatch_floating(x.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const std::int64_t total = y.desc.numel();
    max_pool_forward<<<grid_for(total, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(x.data), static_cast<T*>(y.data), dims_of(x.desc), dims_of(y.desc),
        window_of(p), total);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

Status launch_max_pool2d_backward(const KernelContext& ctx, const TensorView& dy,
                                  const TensorView& x, const TensorView& dx,
                                  const MaxPool2dParams& p) {
  return dispatch_floating(x.desc.dtype(), [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const std::int64_t total = x.desc.numel();
    max_pool_backward<<<grid_for(total, ctx.sm_count), kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(dy.data), static_cast<const T*>(x.data), static_cast<T*>(dx.data),
        dims_of(x.desc), dims_of(dy.desc), window_of(p), total);
    DLPROBE_CUDA_CHECK_LAUNCH();
    return Status::ok();
  });
}

}  // namespace dlprobe::cuda
