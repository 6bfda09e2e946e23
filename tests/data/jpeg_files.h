// JPEG files made in the tests with libjpeg-turbo's encoder: good ones of known pixels, and the bad
// kinds the pipeline must survive.
#pragma once

#include <turbojpeg.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dlprobe::testing {

// A smooth RGB picture (gradients, which JPEG keeps closely), width x height, interleaved.
inline std::vector<std::uint8_t> smooth_rgb(int width, int height) {
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      std::uint8_t* p = &rgb[(static_cast<std::size_t>(y) * width + x) * 3];
      p[0] = static_cast<std::uint8_t>(30 + 190 * x / std::max(1, width - 1));
      p[1] = static_cast<std::uint8_t>(40 + 170 * y / std::max(1, height - 1));
      p[2] = static_cast<std::uint8_t>(200 - 150 * (x + y) / std::max(1, width + height - 2));
    }
  }
  return rgb;
}

// `pixels` (in `format`) encoded at `quality` with `subsampling` and `flags`.
inline std::vector<std::uint8_t> encode(const std::vector<std::uint8_t>& pixels, int width,
                                        int height, int format = TJPF_RGB,
                                        int subsampling = TJSAMP_444, int quality = 95,
                                        int flags = 0) {
  tjhandle handle = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, pixels.data(), width, 0, height, format, &jpeg, &size,
                             subsampling, quality, flags);
  std::vector<std::uint8_t> out;
  if (rc == 0) out.assign(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(handle);
  if (rc != 0) throw std::runtime_error("tjCompress2 failed");
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// The offset of the first `marker` (0xFFxx) segment in `jpeg`, or npos.
inline std::size_t find_marker(const std::vector<std::uint8_t>& jpeg, std::uint8_t marker) {
  for (std::size_t i = 0; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == marker) return i;
  }
  return std::string::npos;
}

// The bad files the pipeline meets in real datasets, each named for what is wrong with it.
struct BadFile {
  std::string name;
  std::vector<std::uint8_t> bytes;
};

inline std::vector<BadFile> bad_files() {
  const auto good = encode(smooth_rgb(96, 64), 96, 64, TJPF_RGB, TJSAMP_420, 90);
  std::vector<BadFile> files;
  files.push_back({"empty", {}});
  files.push_back({"truncated", {good.begin(), good.begin() + static_cast<long>(good.size() / 2)}});
  // A Huffman table whose code counts add up to more codes than 16 bits can hold.
  auto corrupt = good;
  const std::size_t dht = find_marker(corrupt, 0xC4);
  for (std::size_t i = dht + 5; i < dht + 5 + 16; ++i) corrupt[i] = 0xFF;
  files.push_back({"corrupt", corrupt});
  const std::uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0,
                              0,    13,  'I', 'H', 'D',  'R',  0,    0,    0, 16,
                              0,    0,   0,   16,  8,    2,    0,    0,    0};
  files.push_back({"png", {std::begin(png), std::end(png)}});
  // A valid header that claims 30000 x 30000 pixels (SOF0: FFC0, length, precision, height, width).
  auto huge = good;
  const std::size_t sof = find_marker(huge, 0xC0);
  for (std::size_t at : {sof + 5, sof + 7}) {
    huge[at] = 30000 >> 8;
    huge[at + 1] = 30000 & 0xFF;
  }
  files.push_back({"huge", huge});
  return files;
}

}  // namespace dlprobe::testing
