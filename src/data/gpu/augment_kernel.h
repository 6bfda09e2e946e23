// The augmentation on the GPU: each sample's crop of its decoded image (8-bit interleaved RGB on
// the device, or JPEG's Y, Cb and Cr planes converted at each pixel read as ycbcr.h does) resized
// to size x size, flipped, normalised and written into the batch in the step's element type and
// layout, one launch per batch. The arithmetic is the host's (resize_normalize in augment.cpp:
// half-pixel bilinear taps computed in double, edges clamped to the crop, horizontal blend then
// vertical, one multiply-add to normalise), so that the two paths give the same sample from the
// same pixels.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "data/gpu/ycbcr.h"
#include "dlprobe/data/augment.h"

namespace dlprobe::data::gpu {

// One sample: where its decoded pixels are and what to take from them.
struct AugmentJob {
  // Device memory, rows of `pitch` bytes: interleaved RGB, or with `ycbcr` the Y plane.
  const std::uint8_t* pixels = nullptr;
  std::int64_t pitch = 0;
  int ycbcr = 0;
  ChromaPlane cb;  // with `ycbcr`
  ChromaPlane cr;
  int width = 0;
  int height = 0;
  double x = 0;  // the region of the image, in its pixels
  double y = 0;
  double region_width = 0;
  double region_height = 0;
  int flip = 0;
};

struct AugmentParams {
  int size = 224;
  SampleType type = SampleType::fp32;
  SampleLayout layout = SampleLayout::nchw;
  std::array<float, 3> scale{};  // (v / 255 - mean) / std as v * scale + shift
  std::array<float, 3> shift{};
};

AugmentParams augment_params(const AugmentOptions& options);

// `count` jobs (device memory) into `out` (device memory, count * sample_bytes), on `stream`.
cudaError_t launch_augment(const AugmentJob* jobs, int count, const AugmentParams& params,
                           void* out, cudaStream_t stream);

}  // namespace dlprobe::data::gpu
