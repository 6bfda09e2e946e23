#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>

#include "dlprobe/engine/dtype.h"

namespace dlprobe {
namespace {

std::uint16_t h(float f) {
  return float_to_half(f).bits;
}
std::uint16_t b(float f) {
  return float_to_bf16(f).bits;
}
float f32(std::uint32_t bits) {
  return std::bit_cast<float>(bits);
}

TEST(DType, SizesNamesParse) {
  EXPECT_EQ(dtype_size(DType::fp64), 8u);
  EXPECT_EQ(dtype_size(DType::fp32), 4u);
  EXPECT_EQ(dtype_size(DType::fp16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::int32), 4u);
  EXPECT_EQ(dtype_size(DType::int64), 8u);
  for (DType t : {DType::fp64, DType::fp32, DType::fp16, DType::bf16, DType::int32, DType::int64}) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(*parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(*parse_dtype("half"), DType::fp16);
  EXPECT_EQ(*parse_dtype("long"), DType::int64);
  auto bad = parse_dtype("fp8", "--dtype");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().message(),
            "--dtype: unknown dtype 'fp8' (expected fp64, fp32, fp16, bf16, int32 or int64)");
  EXPECT_TRUE(dtype_is_floating(DType::bf16));
  EXPECT_FALSE(dtype_is_floating(DType::int32));
  static_assert(dtype_of<Half> == DType::fp16 && dtype_of<std::int64_t> == DType::int64);
}

TEST(Half, ExactValues) {
  EXPECT_EQ(h(0.0f), 0x0000);
  EXPECT_EQ(h(-0.0f), 0x8000);
  EXPECT_EQ(h(1.0f), 0x3C00);
  EXPECT_EQ(h(-2.0f), 0xC000);
  EXPECT_EQ(h(0.5f), 0x3800);
  EXPECT_EQ(h(65504.0f), 0x7BFF);               // largest finite
  EXPECT_EQ(h(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(half_to_float(Half{0x3555}), 0x1.554p-2f);
  EXPECT_EQ(half_to_float(Half{0xFBFF}), -65504.0f);
}

TEST(Half, TiesRoundToEven) {
  const float ulp = std::ldexp(1.0f, -10);                     // half's spacing just above 1
  EXPECT_EQ(h(1.0f + ulp / 2), 0x3C00);                        // tie, 0x3C00 even
  EXPECT_EQ(h(1.0f + 3 * ulp / 2), 0x3C02);                    // tie, 0x3C02 even
  EXPECT_EQ(h(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3C01);  // just past the tie
  EXPECT_EQ(h(std::nextafter(1.0f + 3 * ulp / 2, 0.0f)), 0x3C01);
  EXPECT_EQ(h(-(1.0f + ulp / 2)), 0xBC00);
  // A mantissa carry crosses into the next binade: 2 - 2^-11 is a tie between 0x3FFF and 2.0.
  EXPECT_EQ(h(2.0f - std::ldexp(1.0f, -11)), 0x4000);
}

TEST(Half, OverflowInfinityNaN) {
  EXPECT_EQ(h(65519.996f), 0x7BFF);  // below the tie with 2^16
  EXPECT_EQ(h(65520.0f), 0x7C00);    // the tie goes to even: infinity
  EXPECT_EQ(h(1e6f), 0x7C00);
  EXPECT_EQ(h(-1e30f), 0xFC00);
  EXPECT_EQ(h(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(h(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(std::isinf(half_to_float(Half{0x7C00})));
  // Any NaN stays NaN and quiet, even one whose payload is only in bits that are dropped.
  for (std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const std::uint16_t r = h(f32(nan));
    EXPECT_EQ(r & 0x7C00, 0x7C00) << std::hex << nan;
    EXPECT_NE(r & 0x0200, 0) << std::hex << nan;
    EXPECT_EQ(r & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
  }
  EXPECT_TRUE(std::isnan(half_to_float(Half{0x7E00})));
  EXPECT_TRUE(std::isnan(half_to_float(Half{0x7C01})));
}

TEST(Half, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest subnormal
  EXPECT_EQ(h(tiny), 0x0001);
  EXPECT_EQ(h(-tiny), 0x8001);
  EXPECT_EQ(h(tiny / 2), 0x0000);                        // tie with zero: even
  EXPECT_EQ(h(std::nextafter(tiny / 2, 1.0f)), 0x0001);  // just past it
  EXPECT_EQ(h(std::nextafter(tiny / 2, 0.0f)), 0x0000);
  EXPECT_EQ(h(3 * tiny / 2), 0x0002);    // tie between 1 and 2
  EXPECT_EQ(h(1023 * tiny), 0x03FF);     // largest subnormal
  EXPECT_EQ(h(1023.5f * tiny), 0x0400);  // tie rounds up into the normals
  EXPECT_EQ(h(1e-30f), 0x0000);
  EXPECT_EQ(h(f32(0x00000001u)), 0x0000);  // float subnormal
  EXPECT_EQ(half_to_float(Half{0x0001}), tiny);
  EXPECT_EQ(half_to_float(Half{0x83FF}), -1023 * tiny);
}

TEST(BFloat16, ExactTiesOverflowNaN) {
  EXPECT_EQ(b(1.0f), 0x3F80);
  EXPECT_EQ(b(-0.0f), 0x8000);
  EXPECT_EQ(b(f32(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(b(f32(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(b(f32(0x3F808001u)), 0x3F81);
  EXPECT_EQ(b(f32(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(b(f32(0x7F7F7FFFu)), 0x7F7F);                   // rounds to the largest finite bf16
  EXPECT_EQ(b(std::numeric_limits<float>::max()), 0x7F80);  // past the tie: infinity
  EXPECT_EQ(b(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(b(f32(0x00008000u)), 0x0000);  // subnormal tie with zero
  EXPECT_EQ(b(f32(0x00018000u)), 0x0002);  // subnormal tie, even above
  EXPECT_EQ(b(f32(0x00008001u)), 0x0001);
  for (std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const std::uint16_t r = b(f32(nan));
    EXPECT_TRUE(std::isnan(bf16_to_float(BFloat16{r}))) << std::hex << nan;
    EXPECT_NE(r & 0x0040, 0) << std::hex << nan;
  }
  EXPECT_EQ(bf16_to_float(BFloat16{0x4049}), 3.140625f);
}

// Every 16-bit pattern survives widening and narrowing back; NaNs come back quiet.
TEST(Half, EveryPatternRoundTrips) {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const Half x{static_cast<std::uint16_t>(bits)};
    const bool nan = (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0;
    const std::uint16_t want = nan ? static_cast<std::uint16_t>(bits | 0x0200) : x.bits;
    ASSERT_EQ(float_to_half(half_to_float(x)).bits, want) << std::hex << bits;
  }
}

TEST(BFloat16, EveryPatternRoundTrips) {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const BFloat16 x{static_cast<std::uint16_t>(bits)};
    const bool nan = (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0;
    const std::uint16_t want = nan ? static_cast<std::uint16_t>(bits | 0x0040) : x.bits;
    ASSERT_EQ(float_to_bf16(bf16_to_float(x)).bits, want) << std::hex << bits;
  }
}

// Nearest-even checked from its definition: no neighbouring 16-bit value is nearer, and on a tie
// the result is even. Random float bit patterns cover every binade, subnormals included.
void check_nearest_even(const std::function<std::uint16_t(float)>& narrow,
                        const std::function<float(std::uint16_t)>& widen, std::uint16_t inf_bits,
                        std::uint32_t max_float_bits) {
  std::mt19937 gen(1234);  // mt19937's sequence is fixed by the standard
  for (int i = 0; i < 200000; ++i) {
    const auto fb =
        static_cast<std::uint32_t>(gen() % (max_float_bits + 1));  // positive, finite, in range
    const float f = f32(fb);
    const std::uint16_t r = narrow(f);
    if (r == inf_bits) continue;  // overflow is checked by the exact-value tests
    const double err = std::abs(static_cast<double>(widen(r)) - f);
    for (int step : {-1, 1}) {
      const int nb = r + step;
      if (nb < 0 || nb >= inf_bits) continue;
      const double other = std::abs(static_cast<double>(widen(static_cast<std::uint16_t>(nb))) - f);
      ASSERT_LE(err, other) << std::hex << fb;
      if (err == other) {
        ASSERT_EQ(r & 1, 0) << std::hex << fb;
      }
    }
  }
}

TEST(Half, RandomFloatsRoundToNearestEven) {
  check_nearest_even(
      h, [](std::uint16_t x) { return half_to_float(Half{x}); }, 0x7C00, 0x477FFFFFu);
}

TEST(BFloat16, RandomFloatsRoundToNearestEven) {
  check_nearest_even(
      b, [](std::uint16_t x) { return bf16_to_float(BFloat16{x}); }, 0x7F80, 0x7F7FFFFFu);
}

}  // namespace
}  // namespace dlprobe
