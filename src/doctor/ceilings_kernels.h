// The few device kernels the ceilings need, behind a host-only interface: the orchestration in
// ceilings_gpu.cpp is compiled by the host compiler, which (unlike nvcc's front end) handles fmt's
// compile-time format checks under C++20.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dlprobe::kernels {

enum class FillType { f32, f16, bf16, fp8_e4m3 };

// Fills `n` elements with deterministic pseudo-random values in [-1, 1), converted to `type`.
cudaError_t fill_random(void* p, std::size_t n, FillType type, std::uint64_t seed,
                        cudaStream_t stream);
// Copies `bytes` (a multiple of 16) from `src` to `dst` with 16-byte vector loads and stores.
cudaError_t copy_16b(const void* src, void* dst, std::size_t bytes, cudaStream_t stream);

}  // namespace dlprobe::kernels
