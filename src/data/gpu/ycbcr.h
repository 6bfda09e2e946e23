// JPEG's YCbCr planes to RGB at one pixel, as libjpeg-turbo's default decode computes it: the
// chroma planes upsampled by its "fancy" triangle filter (3/4 of the nearer chroma sample, 1/4
// of the next, per subsampled direction; edges repeat) and rounded, then its fixed-point
// YCbCr->RGB (16 fraction bits, clamped to 0..255). The GPU augmentation samples nvJPEG's planes
// through it, so that nvJPEG need not convert each whole image with a kernel of its own; the host
// compiles it too, for its test against libjpeg-turbo.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DLPROBE_HOST_DEVICE __host__ __device__
#else
#define DLPROBE_HOST_DEVICE
#endif

namespace dlprobe::data::gpu {

// One chroma plane and how it covers the luma plane: shift 1 where it is subsampled by 2.
struct ChromaPlane {
  const std::uint8_t* data = nullptr;
  std::int64_t pitch = 0;
  int width = 0;
  int height = 0;
  int shift_x = 0;
  int shift_y = 0;
};

DLPROBE_HOST_DEVICE inline int clamp_index(int i, int limit) {
  return i < 0 ? 0 : (i >= limit ? limit - 1 : i);
}

// The plane's value at luma pixel (x, y). A subsampled sample j sits at luma 2j + 0.5, so luma x
// falls at x / 2 - 0.25: weights 3/4 and 1/4 between the two samples around it. The rounding is
// libjpeg-turbo's, which differs between even and odd pixels (jdsample.c: h2v1 and h1v2 add 1 or
// 2 quarters, h2v2 8 or 7 sixteenths).
DLPROBE_HOST_DEVICE inline int upsampled(const ChromaPlane& p, int x, int y) {
  int j0 = x;
  int j1 = x;
  int wx = 0;  // in quarters, the share of j1
  if (p.shift_x != 0) {
    j0 = x >> 1;
    j1 = (x & 1) != 0 ? j0 + 1 : j0 - 1;
    wx = 1;
  }
  int i0 = y;
  int i1 = y;
  int wy = 0;
  if (p.shift_y != 0) {
    i0 = y >> 1;
    i1 = (y & 1) != 0 ? i0 + 1 : i0 - 1;
    wy = 1;
  }
  j0 = clamp_index(j0, p.width);
  j1 = clamp_index(j1, p.width);
  i0 = clamp_index(i0, p.height);
  i1 = clamp_index(i1, p.height);
  const std::uint8_t* r0 = p.data + static_cast<std::int64_t>(i0) * p.pitch;
  const std::uint8_t* r1 = p.data + static_cast<std::int64_t>(i1) * p.pitch;
  // In sixteenths of a level.
  const int sum =
      (4 - wy) * ((4 - wx) * r0[j0] + wx * r0[j1]) + wy * ((4 - wx) * r1[j0] + wx * r1[j1]);
  int bias = 8;
  if (p.shift_x != 0 && p.shift_y != 0) {
    bias = (x & 1) != 0 ? 7 : 8;
  } else if (p.shift_x != 0) {
    bias = (x & 1) != 0 ? 8 : 4;
  } else if (p.shift_y != 0) {
    bias = (y & 1) != 0 ? 8 : 4;
  }
  return (sum + bias) >> 4;
}

DLPROBE_HOST_DEVICE inline int clamp_level(int v) {
  return v < 0 ? 0 : (v > 255 ? 255 : v);
}

// libjpeg's ycc_rgb_convert: FIX(c) = c * 65536 rounded, ONE_HALF = 32768.
DLPROBE_HOST_DEVICE inline void ycbcr_to_rgb(int luma, int cb, int cr, int rgb[3]) {
  constexpr int kHalf = 1 << 15;
  const int b = cb - 128;
  const int r = cr - 128;
  rgb[0] = clamp_level(luma + ((91881 * r + kHalf) >> 16));  // FIX(1.40200)
  rgb[1] =
      clamp_level(luma + ((-22554 * b - 46802 * r + kHalf) >> 16));  // FIX(0.34414), FIX(0.71414)
  rgb[2] = clamp_level(luma + ((116130 * b + kHalf) >> 16));         // FIX(1.77200)
}

}  // namespace dlprobe::data::gpu
