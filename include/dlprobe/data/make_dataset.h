// A synthetic ImageFolder dataset of JPEGs shaped like ImageNet's training set for input-pipeline
// measurements: image sizes and aspect ratios spread around ImageNet's (about 400 x 350 on
// average), content that compresses like photographs at quality 90 (smooth gradients, shapes,
// texture and sensor-like noise: near ImageNet's 0.35 to 0.45 bytes per pixel, neither white noise
// nor flat colour), 4:2:0 chroma subsampling, in class folders.
#pragma once

#include <cstdint>
#include <filesystem>

#include "dlprobe/core/status.h"

namespace dlprobe::data {

struct MakeDatasetOptions {
  std::int64_t images = 1000;
  int classes = 10;
  std::uint64_t seed = 0;
  int quality = 90;
};

struct MadeDataset {
  std::int64_t images = 0;
  std::uint64_t bytes = 0;   // of all the files
  std::uint64_t pixels = 0;  // of all the images
  double mean_width = 0;
  double mean_height = 0;
  double bytes_per_pixel() const {
    return pixels ? static_cast<double>(bytes) / static_cast<double>(pixels) : 0.0;
  }
};

// Writes `options.images` JPEGs to `root`/class_KKKK/img_NNNNNNNN.jpg (images spread evenly over
// the classes), the same files for the same options. `root` is made when missing and must hold
// nothing (the files are never mixed into an existing dataset).
Result<MadeDataset> make_dataset(const std::filesystem::path& root,
                                 const MakeDatasetOptions& options);

}  // namespace dlprobe::data
