#include "dlprobe/data/decoder.h"
#include "dlprobe/data/gpu_decoder.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "jpeg_files.h"

namespace dlprobe::data {
namespace {

using testing::encode;
using testing::smooth_rgb;

std::unique_ptr<Decoder> host() {
  auto d = make_host_decoder();
  EXPECT_TRUE(d) << d.status().message();
  return std::move(*d);
}

// The mean and largest absolute difference of two RGB images of the same size.
std::pair<double, int> difference(const std::vector<std::uint8_t>& a,
                                  const std::vector<std::uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  int largest = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const int d = std::abs(int(a[i]) - int(b[i]));
    sum += d;
    largest = std::max(largest, d);
  }
  return {sum / static_cast<double>(a.size()), largest};
}

TEST(HostDecoder, DecodesThePixelsThatWereEncoded) {
  const auto rgb = smooth_rgb(80, 48);
  const auto jpeg = encode(rgb, 80, 48);
  auto decoder = host();
  auto info = decoder->inspect(jpeg);
  ASSERT_TRUE(std::holds_alternative<JpegInfo>(info));
  EXPECT_EQ(std::get<JpegInfo>(info).width, 80);
  EXPECT_EQ(std::get<JpegInfo>(info).height, 48);
  EXPECT_EQ(std::get<JpegInfo>(info).components, 3);
  Image image;
  ASSERT_FALSE(decoder->decode(jpeg, {}, image));
  ASSERT_EQ(image.width, 80);
  ASSERT_EQ(image.height, 48);
  const auto [mean, largest] = difference(image.rgb, rgb);
  EXPECT_LT(mean, 1.5);
  EXPECT_LT(largest, 12);
}

TEST(HostDecoder, DecodesAtADctScale) {
  const auto rgb = smooth_rgb(81, 47);
  const auto jpeg = encode(rgb, 81, 47);
  auto decoder = host();
  const ScaleFactor half{1, 2};
  ASSERT_NE(std::find(decoder->scales().begin(), decoder->scales().end(), half),
            decoder->scales().end());
  Image image;
  ASSERT_FALSE(decoder->decode(jpeg, half, image));
  EXPECT_EQ(image.width, 41);
  EXPECT_EQ(image.height, 24);
  // Each output pixel is near the mean of its 2x2 block of the original (a smooth gradient).
  for (int y = 0; y < 23; ++y) {
    for (int x = 0; x < 40; ++x) {
      for (int c = 0; c < 3; ++c) {
        double mean = 0;
        for (int dy = 0; dy < 2; ++dy)
          for (int dx = 0; dx < 2; ++dx) mean += rgb[((2 * y + dy) * 81 + 2 * x + dx) * 3 + c];
        ASSERT_NEAR(image.rgb[(y * 41 + x) * 3 + c], mean / 4, 8) << x << "," << y << "," << c;
      }
    }
  }
}

TEST(HostDecoder, ScalesAreTheFastOnesLargestFirst) {
  auto decoder = host();
  const auto scales = decoder->scales();
  // The scales with SIMD inverse DCTs; the others decode slower than the full size.
  EXPECT_EQ(std::vector<ScaleFactor>(scales.begin(), scales.end()),
            (std::vector<ScaleFactor>{{1, 1}, {1, 2}, {1, 4}, {1, 8}}));
}

TEST(HostDecoder, SmallestCoveringScale) {
  const ScaleFactor scales[] = {{1, 1}, {7, 8}, {3, 4}, {5, 8}, {1, 2}, {3, 8}, {1, 4}, {1, 8}};
  EXPECT_EQ(smallest_covering_scale(scales, 500, 400, 224, 224), (ScaleFactor{5, 8}));
  EXPECT_EQ(smallest_covering_scale(scales, 448, 448, 224, 224), (ScaleFactor{1, 2}));
  EXPECT_EQ(smallest_covering_scale(scales, 447, 2000, 224, 224), (ScaleFactor{5, 8}));
  EXPECT_EQ(smallest_covering_scale(scales, 1792, 1792, 224, 224), (ScaleFactor{1, 8}));
  EXPECT_EQ(smallest_covering_scale(scales, 100, 100, 224, 224), (ScaleFactor{1, 1}));
}

TEST(HostDecoder, GrayscaleComesOutAsRgb) {
  std::vector<std::uint8_t> gray(64 * 40);
  for (std::size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<std::uint8_t>(i % 64 * 3);
  const auto jpeg = encode(gray, 64, 40, TJPF_GRAY, TJSAMP_GRAY);
  auto decoder = host();
  EXPECT_EQ(std::get<JpegInfo>(decoder->inspect(jpeg)).components, 1);
  Image image;
  ASSERT_FALSE(decoder->decode(jpeg, {}, image));
  ASSERT_EQ(image.rgb.size(), gray.size() * 3);
  std::vector<std::uint8_t> expected(gray.size() * 3);
  for (std::size_t i = 0; i < gray.size(); ++i) {
    EXPECT_EQ(image.rgb[3 * i], image.rgb[3 * i + 1]);
    EXPECT_EQ(image.rgb[3 * i], image.rgb[3 * i + 2]);
    for (int c = 0; c < 3; ++c) expected[3 * i + c] = gray[i];
  }
  EXPECT_LT(difference(image.rgb, expected).first, 2.0);
}

TEST(HostDecoder, CmykComesOutAsRgb) {
  const auto rgb = smooth_rgb(64, 32);
  // Inverted CMYK as libjpeg-turbo writes it: C = R / K * 255 with K the brightest channel.
  std::vector<std::uint8_t> cmyk(64 * 32 * 4);
  for (std::size_t i = 0; i < 64 * 32; ++i) {
    const int k = std::max({rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], std::uint8_t{1}});
    for (int c = 0; c < 3; ++c)
      cmyk[4 * i + c] = static_cast<std::uint8_t>(rgb[3 * i + c] * 255 / k);
    cmyk[4 * i + 3] = static_cast<std::uint8_t>(k);
  }
  const auto jpeg = encode(cmyk, 64, 32, TJPF_CMYK, TJSAMP_444);
  auto decoder = host();
  EXPECT_EQ(std::get<JpegInfo>(decoder->inspect(jpeg)).components, 4);
  Image image;
  ASSERT_FALSE(decoder->decode(jpeg, {}, image));
  const auto [mean, largest] = difference(image.rgb, rgb);
  EXPECT_LT(mean, 3.0);
  EXPECT_LT(largest, 30);
}

TEST(HostDecoder, ProgressiveDecodesAsBaseline) {
  const auto rgb = smooth_rgb(72, 56);
  const auto baseline = encode(rgb, 72, 56, TJPF_RGB, TJSAMP_420, 90);
  const auto progressive = encode(rgb, 72, 56, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE);
  ASSERT_NE(testing::find_marker(progressive, 0xC2), std::string::npos);  // SOF2: progressive
  auto decoder = host();
  Image a, b;
  ASSERT_FALSE(decoder->decode(baseline, {}, a));
  ASSERT_FALSE(decoder->decode(progressive, {}, b));
  EXPECT_LT(difference(a.rgb, b.rgb).first, 0.5);
  EXPECT_LT(difference(b.rgb, rgb).first, 2.5);
}

TEST(HostDecoder, BadFilesAreDecodeErrors) {
  auto decoder = host();
  const std::pair<std::string, DecodeFailure> expected[] = {
      {"empty", DecodeFailure::empty},     {"truncated", DecodeFailure::corrupt},
      {"corrupt", DecodeFailure::corrupt}, {"png", DecodeFailure::not_jpeg},
      {"huge", DecodeFailure::too_large},
  };
  const auto files = testing::bad_files();
  ASSERT_EQ(files.size(), std::size(expected));
  for (std::size_t i = 0; i < files.size(); ++i) {
    ASSERT_EQ(files[i].name, expected[i].first);
    Image image;
    const auto start = std::chrono::steady_clock::now();
    auto failed = decoder->decode(files[i].bytes, {}, image);
    ASSERT_TRUE(failed) << files[i].name;
    EXPECT_EQ(failed->failure, expected[i].second)
        << files[i].name << ": " << decode_failure_name(failed->failure) << " " << failed->message;
    EXPECT_FALSE(failed->message.empty());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1)) << files[i].name;
    // The decoder is fine for the next file.
    const auto next = decoder->decode(encode(smooth_rgb(16, 16), 16, 16), {}, image);
    ASSERT_FALSE(next) << files[i].name << " then: " << next->message;
  }
}

// The SOI marker and an APP0 marker's first byte, nothing else: libjpeg-turbo reads a header of
// 0x0 pixels from it, an image that is not there rather than one too large.
TEST(HostDecoder, AHeaderOfNoPixelsIsCorruptNotTooLarge) {
  auto decoder = host();
  const std::vector<std::uint8_t> stub = {0xFF, 0xD8, 0xFF, 0xE0};
  Image image;
  auto failed = decoder->decode(stub, {}, image);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->failure, DecodeFailure::corrupt)
      << decode_failure_name(failed->failure) << " " << failed->message;
  EXPECT_EQ(failed->message.find("more than"), std::string::npos) << failed->message;
}

TEST(HostDecoder, PixelLimitRefusesFromTheHeader) {
  auto limited = make_host_decoder(DecodeLimits{64 * 48 - 1});
  ASSERT_TRUE(limited);
  const auto jpeg = encode(smooth_rgb(64, 48), 64, 48);
  Image image;
  auto failed = (*limited)->decode(jpeg, {}, image);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->failure, DecodeFailure::too_large);
  EXPECT_NE(failed->message.find("64x48"), std::string::npos) << failed->message;
  EXPECT_TRUE(image.rgb.empty());
  auto enough = make_host_decoder(DecodeLimits{64 * 48});
  EXPECT_FALSE((*enough)->decode(jpeg, {}, image));
}

TEST(GpuDecoder, WithoutNvjpegOpenIsAOneLineError) {
  GpuDecoderOptions o;
  o.library = "/nonexistent/libnvjpeg.so.13";
  auto decoder = GpuDecoder::open(o);
  ASSERT_FALSE(decoder);
  EXPECT_EQ(decoder.status().code(), Errc::unavailable) << decoder.status().message();
  EXPECT_EQ(decoder.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::data
