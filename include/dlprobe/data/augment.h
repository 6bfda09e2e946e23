// The training augmentation on the host, as torchvision composes it for ImageNet:
// RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), Normalize(mean, std), fused into one
// pass that writes the sample straight into the batch buffer as fp32, fp16 or bf16, NCHW or NHWC.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "dlprobe/core/status.h"
#include "dlprobe/data/decoder.h"

namespace dlprobe::data {

enum class SampleType { fp32, fp16, bf16 };
enum class SampleLayout { nchw, nhwc };
std::string_view sample_type_name(SampleType type);
std::string_view sample_layout_name(SampleLayout layout);
// "fp32", "fp16", "bf16" (and "float32", "float16", "bfloat16").
Result<SampleType> parse_sample_type(std::string_view name);
// "nchw", "nhwc".
Result<SampleLayout> parse_sample_layout(std::string_view name);
std::size_t sample_type_size(SampleType type);

struct AugmentOptions {
  int size = 224;  // the output is size x size
  // RandomResizedCrop's ranges: the crop's share of the image's area and its width/height ratio.
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
  bool flip = true;  // horizontal flip with probability 1/2
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  SampleType type = SampleType::fp32;
  SampleLayout layout = SampleLayout::nchw;
};

// Bytes one output sample takes: 3 * size * size elements of `type`.
std::size_t sample_bytes(const AugmentOptions& options);

// A region of the full-size image, in its pixels.
struct CropBox {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
  friend bool operator==(const CropBox&, const CropBox&) = default;
};

// One sample's random draw: where to crop and whether to flip.
struct SampleDraw {
  CropBox crop;
  bool flip = false;
};

// SplitMix64: a small, fast generator whose stream is the same on every platform (std's
// distributions are not), so that a seed names the same crops everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  double uniform();                         // [0, 1)
  double uniform(double low, double high);  // [low, high)
  std::int64_t below(std::int64_t n);       // [0, n), n > 0

 private:
  std::uint64_t state_;
};

// torchvision's RandomResizedCrop.get_params on a width x height image: up to 10 tries of a random
// area share in [scale_min, scale_max] and a log-uniform ratio in [ratio_min, ratio_max] that fit
// the image, then the centre crop with the ratio clamped to the range.
CropBox random_resized_crop(int width, int height, const AugmentOptions& options, SplitMix64& rng);

// The draw of sample `index` in epoch `epoch` of a run seeded `seed`: a function of the three
// alone, whichever worker makes it and in whatever order.
SampleDraw draw_sample(int width, int height, const AugmentOptions& options, std::uint64_t seed,
                       std::uint64_t epoch, std::uint64_t index);

// A region of an image in its pixels, fractional where a crop of the full-size image is mapped onto
// a DCT-scaled decode.
struct Region {
  double x = 0;
  double y = 0;
  double width = 0;
  double height = 0;
};

// Bilinear resize (half-pixel centres, edges clamped to the region, as torch's interpolate with
// align_corners=False on the cropped image) of `region` of `image` to size x size, flipped when
// `flip`, scaled to [0, 1], normalised by mean and std, written to `out` (sample_bytes(options)).
void resize_normalize(const Image& image, Region region, bool flip, const AugmentOptions& options,
                      std::span<std::byte> out);

// `crop` of a full_width x full_height image mapped onto `image`, a decode of it at some scale.
Region scaled_region(const CropBox& crop, int full_width, int full_height, const Image& image);

}  // namespace dlprobe::data
