// What a GPU architecture can do on paper: the tensor-core data types per compute capability and
// the theoretical peaks ("theoretical" everywhere they are shown) that measured ceilings are set
// against. Pure functions of the device's properties, so they are tested without a GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/named.h"

namespace dlprobe {

// The dense GEMM flavours doctor measures. Inputs/compute: fp32 = fp32 on the CUDA cores (TF32
// off); tf32 = fp32 data on tensor cores; fp16, bf16 = 16-bit inputs, fp32 accumulate; fp8_e4m3 =
// e4m3 inputs, fp32 accumulate, bf16 output.
enum class GemmDtype { fp32, tf32, fp16, bf16, fp8_e4m3 };
inline constexpr Named<GemmDtype> kGemmDtypeNames[] = {{GemmDtype::fp32, "fp32"},
                                                       {GemmDtype::tf32, "tf32"},
                                                       {GemmDtype::fp16, "fp16"},
                                                       {GemmDtype::bf16, "bf16"},
                                                       {GemmDtype::fp8_e4m3, "fp8_e4m3"}};
inline constexpr auto kAllGemmDtypes = values_of(kGemmDtypeNames);
std::string_view gemm_dtype_name(GemmDtype dtype);
std::optional<GemmDtype> parse_gemm_dtype(std::string_view name);

// The data types the tensor cores of compute capability major.minor take, e.g. {"fp16", "bf16",
// "tf32", "fp8", "int8", "fp64"} for 9.0; empty before Volta.
std::vector<std::string> tensor_core_dtypes(int cc_major, int cc_minor);

// Dense multiply-add throughput per SM per clock, counted as 2 FLOP per FMA; nullopt where dlprobe
// has no figure for the architecture (or the architecture has no such unit).
std::optional<double> dense_flops_per_clock_per_sm(int cc_major, int cc_minor, GemmDtype dtype);
// sm_count × clock × per-SM rate, in TFLOP/s.
std::optional<double> theoretical_gemm_tflops(int cc_major, int cc_minor, int sm_count,
                                              double clock_mhz, GemmDtype dtype);
// bus width × memory clock × 2 (double data rate), in GB/s (10^9 bytes).
double theoretical_memory_bandwidth_gbs(int bus_width_bits, double memory_clock_mhz);
// One direction of a PCIe link of generation `gen` and `width` lanes, after line encoding, in GB/s.
std::optional<double> theoretical_pcie_gbs(unsigned gen, unsigned width);

}  // namespace dlprobe
