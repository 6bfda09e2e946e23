#include "dlprobe/data/augment.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <tuple>

namespace dlprobe::data {
namespace {

TEST(RandomResizedCrop, StaysInsideWithinTheScaleAndRatioRanges) {
  const AugmentOptions options;
  int fallbacks = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    const int width = 100 + static_cast<int>(i % 7) * 70;
    const int height = 90 + static_cast<int>(i % 5) * 60;
    const SampleDraw d = draw_sample(width, height, options, 1, 0, i);
    const CropBox& c = d.crop;
    ASSERT_GE(c.x, 0);
    ASSERT_GE(c.y, 0);
    ASSERT_GT(c.width, 0);
    ASSERT_GT(c.height, 0);
    ASSERT_LE(c.x + c.width, width);
    ASSERT_LE(c.y + c.height, height);
    const double share = double(c.width) * c.height / (double(width) * height);
    const double ratio = double(c.width) / c.height;
    if (c.width == width && c.height == height) {
      ++fallbacks;
      continue;
    }
    // Rounding to whole pixels moves the share and the ratio by a pixel's worth.
    EXPECT_GE(share, 0.08 * 0.9);
    EXPECT_LE(share, 1.0);
    EXPECT_GE(ratio, 0.75 * 0.93);
    EXPECT_LE(ratio, 4.0 / 3 * 1.07);
  }
  EXPECT_LT(fallbacks, 100);
}

TEST(RandomResizedCrop, IsAFunctionOfSeedEpochAndIndex) {
  const AugmentOptions options;
  const auto key = [&](std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) {
    const SampleDraw d = draw_sample(500, 375, options, seed, epoch, index);
    return std::make_tuple(d.crop.x, d.crop.y, d.crop.width, d.crop.height, d.flip);
  };
  EXPECT_EQ(key(7, 2, 11), key(7, 2, 11));
  std::set<std::tuple<int, int, int, int, bool>> seen;
  for (std::uint64_t v = 0; v < 10; ++v) {
    seen.insert(key(v, 0, 0));
    seen.insert(key(0, v + 1, 0));
    seen.insert(key(0, 0, v + 1));
  }
  EXPECT_EQ(seen.size(), 30u);
  int flips = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) flips += std::get<4>(key(3, 0, i));
  EXPECT_GT(flips, 430);
  EXPECT_LT(flips, 570);
  AugmentOptions no_flip;
  no_flip.flip = false;
  for (std::uint64_t i = 0; i < 100; ++i)
    EXPECT_FALSE(draw_sample(500, 375, no_flip, 3, 0, i).flip);
}

TEST(RandomResizedCrop, FallsBackToTheCentreCropWithTheRatioClamped) {
  const AugmentOptions options;
  SplitMix64 rng(5);
  // No crop of at least 8% of the area fits 10 pixels of height at a ratio of at most 4/3.
  EXPECT_EQ(random_resized_crop(2000, 10, options, rng), (CropBox{993, 0, 13, 10}));
  EXPECT_EQ(random_resized_crop(10, 2000, options, rng), (CropBox{0, 993, 10, 13}));
}

// Bilinear resize of the crop, independently: torch.nn.functional.interpolate(mode="bilinear",
// align_corners=False) on the cropped image, then flip, then (v / 255 - mean) / std.
std::vector<double> reference(const Image& image, CropBox crop, int size, bool flip,
                              const AugmentOptions& o) {
  std::vector<double> out(3 * size * size);
  const auto source = [](int o_index, int in, int out_size, int& i0, int& i1, double& l) {
    double src = (o_index + 0.5) * in / out_size - 0.5;
    if (src < 0) src = 0;
    i0 = std::min(static_cast<int>(std::floor(src)), in - 1);
    i1 = i0 < in - 1 ? i0 + 1 : i0;
    l = std::min(std::max(src - i0, 0.0), 1.0);
  };
  for (int oy = 0; oy < size; ++oy) {
    for (int ox = 0; ox < size; ++ox) {
      int y0, y1, x0, x1;
      double ly, lx;
      source(oy, crop.height, size, y0, y1, ly);
      source(flip ? size - 1 - ox : ox, crop.width, size, x0, x1, lx);
      for (int c = 0; c < 3; ++c) {
        const auto at = [&](int y, int x) {
          return double(image.rgb[((crop.y + y) * image.width + crop.x + x) * 3 + c]);
        };
        const double v = (1 - ly) * ((1 - lx) * at(y0, x0) + lx * at(y0, x1)) +
                         ly * ((1 - lx) * at(y1, x0) + lx * at(y1, x1));
        out[(c * size + oy) * size + ox] = (v / 255 - o.mean[c]) / o.std[c];
      }
    }
  }
  return out;
}

Image noise_image(int width, int height) {
  Image image{width, height, std::vector<std::uint8_t>(std::size_t(width) * height * 3)};
  std::mt19937 gen(42);
  for (auto& v : image.rgb) v = static_cast<std::uint8_t>(gen() & 0xFF);
  return image;
}

// Element `c, y, x` of a sample written by resize_normalize, as a double.
double element(const std::vector<std::byte>& out, const AugmentOptions& o, int c, int y, int x) {
  const std::size_t pixel = std::size_t(y) * o.size + x;
  const std::size_t i =
      o.layout == SampleLayout::nchw ? std::size_t(c) * o.size * o.size + pixel : pixel * 3 + c;
  if (o.type == SampleType::fp32) {
    float f;
    std::memcpy(&f, out.data() + i * 4, 4);
    return f;
  }
  std::uint16_t bits;
  std::memcpy(&bits, out.data() + i * 2, 2);
  if (o.type == SampleType::fp16) return static_cast<double>(std::bit_cast<_Float16>(bits));
  return std::bit_cast<float>(std::uint32_t(bits) << 16);
}

TEST(ResizeNormalize, MatchesAnIndependentBilinearReference) {
  const Image image = noise_image(11, 9);
  const CropBox crop{2, 1, 7, 6};
  for (int size : {3, 4, 13}) {
    for (bool flip : {false, true}) {
      for (SampleType type : {SampleType::fp32, SampleType::fp16, SampleType::bf16}) {
        for (SampleLayout layout : {SampleLayout::nchw, SampleLayout::nhwc}) {
          AugmentOptions o;
          o.size = size;
          o.type = type;
          o.layout = layout;
          std::vector<std::byte> out(sample_bytes(o));
          resize_normalize(image, {2, 1, 7, 6}, flip, o, out);
          const auto expected = reference(image, crop, size, flip, o);
          // fp32 arithmetic, then the element type's rounding (11 and 8 significant bits).
          const double relative =
              type == SampleType::fp32 ? 1e-5 : (type == SampleType::fp16 ? 1.0 / 1024 : 1.0 / 128);
          for (int c = 0; c < 3; ++c) {
            for (int y = 0; y < size; ++y) {
              for (int x = 0; x < size; ++x) {
                const double want = expected[(c * size + y) * size + x];
                ASSERT_NEAR(element(out, o, c, y, x), want, relative * std::abs(want) + 1e-5)
                    << "size " << size << " flip " << flip << " type " << sample_type_name(type)
                    << " layout " << sample_layout_name(layout) << " at " << c << "," << y << ","
                    << x;
              }
            }
          }
        }
      }
    }
  }
}

TEST(ResizeNormalize, ScaledRegionMapsTheCropOntoASmallerDecode) {
  Image half{50, 38, {}};
  const Region r = scaled_region(CropBox{10, 20, 40, 30}, 100, 76, half);
  EXPECT_DOUBLE_EQ(r.x, 5);
  EXPECT_DOUBLE_EQ(r.y, 10);
  EXPECT_DOUBLE_EQ(r.width, 20);
  EXPECT_DOUBLE_EQ(r.height, 15);
}

TEST(SampleType, NamesParse) {
  EXPECT_EQ(*parse_sample_type("bf16"), SampleType::bf16);
  EXPECT_EQ(*parse_sample_type("float16"), SampleType::fp16);
  EXPECT_FALSE(parse_sample_type("fp8"));
  EXPECT_EQ(*parse_sample_layout("nhwc"), SampleLayout::nhwc);
  EXPECT_FALSE(parse_sample_layout("chwn"));
  AugmentOptions o;
  o.type = SampleType::bf16;
  EXPECT_EQ(sample_bytes(o), 3u * 224 * 224 * 2);
}

}  // namespace
}  // namespace dlprobe::data
