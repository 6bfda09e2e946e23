#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "data/gpu/augment_kernel.h"

namespace dlprobe::data::gpu {

AugmentParams augment_params(const AugmentOptions& options) {
  AugmentParams p;
  p.size = options.size;
  p.type = options.type;
  p.layout = options.layout;
  for (int c = 0; c < 3; ++c) {
    p.scale[c] = 1.0f / (255.0f * options.std[c]);
    p.shift[c] = -options.mean[c] / options.std[c];
  }
  return p;
}

namespace {

struct Tap {
  int i0;
  int i1;
  float w;
};

// make_taps of augment.cpp for one output index.
__device__ Tap tap(double start, double length, int count, int limit, int o) {
  const double step = length / count;
  const double last = fmax(start, start + length - 1.0);
  const double src = fmin(fmax(start + (o + 0.5) * step - 0.5, start), last);
  int i0 = min(static_cast<int>(floor(src)), limit - 1);
  i0 = max(i0, 0);
  Tap t;
  t.i0 = i0;
  t.i1 = min(i0 + 1, limit - 1);
  t.w = static_cast<float>(fmin(fmax(src - i0, 0.0), 1.0));
  return t;
}

template <typename T>
__device__ T convert(float v);
template <>
__device__ float convert<float>(float v) {
  return v;
}
template <>
__device__ __half convert<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 convert<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Pixel (x, y)'s RGB levels.
__device__ void texel(const AugmentJob& job, int x, int y, float rgb[3]) {
  const std::uint8_t* row = job.pixels + static_cast<std::int64_t>(y) * job.pitch;
  if (job.ycbcr == 0) {
    for (int c = 0; c < 3; ++c) rgb[c] = row[x * 3 + c];
    return;
  }
  int v[3];
  ycbcr_to_rgb(row[x], upsampled(job.cb, x, y), upsampled(job.cr, x, y), v);
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<float>(v[c]);
}

struct Coefficients {
  float scale[3];
  float shift[3];
};

// One thread per output pixel (its three channels); blockIdx.y is the sample.
template <typename T, bool Nchw>
__global__ void augment_kernel(const AugmentJob* jobs, int size, Coefficients k, T* out) {
  const int n = size;
  const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= n * n) return;
  const AugmentJob job = jobs[blockIdx.y];
  const int oy = pixel / n;
  const int ox = pixel % n;
  // The flip reverses the horizontal taps, as the host reverses its tap list.
  const Tap tx = tap(job.x, job.region_width, n, job.width, job.flip ? n - 1 - ox : ox);
  const Tap ty = tap(job.y, job.region_height, n, job.height, oy);
  // The four pixels around the sample, as RGB levels.
  float a0[3], b0[3], a1[3], b1[3];
  texel(job, tx.i0, ty.i0, a0);
  texel(job, tx.i1, ty.i0, b0);
  texel(job, tx.i0, ty.i1, a1);
  texel(job, tx.i1, ty.i1, b1);
  T* sample = out + static_cast<std::int64_t>(blockIdx.y) * 3 * n * n;
  for (int c = 0; c < 3; ++c) {
    const float top = a0[c] + tx.w * (b0[c] - a0[c]);
    const float bottom = a1[c] + tx.w * (b1[c] - a1[c]);
    const float v = (top + ty.w * (bottom - top)) * k.scale[c] + k.shift[c];
    const std::int64_t at = Nchw ? static_cast<std::int64_t>(c) * n * n + pixel
                                 : static_cast<std::int64_t>(pixel) * 3 + c;
    sample[at] = convert<T>(v);
  }
}

template <typename T>
cudaError_t launch_typed(const AugmentJob* jobs, int count, const AugmentParams& p, void* out,
                         cudaStream_t stream) {
  Coefficients k{};
  for (int c = 0; c < 3; ++c) {
    k.scale[c] = p.scale[c];
    k.shift[c] = p.shift[c];
  }
  constexpr int kThreads = 256;
  const dim3 grid((p.size * p.size + kThreads - 1) / kThreads, count);
  if (p.layout == SampleLayout::nchw) {
    augment_kernel<T, true><<<grid, kThreads, 0, stream>>>(jobs, p.size, k, static_cast<T*>(out));
  } else {
    augment_kernel<T, false><<<grid, kThreads, 0, stream>>>(jobs, p.size, k, static_cast<T*>(out));
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_augment(const AugmentJob* jobs, int count, const AugmentParams& params,
                           void* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (params.type) {
    case SampleType::fp32:
      return launch_typed<float>(jobs, count, params, out, stream);
    case SampleType::fp16:
      return launch_typed<__half>(jobs, count, params, out, stream);
    case SampleType::bf16:
      return launch_typed<__nv_bfloat16>(jobs, count, params, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dlprobe::data::gpu
