// Tensor-core data types and the theoretical-peak formulas against NVIDIA's published figures.
#include <gtest/gtest.h>

#include <algorithm>

#include "dlprobe/doctor/ceilings.h"
#include "dlprobe/doctor/gpu_arch.h"

namespace dlprobe {
namespace {

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(GpuArch, TensorCoreDtypes) {
  EXPECT_TRUE(tensor_core_dtypes(6, 1).empty());
  EXPECT_EQ(tensor_core_dtypes(7, 0), std::vector<std::string>{"fp16"});
  auto turing = tensor_core_dtypes(7, 5);
  EXPECT_TRUE(contains(turing, "int8"));
  EXPECT_FALSE(contains(turing, "bf16"));
  auto ampere = tensor_core_dtypes(8, 0);
  EXPECT_TRUE(contains(ampere, "tf32"));
  EXPECT_TRUE(contains(ampere, "bf16"));
  EXPECT_FALSE(contains(ampere, "fp8"));
  EXPECT_TRUE(contains(tensor_core_dtypes(8, 9), "fp8"));
  EXPECT_FALSE(contains(tensor_core_dtypes(8, 6), "fp64"));
  auto hopper = tensor_core_dtypes(9, 0);
  EXPECT_TRUE(contains(hopper, "fp8"));
  EXPECT_TRUE(contains(hopper, "fp64"));
  EXPECT_FALSE(contains(hopper, "fp4"));
  EXPECT_TRUE(contains(tensor_core_dtypes(10, 0), "fp4"));
}

TEST(GpuArch, DtypeNames) {
  for (GemmDtype d : kAllGemmDtypes) EXPECT_EQ(parse_gemm_dtype(gemm_dtype_name(d)), d);
  EXPECT_EQ(parse_gemm_dtype("fp64"), std::nullopt);
}

TEST(GpuArch, H100SxmMatchesWhitepaper) {
  // H100 SXM5: 132 SMs; the whitepaper's dense peaks are at 1830 MHz for tensor cores.
  EXPECT_NEAR(*theoretical_gemm_tflops(9, 0, 132, 1830, GemmDtype::bf16), 989.4, 0.5);
  EXPECT_NEAR(*theoretical_gemm_tflops(9, 0, 132, 1830, GemmDtype::fp16), 989.4, 0.5);
  EXPECT_NEAR(*theoretical_gemm_tflops(9, 0, 132, 1830, GemmDtype::tf32), 494.7, 0.5);
  EXPECT_NEAR(*theoretical_gemm_tflops(9, 0, 132, 1830, GemmDtype::fp8_e4m3), 1978.9, 0.5);
  // ... and 66.9 TFLOP/s fp32 on the CUDA cores at 1980 MHz.
  EXPECT_NEAR(*theoretical_gemm_tflops(9, 0, 132, 1980, GemmDtype::fp32), 66.9, 0.1);
}

TEST(GpuArch, H200MeasuredFiguresStayBelowTheoretical) {
  // The reference figures measured on the target H200 (132 SMs, max 1980 MHz) must be below the
  // theoretical peak, or the per-SM table is wrong.
  const struct {
    GemmDtype dtype;
    double measured;
  } h200[] = {{GemmDtype::fp32, 51.3},
              {GemmDtype::tf32, 417.5},
              {GemmDtype::fp16, 764.9},
              {GemmDtype::bf16, 793.7}};
  for (const auto& m : h200) {
    SCOPED_TRACE(gemm_dtype_name(m.dtype));
    auto peak = theoretical_gemm_tflops(9, 0, 132, 1980, m.dtype);
    ASSERT_TRUE(peak);
    EXPECT_LT(m.measured, *peak);
    EXPECT_GT(m.measured, 0.5 * *peak);
  }
}

TEST(GpuArch, A100) {
  // A100 SXM4: 108 SMs at 1410 MHz: 312 TFLOP/s bf16, 156 tf32, 19.5 fp32.
  EXPECT_NEAR(*theoretical_gemm_tflops(8, 0, 108, 1410, GemmDtype::bf16), 311.9, 0.5);
  EXPECT_NEAR(*theoretical_gemm_tflops(8, 0, 108, 1410, GemmDtype::tf32), 155.9, 0.5);
  EXPECT_NEAR(*theoretical_gemm_tflops(8, 0, 108, 1410, GemmDtype::fp32), 19.5, 0.1);
  EXPECT_EQ(theoretical_gemm_tflops(8, 0, 108, 1410, GemmDtype::fp8_e4m3), std::nullopt);
}

TEST(GpuArch, UnknownOrMissingUnits) {
  EXPECT_EQ(dense_flops_per_clock_per_sm(12, 0, GemmDtype::bf16), std::nullopt);
  EXPECT_EQ(dense_flops_per_clock_per_sm(7, 5, GemmDtype::bf16), std::nullopt);
  EXPECT_EQ(dense_flops_per_clock_per_sm(7, 5, GemmDtype::tf32), std::nullopt);
  EXPECT_EQ(theoretical_gemm_tflops(9, 0, 0, 1980, GemmDtype::bf16), std::nullopt);
}

TEST(GpuArch, MemoryBandwidth) {
  // H100 SXM: 5120-bit HBM3 at 2619 MHz -> 3.35 TB/s; H200: 6144-bit HBM3e at 3201 MHz.
  EXPECT_NEAR(theoretical_memory_bandwidth_gbs(5120, 2619), 3352.3, 0.5);
  EXPECT_NEAR(theoretical_memory_bandwidth_gbs(6144, 3201), 4917.1, 0.5);
}

TEST(GpuArch, Pcie) {
  EXPECT_NEAR(*theoretical_pcie_gbs(5, 16), 63.0, 0.1);
  EXPECT_NEAR(*theoretical_pcie_gbs(4, 16), 31.5, 0.1);
  EXPECT_NEAR(*theoretical_pcie_gbs(3, 8), 7.88, 0.01);
  EXPECT_NEAR(*theoretical_pcie_gbs(2, 16), 8.0, 0.01);
  EXPECT_EQ(theoretical_pcie_gbs(9, 16), std::nullopt);
  EXPECT_EQ(theoretical_pcie_gbs(5, 0), std::nullopt);
}

TEST(GemmCheck, TolerancesOrdered) {
  // Coarser formats allow more error; all stay far below what a wrong GEMM gives (~0.1).
  EXPECT_LT(gemm_check_tolerance(GemmDtype::fp32), gemm_check_tolerance(GemmDtype::fp16));
  EXPECT_LT(gemm_check_tolerance(GemmDtype::fp16), gemm_check_tolerance(GemmDtype::bf16));
  for (GemmDtype d : kAllGemmDtypes) EXPECT_LE(gemm_check_tolerance(d), 0.02);
}

}  // namespace
}  // namespace dlprobe
