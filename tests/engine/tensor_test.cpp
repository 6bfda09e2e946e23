#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "dlprobe/engine/tensor.h"
#include "test_util.h"

namespace dlprobe {
namespace {

using testing::desc;

TEST(TensorDesc, StridesPerLayout) {
  const TensorDesc a = desc({2, 3, 4, 5}, DType::fp32, Layout::nchw);
  EXPECT_EQ(a.stride(0), 60);
  EXPECT_EQ(a.stride(1), 20);
  EXPECT_EQ(a.stride(2), 5);
  EXPECT_EQ(a.stride(3), 1);
  const TensorDesc b = desc({2, 3, 4, 5}, DType::fp32, Layout::nhwc);
  EXPECT_EQ(b.stride(0), 60);
  EXPECT_EQ(b.stride(1), 1);
  EXPECT_EQ(b.stride(2), 15);
  EXPECT_EQ(b.stride(3), 3);
  EXPECT_EQ(b.offset(1, 2, 3, 4), 60 + 2 + 45 + 12);
  EXPECT_EQ(a.numel(), 120);
  EXPECT_EQ(a.bytes(), 480u);
  EXPECT_EQ(b.str(), "fp32[2x3x4x5, NHWC]");
  const TensorDesc m = desc({3, 7}, DType::fp16);
  EXPECT_EQ(m.offset(2, 1), 15);
  EXPECT_EQ(m.bytes(), 42u);
  EXPECT_EQ(m.with_layout(Layout::nhwc), m);  // rank 2 has one layout
}

TEST(TensorDesc, RefusesBadShapes) {
  auto zero = TensorDesc::make({2, 0, 3, 3}, DType::fp32);
  ASSERT_FALSE(zero.has_value());
  EXPECT_EQ(zero.status().message(), "tensor shape 2x0x3x3 has a dimension < 1");
  EXPECT_FALSE(TensorDesc::make(Shape{}, DType::fp32).has_value());
  auto nhwc = TensorDesc::make({4, 5}, DType::fp32, Layout::nhwc);
  ASSERT_FALSE(nhwc.has_value());
  EXPECT_EQ(nhwc.status().message(), "layout NHWC needs a rank-4 tensor, got shape 4x5");
  // 2^40 images of 3x2^16x2^16 are 3 * 2^72 values: the count wraps around, to 0 at 2^64.
  auto huge = TensorDesc::make({1LL << 40, 3, 1 << 16, 1 << 16}, DType::fp32);
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.status().message(),
            "shape 1099511627776x3x65536x65536 has too many elements: its size overflows 64 bits");
  EXPECT_TRUE(TensorDesc::make({1LL << 20, 3, 1 << 15, 1 << 15}, DType::fp64).has_value());
  EXPECT_EQ(*parse_layout("nhwc"), Layout::nhwc);
  EXPECT_FALSE(parse_layout("chwn").has_value());
}

TEST(HostTensor, NewTensorsArePoisonedNotZero) {
  HostTensor t(desc({2, 3}, DType::fp32));
  for (float v : t.values<float>()) EXPECT_TRUE(std::isnan(v));
  HostTensor z = HostTensor::zeros(desc({2, 3}, DType::bf16));
  for (std::int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.get(i), 0.0);
}

TEST(HostTensor, RandomIsDeterministicAndInRange) {
  const TensorDesc d = desc({4, 3, 5, 5}, DType::fp64);
  HostTensor a = HostTensor::random(d, 7, -2.0, 3.0);
  HostTensor b = HostTensor::random(d, 7, -2.0, 3.0);
  HostTensor c = HostTensor::random(d, 8, -2.0, 3.0);
  int differ = 0;
  double lo = 1e9, hi = -1e9;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_EQ(a.get(i), b.get(i));
    differ += a.get(i) != c.get(i);
    lo = std::min(lo, a.get(i));
    hi = std::max(hi, a.get(i));
  }
  EXPECT_EQ(differ, a.numel());
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_LT(lo, -1.5);  // spread over the range, not bunched
  EXPECT_GT(hi, 2.5);
  // The generator is ours (SplitMix64; its first output for seed 0 is 0xE220A8397B1DCDAF), so
  // the values are the same on every platform.
  EXPECT_DOUBLE_EQ(HostTensor::random(desc({1}), 0).get(0), 0.7666216164272852);
  HostTensor labels = HostTensor::random(desc({1000}, DType::int32), 3, 0, 10);
  std::array<int, 10> seen{};
  for (std::int32_t v : labels.values<std::int32_t>()) {
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 10);
    ++seen[static_cast<std::size_t>(v)];
  }
  for (int s : seen) EXPECT_GT(s, 50);
}

// Whole-tensor loops run on several threads (parallel_for); on tensors of several threads'
// worth, the values are still those of one pass in storage order: draw i + 1 of SplitMix64 for
// element i, each element converted alone, each moved to its own index.
TEST(HostTensor, ThreadedLoopsGiveTheValuesOfOnePass) {
  const TensorDesc d = desc({64, 8, 32, 32}, DType::fp32);  // 2^19 elements: several threads'
  const HostTensor a = HostTensor::random(d, 11, -2.0, 2.0);
  std::uint64_t state = 11;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    ASSERT_EQ(a.values<float>()[static_cast<std::size_t>(i)], static_cast<float>(-2.0 + 4.0 * u))
        << "element " << i;
  }
  const HostTensor h = a.to_dtype(DType::fp16).value();
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    ASSERT_EQ(h.values<Half>()[k], float_to_half(a.values<float>()[k])) << "element " << i;
  }
  const HostTensor n = h.to_layout(Layout::nhwc);
  for (std::int64_t b = 0; b < 64; b += 9) {
    for (std::int64_t c = 0; c < 8; ++c) {
      for (std::int64_t y = 0; y < 32; y += 5) {
        for (std::int64_t x = 0; x < 32; ++x) {
          ASSERT_EQ(n.at<Half>(b, c, y, x), h.at<Half>(b, c, y, x)) << b << c << y << x;
        }
      }
    }
  }
  // Fills take 2^20 elements a thread at least.
  const HostTensor nan(desc({4, 8, 256, 257}, DType::fp16));
  for (std::int64_t i = 0; i < nan.numel(); ++i) ASSERT_TRUE(std::isnan(nan.get(i))) << i;
  const HostTensor zero = HostTensor::zeros(desc({4, 8, 256, 257}, DType::bf16));
  for (std::int64_t i = 0; i < zero.numel(); ++i) ASSERT_EQ(zero.get(i), 0.0) << i;
}

TEST(HostTensor, LayoutConversionKeepsLogicalValues) {
  HostTensor a = testing::rand({2, 3, 4, 5}, 1, DType::fp32, Layout::nchw);
  HostTensor b = a.to_layout(Layout::nhwc);
  EXPECT_EQ(b.layout(), Layout::nhwc);
  EXPECT_EQ(b.at<float>(1, 2, 3, 4), a.at<float>(1, 2, 3, 4));
  EXPECT_EQ(b.values<float>()[1], a.at<float>(0, 1, 0, 0));  // channels are adjacent in NHWC
  EXPECT_TRUE(testing::all_close(b, a, 0, 0));
  HostTensor c = b.to_layout(Layout::nchw);
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(c.get(i), a.get(i));
}

TEST(HostTensor, DTypeConversion) {
  HostTensor a = HostTensor::zeros(desc({4}, DType::fp64));
  a.set(0, 1.0 / 3.0);
  a.set(1, 70000.0);
  a.set(2, 1e-8);
  a.set(3, -2.5);
  HostTensor hf = a.to_dtype(DType::fp16).value();
  EXPECT_EQ(hf.values<Half>()[0], float_to_half(1.0f / 3.0f));
  EXPECT_TRUE(std::isinf(hf.get(1)));
  EXPECT_EQ(hf.get(2), std::ldexp(0.0, 0));  // below half of the smallest subnormal
  EXPECT_EQ(hf.get(3), -2.5);
  HostTensor bf = a.to_dtype(DType::bf16).value();
  EXPECT_EQ(bf.get(1), 70144.0);  // 70000 to 8 significant bits
  HostTensor back = bf.to_dtype(DType::fp64).value();
  EXPECT_EQ(back.get(3), -2.5);

  HostTensor i64 = HostTensor::zeros(desc({2}, DType::int64));
  i64.values<std::int64_t>()[1] = 5;
  HostTensor i32 = i64.to_dtype(DType::int32).value();
  EXPECT_EQ(i32.values<std::int32_t>()[1], 5);
  i64.values<std::int64_t>()[0] = std::int64_t{1} << 40;
  auto too_big = i64.to_dtype(DType::int32);
  ASSERT_FALSE(too_big.has_value());
  EXPECT_EQ(too_big.status().message(), "value 1099511627776 at element 0 does not fit int32");
  auto mixed = a.to_dtype(DType::int32);
  ASSERT_FALSE(mixed.has_value());
  EXPECT_EQ(mixed.status().code(), Errc::unsupported);
}

TEST(HostTensor, ViewPointsAtStorage) {
  HostTensor a = testing::rand({3, 2}, 5, DType::fp32);
  TensorView v = a.view();
  EXPECT_EQ(v.data, a.data());
  EXPECT_EQ(v.desc, a.desc());
}

// The test helper that graph-replay tests compare runs with: NaN equals NaN and inf equals inf,
// across layouts, and one differing element fails it.
TEST(TestUtil, IdenticalTreatsNanAsEqualAndFindsOneDifference) {
  HostTensor a = testing::rand({2, 3, 2, 2}, 9, DType::fp32, Layout::nchw);
  a.set(1, std::numeric_limits<double>::quiet_NaN());
  a.set(2, std::numeric_limits<double>::infinity());
  const HostTensor b = a.to_layout(Layout::nhwc);
  EXPECT_TRUE(testing::identical(b, a));
  HostTensor c = a;
  c.set(5, c.get(5) + 1.0);
  const ::testing::AssertionResult r = testing::identical(c, a);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("1 of 24 elements differ"), std::string::npos)
      << r.message();
}

}  // namespace
}  // namespace dlprobe
