// Device kernels of the ceilings (see ceilings_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ceilings_kernels.h"

namespace dlprobe::kernels {

namespace {

// Deterministic pseudo-random values in [-1, 1) from a hash of the index (splitmix64's finaliser),
// so inputs are never zeros (which tensor cores multiply with less power, and so faster) and need
// no cuRAND.
__device__ float hash_uniform(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t z = i + seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__global__ void fill_kernel(T* p, std::size_t n, std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    p[i] = T(hash_uniform(i, seed));
}

template <class T>
cudaError_t launch_fill(void* p, std::size_t n, std::uint64_t seed, cudaStream_t stream) {
  fill_kernel<T><<<1024, 256, 0, stream>>>(static_cast<T*>(p), n, seed);
  return cudaGetLastError();
}

// Each thread moves kUnroll 16-byte vectors, a block's accesses contiguous at every step, so each
// warp load is whole 128-byte lines and enough bytes are in flight to cover HBM latency.
constexpr unsigned kCopyThreads = 256;
constexpr unsigned kUnroll = 4;

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, std::size_t n) {
  const std::size_t base =
      static_cast<std::size_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  uint4 v[kUnroll];
#pragma unroll
  for (unsigned u = 0; u < kUnroll; ++u) {
    const std::size_t i = base + static_cast<std::size_t>(u) * blockDim.x;
    if (i < n) v[u] = src[i];
  }
#pragma unroll
  for (unsigned u = 0; u < kUnroll; ++u) {
    const std::size_t i = base + static_cast<std::size_t>(u) * blockDim.x;
    if (i < n) dst[i] = v[u];
  }
}

}  // namespace

cudaError_t fill_random(void* p, std::size_t n, FillType type, std::uint64_t seed,
                        cudaStream_t stream) {
  switch (type) {
    case FillType::f32:
      return launch_fill<float>(p, n, seed, stream);
    case FillType::f16:
      return launch_fill<__half>(p, n, seed, stream);
    case FillType::bf16:
      return launch_fill<__nv_bfloat16>(p, n, seed, stream);
    case FillType::fp8_e4m3:
      return launch_fill<__nv_fp8_e4m3>(p, n, seed, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t copy_16b(const void* src, void* dst, std::size_t bytes, cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  const std::size_t n = bytes / 16;
  const std::size_t per_block = static_cast<std::size_t>(kCopyThreads) * kUnroll;
  const auto blocks = static_cast<unsigned>((n + per_block - 1) / per_block);
  copy_kernel<<<blocks, kCopyThreads, 0, stream>>>(static_cast<const uint4*>(src),
                                                   static_cast<uint4*>(dst), n);
  return cudaGetLastError();
}

}  // namespace dlprobe::kernels
