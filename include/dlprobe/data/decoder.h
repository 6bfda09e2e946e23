// JPEG decoding behind one interface, so that the pipeline does not care where a file is decoded:
// on the host by libjpeg-turbo (make_host_decoder, here) or on a GPU by a decoder loaded at run
// time beside it. A Decoder belongs to one worker thread; each worker makes its own through a
// DecoderFactory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe::data {

// An 8-bit RGB image, rows top to bottom, pixels interleaved (R, G, B), no padding.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> rgb;
};

// A DCT-domain scale, num/denom: the decoder produces ceil(dimension * num / denom) pixels.
struct ScaleFactor {
  int num = 1;
  int denom = 1;
  int apply(int dimension) const { return (dimension * num + denom - 1) / denom; }
  friend bool operator==(const ScaleFactor&, const ScaleFactor&) = default;
};

struct JpegInfo {
  int width = 0;
  int height = 0;
  int components = 0;  // 1 grayscale, 3 YCbCr or RGB, 4 CMYK or YCCK
};

// Why a file gave no image: the pipeline counts files by reason.
enum class DecodeFailure { unreadable, empty, not_jpeg, too_large, corrupt };
std::string_view decode_failure_name(DecodeFailure failure);

// A file that gave no image: the reason, and the library's words (the Status message).
struct DecodeError {
  DecodeFailure failure = DecodeFailure::corrupt;
  std::string message;
};

// Refusals made from the header alone, before any pixel memory is allocated.
struct DecodeLimits {
  // A header claiming more pixels than this is refused (a 30000x30000 header would otherwise ask
  // for 2.7 GB). ImageNet's largest image is under 20 megapixels.
  std::uint64_t max_pixels = 100'000'000;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::string_view name() const = 0;

  // The header's facts; a DecodeError when the file is no JPEG or its header is refused.
  virtual std::variant<JpegInfo, DecodeError> inspect(std::span<const std::uint8_t> file) = 0;
  // The DCT-domain scales this decoder decodes at directly and faster than at full size, at most
  // 1/1, largest first.
  virtual std::span<const ScaleFactor> scales() const = 0;
  // Decodes `file` at `scale` (one of scales()) into `out` as RGB, reusing out's memory. Grayscale
  // and CMYK files come out as RGB too. Any warning of the library (a truncated or corrupt file)
  // is a DecodeError: a half-grey image would train on nothing.
  virtual std::optional<DecodeError> decode(std::span<const std::uint8_t> file, ScaleFactor scale,
                                            Image& out) = 0;
};

using DecoderFactory = std::function<Result<std::unique_ptr<Decoder>>()>;

// libjpeg-turbo's TurboJPEG API on the host CPU.
Result<std::unique_ptr<Decoder>> make_host_decoder(DecodeLimits limits = {});
DecoderFactory host_decoder_factory(DecodeLimits limits = {});

// The smallest of `scales` (largest first) at which a region `region_width` x `region_height` of
// the full-size image still spans at least `min_width` x `min_height` pixels; 1/1 when none does.
ScaleFactor smallest_covering_scale(std::span<const ScaleFactor> scales, double region_width,
                                    double region_height, int min_width, int min_height);

}  // namespace dlprobe::data
