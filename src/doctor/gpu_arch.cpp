#include "dlprobe/doctor/gpu_arch.h"

#include <algorithm>
#include <iterator>

namespace dlprobe {

std::string_view gemm_dtype_name(GemmDtype dtype) {
  return name_of(kGemmDtypeNames, dtype, "unknown");
}

std::optional<GemmDtype> parse_gemm_dtype(std::string_view name) {
  return value_named(kGemmDtypeNames, name);
}

std::vector<std::string> tensor_core_dtypes(int cc_major, int cc_minor) {
  const int cc = cc_major * 10 + cc_minor;
  if (cc < 70) return {};
  if (cc < 72) return {"fp16"};                                     // Volta
  if (cc < 80) return {"fp16", "int8", "int4"};                     // Xavier, Turing
  std::vector<std::string> out = {"fp16", "bf16", "tf32", "int8"};  // Ampere onwards
  if (cc == 80 || cc >= 90) out.emplace_back("fp64");               // A100, Hopper, Blackwell DC
  if (cc >= 89) out.emplace_back("fp8");                            // Ada, Hopper
  if (cc >= 100) {
    out.emplace_back("fp6");
    out.emplace_back("fp4");
  }
  return out;
}

// Dense rates per SM per clock, in FLOP (2 per FMA), derived from NVIDIA's architecture
// whitepapers: "NVIDIA Tesla V100 GPU Architecture" (2017), "NVIDIA Turing GPU Architecture"
// (2018), "NVIDIA A100 Tensor Core GPU Architecture" (2020), "NVIDIA Ampere GA102 GPU Architecture"
// (2020), "NVIDIA Ada GPU Architecture" (2022) and "NVIDIA H100 Tensor Core GPU Architecture"
// (2022), as peak TFLOP/s ÷ (SMs × boost clock). On sm_90 this gives 4096 FLOP/clk/SM for dense
// fp16/bf16 (989.4 TFLOP/s = 132 SMs × 1830 MHz × 4096), twice A100's 2048. GA102 and Ada figures
// are the professional boards' (A6000, L40S); GeForce boards run fp16/bf16/fp8 with fp32
// accumulate at half that rate, so on them this is an upper bound.
std::optional<double> dense_flops_per_clock_per_sm(int cc_major, int cc_minor, GemmDtype dtype) {
  struct Rates {
    int cc;
    double fp32, tf32, fp16, fp8;  // 0 = no such unit
  };
  static constexpr Rates kRates[] = {
      {70, 128, 0, 1024, 0},      {72, 128, 0, 1024, 0},       {75, 128, 0, 1024, 0},
      {80, 128, 1024, 2048, 0},   {86, 256, 512, 1024, 0},     {87, 256, 512, 1024, 0},
      {89, 256, 512, 1024, 2048}, {90, 256, 2048, 4096, 8192},
  };
  const int cc = cc_major * 10 + cc_minor;
  const Rates* r = std::find_if(std::begin(kRates), std::end(kRates),
                                [&](const Rates& rates) { return rates.cc == cc; });
  if (r == std::end(kRates)) return std::nullopt;
  double rate = 0;
  switch (dtype) {
    case GemmDtype::fp32:
      rate = r->fp32;
      break;
    case GemmDtype::tf32:
      rate = r->tf32;
      break;
    case GemmDtype::fp16:
      rate = r->fp16;
      break;
    case GemmDtype::bf16:
      rate = cc_major >= 8 ? r->fp16 : 0;  // bf16 tensor cores arrived with Ampere
      break;
    case GemmDtype::fp8_e4m3:
      rate = r->fp8;
      break;
  }
  if (rate == 0) return std::nullopt;
  return rate;
}

std::optional<double> theoretical_gemm_tflops(int cc_major, int cc_minor, int sm_count,
                                              double clock_mhz, GemmDtype dtype) {
  auto rate = dense_flops_per_clock_per_sm(cc_major, cc_minor, dtype);
  if (!rate || sm_count <= 0 || clock_mhz <= 0) return std::nullopt;
  return *rate * sm_count * clock_mhz * 1e6 / 1e12;
}

// The memory clock CUDA and NVML report is half the per-pin data rate for both GDDR and HBM, hence
// the ×2. On H200 (HBM3e, 6144-bit) that gives 3201 MHz × 2 × 768 B = 4.92 TB/s where NVIDIA quotes
// 4.8 TB/s; on H100 SXM (HBM3, 5120-bit, 2619 MHz) it gives the quoted 3.35 TB/s.
double theoretical_memory_bandwidth_gbs(int bus_width_bits, double memory_clock_mhz) {
  return bus_width_bits / 8.0 * memory_clock_mhz * 1e6 * 2 / 1e9;
}

std::optional<double> theoretical_pcie_gbs(unsigned gen, unsigned width) {
  // Transfer rate per lane in GT/s and the line encoding's efficiency (8b/10b to gen 2, 128b/130b
  // from gen 3; gen 6 uses FLIT mode, about 242/256 of the raw rate), by generation from 1.
  struct Lane {
    double gts, efficiency;
  };
  static constexpr Lane kLanes[] = {{2.5, 0.8},        {5, 0.8},          {8, 128.0 / 130},
                                    {16, 128.0 / 130}, {32, 128.0 / 130}, {64, 242.0 / 256}};
  if (gen < 1 || gen > std::size(kLanes) || width == 0) return std::nullopt;
  const Lane& lane = kLanes[gen - 1];
  return lane.gts * lane.efficiency * width / 8;
}

}  // namespace dlprobe
