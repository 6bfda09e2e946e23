// Device-side helpers shared by the kernel files: fp16/bf16 <-> float, dtype dispatch, 16-byte
// packs, warp and block reductions and grid sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda_library_check.h"
#include "dlprobe/engine/dtype.h"
#include "kernels.h"

namespace dlprobe::cuda {

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Round to nearest even, overflow to infinity, NaN kept: the host conversions of dlprobe/dtype.h.
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// A batch norm's output before rounding: (x - mean) * (invstd * gamma) + beta (+ residual), then
// ReLU. The batch-norm backward and the max pool's backward recompute it from the same expression,
// so it is written with explicit fused multiply-adds: the compiler may not contract it differently
// in two kernels.
__device__ __forceinline__ float bn_value(float x, float mean, float scale, float beta) {
  return __fmaf_rn(x - mean, scale, beta);
}
__device__ __forceinline__ float relu(float v) {
  return v < 0.0F ? 0.0F : v;  // NaN passes, as torch.relu
}

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the element type of a floating activation dtype.
template <class F>
Status dispatch_floating(DType dtype, F&& f) {
  switch (dtype) {
    case DType::fp32:
      return f(TypeTag<float>{});
    case DType::fp16:
      return f(TypeTag<__half>{});
    case DType::bf16:
      return f(TypeTag<__nv_bfloat16>{});
    default:
      return error(Errc::unsupported, std::string("CUDA kernels take fp32, fp16 or bf16, not ") +
                                          std::string(dtype_name(dtype)));
  }
}

template <class F>
Status dispatch_label(DType dtype, F&& f) {
  switch (dtype) {
    case DType::int32:
      return f(TypeTag<std::int32_t>{});
    case DType::int64:
      return f(TypeTag<std::int64_t>{});
    default:
      return error(Errc::unsupported, std::string("labels must be int32 or int64, not ") +
                                          std::string(dtype_name(dtype)));
  }
}

// Packs: 16 bytes of T moved by one access, converted to and from float.
// Elements of T in 16 bytes: the widest load per thread.
template <class T>
inline constexpr int kPack = 16 / static_cast<int>(sizeof(T));

// P elements moved as one access; P is kPack<T> where the tensor allows it, else 1.
template <class T, int P>
struct alignas(sizeof(T) * P) Pack {
  T v[P];
};

// A pack as it is in memory: a kernel that loads several before it uses any keeps these (P / 2
// registers in fp16) rather than the P floats they convert to.
template <class T, int P>
__device__ __forceinline__ Pack<T, P> load_raw(const T* p) {
  return *reinterpret_cast<const Pack<T, P>*>(p);
}

template <class T, int P>
__device__ __forceinline__ void to_floats(const Pack<T, P>& pk, float (&out)[P]) {
#pragma unroll
  for (int k = 0; k < P; ++k) out[k] = to_float(pk.v[k]);
}

template <class T, int P>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[P]) {
  to_floats(load_raw<T, P>(p), out);
}

template <class T, int P>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[P]) {
  Pack<T, P> pk;
#pragma unroll
  for (int k = 0; k < P; ++k) pk.v[k] = from_float<T>(in[k]);
  *reinterpret_cast<Pack<T, P>*>(p) = pk;
}

constexpr int kBlock = 256;

// y = relu(x * scale + bias) per channel over NHWC rows in packs of P (a grid-stride loop over
// `packs`, `channel_packs` a row), as a fused convolution's prologue computes it: the product,
// then the sum, each rounded to fp32, then one rounding to T. scale(c) and bias(c) give channel
// c's as floats.
template <int P, class T, class Scale, class Bias>
__device__ __forceinline__ void scale_bias_relu_packs(const T* x, T* y, std::int64_t packs,
                                                      int channel_packs, Scale&& scale,
                                                      Bias&& bias) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < packs;
       q += stride) {
    const int c0 = static_cast<int>(q % channel_packs) * P;
    float v[P];
    load_pack(x + q * P, v);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      v[k] = relu(__fadd_rn(__fmul_rn(v[k], scale(c0 + k)), bias(c0 + k)));
    }
    store_pack(y + q * P, v);
  }
}

// Blocks for a grid-stride loop over `work` items: enough to fill the GPU, no more.
inline unsigned grid_for(std::int64_t work, int sm_count, int block = kBlock) {
  const std::int64_t needed = std::max<std::int64_t>(1, (work + block - 1) / block);
  return static_cast<unsigned>(std::min<std::int64_t>(needed, 8LL * sm_count));
}

__device__ __forceinline__ std::int64_t imin(std::int64_t a, std::int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ std::int64_t imax(std::int64_t a, std::int64_t b) {
  return a < b ? b : a;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// Sum or max over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. Deterministic: a fixed tree for a fixed block size.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  __shared__ float result;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    float w = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0F);
    w = kMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  const float out = result;
  __syncthreads();  // the shared slots may be reused by a following call
  return out;
}

}  // namespace dlprobe::cuda
