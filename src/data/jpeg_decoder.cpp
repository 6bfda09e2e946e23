// The host decoder: libjpeg-turbo through its TurboJPEG API (Debian's libturbojpeg0, 2.1), whose
// DCT-domain scaling decodes an image at 1/2, 1/4 ... of its size for a fraction of the work.
#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <limits>

#include "dlprobe/core/named.h"
#include "dlprobe/data/decoder.h"

namespace dlprobe::data {

constexpr Named<DecodeFailure> kDecodeFailureNames[] = {{DecodeFailure::unreadable, "unreadable"},
                                                        {DecodeFailure::empty, "empty"},
                                                        {DecodeFailure::not_jpeg, "not_jpeg"},
                                                        {DecodeFailure::too_large, "too_large"},
                                                        {DecodeFailure::corrupt, "corrupt"}};

std::string_view decode_failure_name(DecodeFailure failure) {
  return name_of(kDecodeFailureNames, failure, "corrupt");
}

ScaleFactor smallest_covering_scale(std::span<const ScaleFactor> scales, double region_width,
                                    double region_height, int min_width, int min_height) {
  ScaleFactor best;
  for (const ScaleFactor& s : scales) {
    const double f = static_cast<double>(s.num) / s.denom;
    if (f > 1.0) continue;
    if (region_width * f >= min_width && region_height * f >= min_height &&
        f < static_cast<double>(best.num) / best.denom) {
      best = s;
    }
  }
  return best;
}

namespace {

class TurboJpegDecoder final : public Decoder {
 public:
  TurboJpegDecoder(tjhandle handle, DecodeLimits limits) : handle_(handle), limits_(limits) {
    int count = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&count);
    // Only 1/1, 1/2, 1/4 and 1/8: libjpeg-turbo has SIMD inverse DCTs for these alone, and its
    // plain-C 7/8, 3/4, 5/8 and 3/8 ones decode slower than the full size does (a 449x349 image
    // at quality 90: 1.6 ms at 1/1, 2.8 ms at 7/8, 2.3 ms at 3/4, 1.4 ms at 1/2, 1.3 ms at 1/4).
    for (int i = 0; i < count; ++i) {
      const int num = factors[i].num;
      const int denom = factors[i].denom;
      if (num == 1 && (denom == 1 || denom == 2 || denom == 4 || denom == 8)) {
        scales_.push_back({num, denom});
      }
    }
    std::sort(scales_.begin(), scales_.end(), [](const ScaleFactor& a, const ScaleFactor& b) {
      return a.num * b.denom > b.num * a.denom;
    });
  }
  ~TurboJpegDecoder() override {
    if (handle_ != nullptr) tjDestroy(handle_);
  }
  TurboJpegDecoder(const TurboJpegDecoder&) = delete;
  TurboJpegDecoder& operator=(const TurboJpegDecoder&) = delete;

  std::string_view name() const override { return "libjpeg-turbo"; }
  std::span<const ScaleFactor> scales() const override { return scales_; }

  std::variant<JpegInfo, DecodeError> inspect(std::span<const std::uint8_t> file) override {
    if (handle_ == nullptr) return DecodeError{DecodeFailure::corrupt, "libjpeg-turbo: no handle"};
    if (file.empty()) return DecodeError{DecodeFailure::empty, "empty file"};
    // Every JPEG starts with the SOI marker; anything else (a PNG named .jpg) is not tried.
    if (file.size() < 3 || file[0] != 0xFF || file[1] != 0xD8 || file[2] != 0xFF) {
      return DecodeError{DecodeFailure::not_jpeg, "not a JPEG file (no SOI marker)"};
    }
    if (file.size() > std::numeric_limits<unsigned long>::max()) {
      return DecodeError{DecodeFailure::too_large, "file too large"};
    }
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    if (tjDecompressHeader3(handle_, file.data(), static_cast<unsigned long>(file.size()), &width,
                            &height, &subsampling, &colorspace) != 0) {
      return failed();
    }
    if (width <= 0 || height <= 0) {
      return DecodeError{DecodeFailure::corrupt,
                         fmt::format("{}x{} pixels in the header: no image", width, height)};
    }
    const auto pixels = static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(height);
    if (pixels > limits_.max_pixels) {
      return DecodeError{DecodeFailure::too_large,
                         fmt::format("{}x{} pixels, more than the {} accepted", width, height,
                                     limits_.max_pixels)};
    }
    const int components =
        colorspace == TJCS_GRAY ? 1 : (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK ? 4 : 3);
    return JpegInfo{width, height, components};
  }

  std::optional<DecodeError> decode(std::span<const std::uint8_t> file, ScaleFactor scale,
                                    Image& out) override {
    auto inspected = inspect(file);
    if (auto* e = std::get_if<DecodeError>(&inspected)) return std::move(*e);
    const JpegInfo info = std::get<JpegInfo>(inspected);
    const int width = scale.apply(info.width);
    const int height = scale.apply(info.height);
    const auto pixels = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
    // libjpeg cannot convert CMYK to RGB: such a file is decoded as CMYK and converted here.
    const bool cmyk = info.components == 4;
    std::vector<std::uint8_t>& target = cmyk ? cmyk_ : out.rgb;
    target.resize(pixels * (cmyk ? 4 : 3));
    // A warning (a truncated file, corrupt entropy data) stops the decode: the rest of the image
    // would be filled with grey.
    if (tjDecompress2(handle_, file.data(), static_cast<unsigned long>(file.size()), target.data(),
                      width, 0, height, cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
      return failed();
    }
    out.width = width;
    out.height = height;
    if (cmyk) {
      out.rgb.resize(pixels * 3);
      // Adobe's inverted CMYK, as libjpeg-turbo stores it (its cmyk.h): R = C * K / 255.
      for (std::size_t i = 0; i < pixels; ++i) {
        const unsigned k = cmyk_[4 * i + 3];
        for (int c = 0; c < 3; ++c) {
          out.rgb[3 * i + c] = static_cast<std::uint8_t>(cmyk_[4 * i + c] * k / 255);
        }
      }
    }
    return std::nullopt;
  }

 private:
  // The library's message, and a new handle: TurboJPEG 2.1 leaves a handle whose header read
  // failed half-way through the markers, and the next file's header is read as their sequel
  // ("Bogus Huffman table definition" on a good file after a bad one).
  DecodeError failed() {
    DecodeError e{DecodeFailure::corrupt, tjGetErrorStr2(handle_)};
    tjDestroy(handle_);
    handle_ = tjInitDecompress();
    return e;
  }

  tjhandle handle_;
  DecodeLimits limits_;
  std::vector<ScaleFactor> scales_;
  std::vector<std::uint8_t> cmyk_;
};

}  // namespace

Result<std::unique_ptr<Decoder>> make_host_decoder(DecodeLimits limits) {
  tjhandle handle = tjInitDecompress();
  if (handle == nullptr) {
    return error(Errc::api_error,
                 fmt::format("libjpeg-turbo: tjInitDecompress: {}", tjGetErrorStr2(nullptr)));
  }
  return std::unique_ptr<Decoder>(std::make_unique<TurboJpegDecoder>(handle, limits));
}

DecoderFactory host_decoder_factory(DecodeLimits limits) {
  return [limits] { return make_host_decoder(limits); };
}

}  // namespace dlprobe::data
