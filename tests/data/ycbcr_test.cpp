// The GPU augmentation's YCbCr->RGB (src/data/gpu/ycbcr.h, compiled here for the host) against
// libjpeg-turbo's own decode to RGB, from the planes libjpeg-turbo decodes the same file to, in
// every chroma subsampling the hardware engine takes.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "data/gpu/ycbcr.h"

namespace dlprobe::data::gpu {
namespace {

// Smooth colour with texture and sharp edges, so that the chroma filter and the clamps are both
// exercised (flat colour would hide a wrong filter, noise a wrong rounding).
std::vector<unsigned char> picture(int width, int height) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> grain(-12, 12);
  std::vector<unsigned char> rgb(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const bool block = ((x / 9) + (y / 7)) % 3 == 0;
      const double s = std::sin(x * 0.11) * std::cos(y * 0.07);
      const int v[3] = {block ? 250 : static_cast<int>(128 + 120 * s),
                        static_cast<int>(128 + 100 * std::cos(x * 0.05 + y * 0.03)),
                        block ? 5 : static_cast<int>(128 - 110 * s)};
      for (int c = 0; c < 3; ++c) {
        rgb[(static_cast<std::size_t>(y) * width + x) * 3 + c] =
            static_cast<unsigned char>(clamp_level(v[c] + grain(rng)));
      }
    }
  }
  return rgb;
}

struct Compared {
  int worst = 0;
  double mean = 0;
};

// Encodes the picture with `subsampling`, decodes it to planes and to RGB with libjpeg-turbo, and
// compares ycbcr.h's RGB from the planes (chroma planes swapped where `swap` says, as a broken
// plane order would) with libjpeg-turbo's.
Compared compare(int width, int height, int subsampling, bool swap) {
  const std::vector<unsigned char> rgb = picture(width, height);
  tjhandle enc = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(
      tjCompress2(enc, rgb.data(), width, 0, height, TJPF_RGB, &jpeg, &size, subsampling, 90, 0), 0)
      << tjGetErrorStr2(enc);
  tjDestroy(enc);
  tjhandle dec = tjInitDecompress();
  std::vector<unsigned char> want(rgb.size());
  EXPECT_EQ(tjDecompress2(dec, jpeg, size, want.data(), width, 0, height, TJPF_RGB, 0), 0);
  std::vector<std::vector<unsigned char>> planes(3);
  unsigned char* dst[3];
  int strides[3];
  for (int c = 0; c < 3; ++c) {
    strides[c] = tjPlaneWidth(c, width, subsampling);
    planes[static_cast<std::size_t>(c)].resize(static_cast<std::size_t>(strides[c]) *
                                               tjPlaneHeight(c, height, subsampling));
    dst[c] = planes[static_cast<std::size_t>(c)].data();
  }
  EXPECT_EQ(tjDecompressToYUVPlanes(dec, jpeg, size, dst, width, strides, height, 0), 0);
  tjDestroy(dec);
  tjFree(jpeg);

  ChromaPlane chroma[2];
  for (int c = 0; c < 2; ++c) {
    ChromaPlane& p = chroma[swap ? 1 - c : c];
    p.data = dst[c + 1];
    p.pitch = strides[c + 1];
    p.width = tjPlaneWidth(c + 1, width, subsampling);
    p.height = tjPlaneHeight(c + 1, height, subsampling);
    p.shift_x = p.width < tjPlaneWidth(0, width, subsampling) ? 1 : 0;
    p.shift_y = p.height < tjPlaneHeight(0, height, subsampling) ? 1 : 0;
  }
  Compared out;
  long sum = 0;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      int got[3];
      ycbcr_to_rgb(dst[0][static_cast<std::int64_t>(y) * strides[0] + x],
                   upsampled(chroma[0], x, y), upsampled(chroma[1], x, y), got);
      for (int c = 0; c < 3; ++c) {
        const int d = std::abs(got[c] - want[(static_cast<std::size_t>(y) * width + x) * 3 + c]);
        out.worst = std::max(out.worst, d);
        sum += d;
      }
    }
  }
  out.mean = static_cast<double>(sum) / (3.0 * width * height);
  return out;
}

TEST(Ycbcr, AgreesWithLibjpegTurboInEverySubsamplingTheEngineTakes) {
  // Odd sizes, so that the last chroma sample covers one luma pixel.
  for (const int s : {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440}) {
    const Compared c = compare(61, 45, s, false);
    EXPECT_EQ(c.worst, 0) << "subsampling " << s << ", mean " << c.mean;
  }
}

TEST(Ycbcr, FailsWithTheChromaPlanesSwapped) {
  const Compared c = compare(61, 45, TJSAMP_420, true);
  EXPECT_GT(c.worst, 50);
  EXPECT_GT(c.mean, 5.0);
}

}  // namespace
}  // namespace dlprobe::data::gpu
