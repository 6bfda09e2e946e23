// GPU tests (LABELS gpu): the GEMM computes the right thing, and the ceilings are plausible.
#include <gtest/gtest.h>

#include <algorithm>

#include "dlprobe/doctor/ceilings.h"

namespace dlprobe {
namespace {

TEST(GemmCheckGpu, EveryDtypeMatchesCpuReference) {
  for (GemmDtype dtype : kAllGemmDtypes) {
    SCOPED_TRACE(gemm_dtype_name(dtype));
    auto err = gemm_check_error(0, dtype, 384, 256, 320);
    if (!err && err.status().code() == Errc::unsupported) continue;  // fp8 before sm_89
    ASSERT_TRUE(err) << err.status().message();
    EXPECT_LE(*err, gemm_check_tolerance(dtype));
    EXPECT_GT(*err, 0.0) << "an exact match means the check compared nothing";
  }
}

TEST(GemmCheckGpu, CoarserTypesShowLargerError) {
  auto fp32 = gemm_check_error(0, GemmDtype::fp32, 256, 256, 256);
  auto bf16 = gemm_check_error(0, GemmDtype::bf16, 256, 256, 256);
  ASSERT_TRUE(fp32) << fp32.status().message();
  ASSERT_TRUE(bf16) << bf16.status().message();
  EXPECT_LT(*fp32, *bf16);
}

const GemmCeiling* find(const Ceilings& c, GemmDtype d) {
  for (const auto& g : c.gemm)
    if (g.dtype == d) return &g;
  return nullptr;
}

const BandwidthCeiling* find(const Ceilings& c, std::string_view name) {
  for (const auto& b : c.bandwidth)
    if (b.name == name) return &b;
  return nullptr;
}

TEST(CeilingsGpu, Plausible) {
  CeilingOptions o;
  o.repetitions = 5;
  auto c = measure_ceilings(0, o);
  ASSERT_TRUE(c) << c.status().message();
  const GemmCeiling* fp32 = find(*c, GemmDtype::fp32);
  const GemmCeiling* bf16 = find(*c, GemmDtype::bf16);
  ASSERT_TRUE(fp32 && bf16);
  ASSERT_TRUE(fp32->measured) << fp32->why_not;
  ASSERT_TRUE(bf16->measured) << bf16->why_not;
  EXPECT_GT(bf16->tflops, fp32->tflops);
  for (const auto& g : c->gemm) {
    SCOPED_TRACE(gemm_dtype_name(g.dtype));
    if (!g.measured) continue;
    ASSERT_TRUE(g.check_error.has_value());
    EXPECT_LE(*g.check_error, gemm_check_tolerance(g.dtype));
    EXPECT_LE(g.tflops_min, g.tflops);
    EXPECT_LE(g.tflops, g.tflops_max);
    // Above the theoretical peak means the per-SM table or the FLOP count is wrong.
    if (g.theoretical_tflops) {
      EXPECT_LT(g.tflops, *g.theoretical_tflops);
    }
  }
  const BandwidthCeiling* copy = find(*c, "device_copy_kernel");
  const BandwidthCeiling* d2d = find(*c, "device_memcpy_d2d");
  const BandwidthCeiling* h2d = find(*c, "h2d_pinned");
  ASSERT_TRUE(copy && d2d && h2d);
  ASSERT_TRUE(copy->measured) << copy->why_not;
  EXPECT_GT(copy->gbs, 100.0);
  EXPECT_GT(d2d->gbs, 100.0);
  if (copy->theoretical_gbs) {
    EXPECT_LT(copy->gbs, *copy->theoretical_gbs);
  }
  ASSERT_TRUE(h2d->measured) << h2d->why_not;
  EXPECT_GT(h2d->gbs, 1.0);
  EXPECT_LT(h2d->gbs, 200.0);
}

TEST(CeilingsGpu, BadDevice) {
  auto c = measure_ceilings(1 << 20, CeilingOptions{});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.status().code(), Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe
