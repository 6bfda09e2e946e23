// Measured ceilings of one GPU: the dense GEMM throughput per data type (cuBLASLt), device memory
// bandwidth and host<->device bandwidth, each next to its theoretical peak where the device's
// properties give one. Doctor reports them; bench divides by the GEMM ceiling for its MFU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/doctor/gpu_arch.h"

namespace dlprobe {

struct CeilingOptions {
  std::int64_t gemm_size = 8192;  // m = n = k: large enough to fill an H100/H200
  int warmup = 3;
  int repetitions = 10;  // the median of these is reported
  std::uint64_t workspace_bytes = 64ull << 20;
  std::uint64_t device_copy_bytes = 2ull << 30;  // per buffer, far larger than any L2
  std::uint64_t host_copy_bytes = 1ull << 30;
  std::vector<GemmDtype> dtypes = {std::begin(kAllGemmDtypes), std::end(kAllGemmDtypes)};
  bool gemm = true;
  bool device_bandwidth = true;
  bool host_bandwidth = true;
  // Before timing a data type, run the same GEMM set-up at a small size and compare with a CPU
  // reference, so a ceiling is never reported for a kernel that computes the wrong thing.
  bool check = true;
};

struct GemmCeiling {
  GemmDtype dtype = GemmDtype::fp32;
  std::int64_t m = 0, n = 0, k = 0;
  bool measured = false;
  std::string why_not;  // when not measured: unsupported here, out of memory, failed check...
  double tflops = 0;    // median over the repetitions
  double tflops_min = 0;
  double tflops_max = 0;
  std::optional<double> theoretical_tflops;
  std::optional<double> check_error;  // see gemm_check_error
  std::string layout;                 // "TN": A transposed, B not (cuBLAS column-major)
};

struct BandwidthCeiling {
  std::string name;  // device_copy_kernel, device_memcpy_d2d, h2d_pinned, d2h_pinned, h2d_pageable,
                     // d2h_pageable
  bool measured = false;
  std::string why_not;
  std::uint64_t bytes = 0;  // bytes moved per repetition (read + written for device copies)
  double gbs = 0;           // median, 10^9 bytes/s
  std::optional<double> theoretical_gbs;
};

struct Ceilings {
  int device = 0;
  std::string device_name;
  double sm_clock_mhz = 0;  // the clock the theoretical peaks assume (max boost)
  std::vector<GemmCeiling> gemm;
  std::vector<BandwidthCeiling> bandwidth;
};

// Measures on CUDA device `device`. A ceiling that cannot be measured (fp8 before sm_89, not enough
// free memory) is returned with measured = false and why_not; the Result fails only when the
// device itself cannot be used (or dlprobe was built without CUDA).
Result<Ceilings> measure_ceilings(int device, const CeilingOptions& options);

// Runs the GEMM exactly as measure_ceilings does, at m×n×k, and returns
// max |D - D_ref| / max over elements of Σ_k |a·b|, with D_ref computed in double on the CPU from
// the device's own inputs. Scaling by Σ|a·b| keeps the figure meaningful where D ≈ 0.
Result<double> gemm_check_error(int device, GemmDtype dtype, std::int64_t m, std::int64_t n,
                                std::int64_t k);
// The largest check error a correct GEMM of `dtype` gives: input rounding (tf32) and output
// rounding (fp16, bf16) bound it, with room for fp32 accumulation order.
double gemm_check_tolerance(GemmDtype dtype);

}  // namespace dlprobe
