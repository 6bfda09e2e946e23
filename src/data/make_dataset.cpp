#include "dlprobe/data/make_dataset.h"

#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <numbers>
#include <system_error>
#include <vector>

#include "dlprobe/data/augment.h"

namespace dlprobe::data {

namespace fs = std::filesystem;

namespace {

// ImageNet's training images: about 140,000 pixels on average (400 x 350), most between half and
// twice that; three in four landscape (4:3 and 3:2 above all), the rest portrait or square.
std::pair<int, int> draw_size(SplitMix64& rng) {
  // A sum of uniforms: near-normal spread of the area's logarithm, sd about 0.35.
  double z = 0;
  for (int i = 0; i < 4; ++i) z += rng.uniform(-1.0, 1.0);
  const double area = 130000.0 * std::exp(0.6 * z / 2.0);
  const double shape = rng.uniform();
  double ratio = shape < 0.45 ? 4.0 / 3 : (shape < 0.7 ? 3.0 / 2 : (shape < 0.8 ? 1.0 : 3.0 / 4));
  ratio *= std::exp(rng.uniform(-0.1, 0.1));
  const int width = std::clamp(static_cast<int>(std::lround(std::sqrt(area * ratio))), 64, 2500);
  const int height = std::clamp(static_cast<int>(std::lround(std::sqrt(area / ratio))), 64, 2500);
  return {width, height};
}

using Colour = std::array<float, 3>;

Colour draw_colour(SplitMix64& rng) {
  return {static_cast<float>(rng.uniform(0, 255)), static_cast<float>(rng.uniform(0, 255)),
          static_cast<float>(rng.uniform(0, 255))};
}

// A picture that compresses like a photograph: a smooth gradient between four corner colours,
// a few blurred-edge discs and boxes, a fine texture (two gratings, as of fabric or foliage) and
// per-pixel noise. The texture and noise amplitudes set the bytes per pixel at quality 90.
std::vector<std::uint8_t> draw_picture(int width, int height, SplitMix64& rng) {
  const Colour corner[4] = {draw_colour(rng), draw_colour(rng), draw_colour(rng), draw_colour(rng)};
  std::vector<float> rgb(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
  for (int y = 0; y < height; ++y) {
    const float v = static_cast<float>(y) / static_cast<float>(height);
    for (int x = 0; x < width; ++x) {
      const float u = static_cast<float>(x) / static_cast<float>(width);
      float* p = &rgb[(static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                       static_cast<std::size_t>(x)) *
                      3];
      for (std::size_t c = 0; c < 3; ++c) {
        p[c] = (1 - v) * ((1 - u) * corner[0][c] + u * corner[1][c]) +
               v * ((1 - u) * corner[2][c] + u * corner[3][c]);
      }
    }
  }
  const int shapes = 6 + static_cast<int>(rng.below(15));
  const double side = std::min(width, height);
  for (int s = 0; s < shapes; ++s) {
    const Colour colour = draw_colour(rng);
    const double cx = rng.uniform(0, width);
    const double cy = rng.uniform(0, height);
    const double rx = side * rng.uniform(0.05, 0.35);
    const double ry = rx * rng.uniform(0.5, 2.0);
    const bool disc = rng.uniform() < 0.5;
    const double edge = rng.uniform(0.7, 3.0);  // pixels of blur at the edge
    const int x0 = std::max(0, static_cast<int>(cx - rx - edge));
    const int x1 = std::min(width, static_cast<int>(cx + rx + edge) + 1);
    const int y0 = std::max(0, static_cast<int>(cy - ry - edge));
    const int y1 = std::min(height, static_cast<int>(cy + ry + edge) + 1);
    for (int y = y0; y < y1; ++y) {
      for (int x = x0; x < x1; ++x) {
        const double dx = (x - cx) / rx;
        const double dy = (y - cy) / ry;
        // Distance outside the shape's border in pixels (negative inside).
        const double out = disc ? (std::sqrt(dx * dx + dy * dy) - 1) * std::min(rx, ry)
                                : std::max((std::abs(dx) - 1) * rx, (std::abs(dy) - 1) * ry);
        const auto alpha = static_cast<float>(std::clamp(0.5 - out / edge, 0.0, 1.0));
        if (alpha <= 0) continue;
        float* p = &rgb[(static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                         static_cast<std::size_t>(x)) *
                        3];
        for (std::size_t c = 0; c < 3; ++c) p[c] += alpha * (colour[c] - p[c]);
      }
    }
  }
  // Two gratings of random direction and a period of 3 to 12 pixels.
  std::array<double, 2> fx{}, fy{}, amplitude{};
  for (std::size_t g = 0; g < 2; ++g) {
    const double angle = rng.uniform(0, std::numbers::pi);
    const double period = rng.uniform(3, 12);
    fx[g] = std::cos(angle) * 2 * std::numbers::pi / period;
    fy[g] = std::sin(angle) * 2 * std::numbers::pi / period;
    amplitude[g] = rng.uniform(4, 14);
  }
  constexpr float kNoise = 16;  // uniform noise of +-kNoise per channel
  std::vector<std::uint8_t> out(rgb.size());
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const auto texture = static_cast<float>(amplitude[0] * std::sin(fx[0] * x + fy[0] * y) +
                                              amplitude[1] * std::sin(fx[1] * x + fy[1] * y));
      std::uint64_t bits = rng.next();
      const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                             static_cast<std::size_t>(x)) *
                            3;
      for (std::size_t c = 0; c < 3; ++c) {
        const float noise = (static_cast<float>(bits & 0xFFFF) / 65535.0f * 2 - 1) * kNoise;
        bits >>= 16;
        out[i + c] =
            static_cast<std::uint8_t>(std::clamp(rgb[i + c] + texture + noise, 0.0f, 255.0f));
      }
    }
  }
  return out;
}

}  // namespace

Result<MadeDataset> make_dataset(const fs::path& root, const MakeDatasetOptions& options) {
  if (options.images < 1)
    return invalid_argument(fmt::format("images: {} (at least 1)", options.images));
  if (options.classes < 1 || options.classes > 100000) {
    return invalid_argument(fmt::format("classes: {} (1 to 100000)", options.classes));
  }
  // A class folder holds at least one image: an empty one is no class to a loader.
  if (options.classes > options.images) {
    return invalid_argument(
        fmt::format("classes: {} is more than the {} images (each class holds "
                    "at least one)",
                    options.classes, options.images));
  }
  if (options.quality < 1 || options.quality > 100) {
    return invalid_argument(fmt::format("quality: {} (1 to 100)", options.quality));
  }
  std::error_code ec;
  if (fs::exists(root, ec)) {
    if (!fs::is_directory(root, ec)) {
      return invalid_argument(fmt::format("{}: not a folder", root.string()));
    }
    if (!fs::is_empty(root, ec) || ec) {
      return invalid_argument(fmt::format(
          "{}: not empty (the dataset is written into a new or empty folder)", root.string()));
    }
  }
  tjhandle handle = tjInitCompress();
  if (handle == nullptr) {
    return error(Errc::api_error,
                 fmt::format("libjpeg-turbo: tjInitCompress: {}", tjGetErrorStr2(nullptr)));
  }
  MadeDataset made;
  double width_sum = 0;
  double height_sum = 0;
  Status status;
  for (std::int64_t i = 0; i < options.images && status.is_ok(); ++i) {
    const std::int64_t k = i % options.classes;
    const fs::path folder = root / fmt::format("class_{:04}", k);
    if (i < options.classes) {
      fs::create_directories(folder, ec);
      if (ec) {
        status = error(Errc::io_error,
                       fmt::format("{}: cannot make: {}", folder.string(), ec.message()));
        break;
      }
    }
    SplitMix64 rng(options.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i));
    const auto [width, height] = draw_size(rng);
    const auto pixels = draw_picture(width, height, rng);
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(handle, pixels.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420,
                    options.quality, 0) != 0) {
      status = error(Errc::api_error,
                     fmt::format("libjpeg-turbo: tjCompress2: {}", tjGetErrorStr2(handle)));
      tjFree(jpeg);
      break;
    }
    const fs::path file = folder / fmt::format("img_{:08}.jpg", i);
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(jpeg), static_cast<std::streamsize>(size));
    out.close();
    tjFree(jpeg);
    if (!out) {
      status = error(Errc::io_error, fmt::format("{}: cannot write", file.string()));
      break;
    }
    ++made.images;
    made.bytes += size;
    made.pixels += static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(height);
    width_sum += width;
    height_sum += height;
  }
  tjDestroy(handle);
  if (!status.is_ok()) return status;
  made.mean_width = width_sum / static_cast<double>(made.images);
  made.mean_height = height_sum / static_cast<double>(made.images);
  return made;
}

}  // namespace dlprobe::data
