#include "dlprobe/data/augment.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "dlprobe/core/named.h"

namespace dlprobe::data {

constexpr Named<SampleType> kSampleTypeNames[] = {
    {SampleType::fp32, "fp32"}, {SampleType::fp16, "fp16"}, {SampleType::bf16, "bf16"}};

std::string_view sample_type_name(SampleType type) {
  return name_of(kSampleTypeNames, type, "fp32");
}

std::string_view sample_layout_name(SampleLayout layout) {
  return layout == SampleLayout::nchw ? "nchw" : "nhwc";
}

Result<SampleType> parse_sample_type(std::string_view name) {
  if (name == "fp32" || name == "float32") return SampleType::fp32;
  if (name == "fp16" || name == "float16") return SampleType::fp16;
  if (name == "bf16" || name == "bfloat16") return SampleType::bf16;
  return invalid_argument(fmt::format("unknown sample type '{}' (fp32, fp16, bf16)", name));
}

Result<SampleLayout> parse_sample_layout(std::string_view name) {
  if (name == "nchw") return SampleLayout::nchw;
  if (name == "nhwc") return SampleLayout::nhwc;
  return invalid_argument(fmt::format("unknown layout '{}' (nchw, nhwc)", name));
}

std::size_t sample_type_size(SampleType type) {
  return type == SampleType::fp32 ? 4 : 2;
}

std::size_t sample_bytes(const AugmentOptions& options) {
  return 3 * static_cast<std::size_t>(options.size) * static_cast<std::size_t>(options.size) *
         sample_type_size(options.type);
}

std::uint64_t SplitMix64::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

double SplitMix64::uniform(double low, double high) {
  return low + (high - low) * uniform();
}

std::int64_t SplitMix64::below(std::int64_t n) {
  return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n));
}

namespace {

// Python's round(): halves to even (nearbyint in the default rounding mode).
int round_half_even(double v) {
  return static_cast<int>(std::nearbyint(v));
}

}  // namespace

CropBox random_resized_crop(int width, int height, const AugmentOptions& options, SplitMix64& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_low = std::log(options.ratio_min);
  const double log_high = std::log(options.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(options.scale_min, options.scale_max);
    const double ratio = std::exp(rng.uniform(log_low, log_high));
    const int w = round_half_even(std::sqrt(target_area * ratio));
    const int h = round_half_even(std::sqrt(target_area / ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int y = static_cast<int>(rng.below(height - h + 1));
      const int x = static_cast<int>(rng.below(width - w + 1));
      return {x, y, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width;
  int h = height;
  if (in_ratio < options.ratio_min) {
    h = round_half_even(w / options.ratio_min);
  } else if (in_ratio > options.ratio_max) {
    w = round_half_even(h * options.ratio_max);
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

SampleDraw draw_sample(int width, int height, const AugmentOptions& options, std::uint64_t seed,
                       std::uint64_t epoch, std::uint64_t index) {
  // Three SplitMix64 outputs chained: nearby (seed, epoch, index) triples give unrelated streams.
  SplitMix64 mix(seed);
  SplitMix64 mix_epoch(mix.next() ^ epoch);
  SplitMix64 rng(mix_epoch.next() ^ index);
  SampleDraw draw;
  draw.crop = random_resized_crop(width, height, options, rng);
  draw.flip = options.flip && rng.uniform() < 0.5;
  return draw;
}

Region scaled_region(const CropBox& crop, int full_width, int full_height, const Image& image) {
  const double sx = static_cast<double>(image.width) / full_width;
  const double sy = static_cast<double>(image.height) / full_height;
  return {crop.x * sx, crop.y * sy, crop.width * sx, crop.height * sy};
}

namespace {

// One output coordinate's two source pixels and the weight of the second.
struct Tap {
  int i0 = 0;
  int i1 = 0;
  float w = 0;
};

// The taps of `count` outputs over [start, start + length) of an axis of `limit` pixels.
void make_taps(double start, double length, int count, int limit, std::vector<Tap>& taps) {
  taps.resize(static_cast<std::size_t>(count));
  const double step = length / count;
  const double last = std::max(start, start + length - 1.0);
  for (int o = 0; o < count; ++o) {
    const double src = std::clamp(start + (o + 0.5) * step - 0.5, start, last);
    const int i0 = std::min(static_cast<int>(std::floor(src)), limit - 1);
    Tap& t = taps[static_cast<std::size_t>(o)];
    t.i0 = std::max(i0, 0);
    t.i1 = std::min(t.i0 + 1, limit - 1);
    t.w = static_cast<float>(std::clamp(src - t.i0, 0.0, 1.0));
  }
}

template <SampleType T>
struct Element;
template <>
struct Element<SampleType::fp32> {
  using type = float;
  static float from(float v) { return v; }
};
template <>
struct Element<SampleType::fp16> {
  using type = std::uint16_t;
  // The compiler's _Float16 conversion rounds to nearest even (F16C where the target has it).
  static std::uint16_t from(float v) {
    return std::bit_cast<std::uint16_t>(static_cast<_Float16>(v));
  }
};
template <>
struct Element<SampleType::bf16> {
  using type = std::uint16_t;
  // The top half of the float, rounded to nearest even (normalised pixels are never NaN).
  static std::uint16_t from(float v) {
    const auto x = std::bit_cast<std::uint32_t>(v);
    return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
  }
};

// One source row resized horizontally into `dst`, in the output's layout: planar (all R, all G,
// all B) for NCHW, interleaved for NHWC.
template <SampleLayout L>
void resize_row(const std::uint8_t* row, const std::vector<Tap>& xs, float* dst) {
  const std::size_t n = xs.size();
  for (std::size_t ox = 0; ox < n; ++ox) {
    const Tap& t = xs[ox];
    const std::uint8_t* a = row + static_cast<std::size_t>(t.i0) * 3;
    const std::uint8_t* b = row + static_cast<std::size_t>(t.i1) * 3;
    for (std::size_t c = 0; c < 3; ++c) {
      const float v = a[c] + t.w * static_cast<float>(b[c] - a[c]);
      dst[L == SampleLayout::nchw ? c * n + ox : ox * 3 + c] = v;
    }
  }
}

// Where both resizes write: the output as its element type, n x n values per channel, and the
// byte stride of the source image's RGB rows.
template <SampleType T>
struct Target {
  typename Element<T>::type* out;
  std::size_t n;
  std::size_t plane;
  std::size_t stride;
};
template <SampleType T>
Target<T> target_of(const Image& image, std::size_t n, std::byte* out_bytes) {
  return {reinterpret_cast<typename Element<T>::type*>(out_bytes), n, n * n,
          static_cast<std::size_t>(image.width) * 3};
}

// Hand-written rather than a library's resize: the crop, flip, resize, normalisation, element type
// and layout are one pass over the output, with no intermediate image (OpenCV's or Pillow's resize
// would write an 8-bit image to normalise and transpose in a second pass). Separable: each source
// row is resized horizontally once into a float row kept while the output rows that blend it are
// written, and the vertical blend, the normalisation and the store are one contiguous loop.
template <SampleType T, SampleLayout L>
void resize_into(const Image& image, const std::vector<Tap>& xs, const std::vector<Tap>& ys,
                 const std::array<float, 3>& scale, const std::array<float, 3>& shift,
                 std::byte* out_bytes) {
  using E = Element<T>;
  const auto [out, n, plane, stride] = target_of<T>(image, xs.size(), out_bytes);
  thread_local std::vector<float> buffer;
  buffer.resize(6 * n);
  float* rows[2] = {buffer.data(), buffer.data() + 3 * n};
  int held[2] = {-1, -1};  // the source row each of `rows` holds
  const auto row = [&](int index, int keep) {
    for (int s = 0; s < 2; ++s) {
      if (held[s] == index) return s;
    }
    const int s = keep == 0 ? 1 : 0;
    resize_row<L>(image.rgb.data() + static_cast<std::size_t>(index) * stride, xs, rows[s]);
    held[s] = index;
    return s;
  };
  for (std::size_t oy = 0; oy < n; ++oy) {
    const Tap& ty = ys[oy];
    const int s0 = row(ty.i0, held[0] == ty.i1 ? 0 : (held[1] == ty.i1 ? 1 : -1));
    const int s1 = row(ty.i1, s0);
    const float* top = rows[s0];
    const float* bottom = rows[s1];
    const float w = ty.w;
    if constexpr (L == SampleLayout::nchw) {
      for (std::size_t c = 0; c < 3; ++c) {
        const float* a = top + c * n;
        const float* b = bottom + c * n;
        typename E::type* dst = out + c * plane + oy * n;
        const float k = scale[c];
        const float d = shift[c];
        for (std::size_t x = 0; x < n; ++x) dst[x] = E::from((a[x] + w * (b[x] - a[x])) * k + d);
      }
    } else {
      typename E::type* dst = out + oy * n * 3;
      for (std::size_t x = 0; x < n; ++x) {
        for (std::size_t c = 0; c < 3; ++c) {
          const std::size_t i = x * 3 + c;
          dst[i] = E::from((top[i] + w * (bottom[i] - top[i])) * scale[c] + shift[c]);
        }
      }
    }
  }
}

// The same result for a region taller than the output, where each output row blends two source
// rows of its own: the two rows are blended first, over the columns the taps reach (a contiguous
// loop), and one horizontal pass reads the blend, instead of two horizontal passes per output row.
template <SampleType T, SampleLayout L>
void resize_rows_first(const Image& image, const std::vector<Tap>& xs, const std::vector<Tap>& ys,
                       const std::array<float, 3>& scale, const std::array<float, 3>& shift,
                       std::byte* out_bytes) {
  using E = Element<T>;
  const auto [out, n, plane, stride] = target_of<T>(image, xs.size(), out_bytes);
  int lo = image.width;
  int hi = 0;
  for (const Tap& t : xs) {
    lo = std::min(lo, t.i0);
    hi = std::max(hi, t.i1);
  }
  const std::size_t first = static_cast<std::size_t>(lo) * 3;
  const std::size_t span = static_cast<std::size_t>(hi - lo + 1) * 3;
  thread_local std::vector<float> line;
  line.resize(span);
  thread_local std::vector<std::array<std::size_t, 2>> at;
  at.resize(n);
  for (std::size_t ox = 0; ox < n; ++ox) {
    at[ox] = {static_cast<std::size_t>(xs[ox].i0) * 3 - first,
              static_cast<std::size_t>(xs[ox].i1) * 3 - first};
  }
  for (std::size_t oy = 0; oy < n; ++oy) {
    const Tap& ty = ys[oy];
    const std::uint8_t* r0 = image.rgb.data() + static_cast<std::size_t>(ty.i0) * stride + first;
    const std::uint8_t* r1 = image.rgb.data() + static_cast<std::size_t>(ty.i1) * stride + first;
    const float w = ty.w;
    for (std::size_t k = 0; k < span; ++k) {
      line[k] = r0[k] + w * static_cast<float>(r1[k] - r0[k]);
    }
    for (std::size_t ox = 0; ox < n; ++ox) {
      const float tw = xs[ox].w;
      const float* a = line.data() + at[ox][0];
      const float* b = line.data() + at[ox][1];
      for (std::size_t c = 0; c < 3; ++c) {
        const auto v = E::from((a[c] + tw * (b[c] - a[c])) * scale[c] + shift[c]);
        if constexpr (L == SampleLayout::nchw) {
          out[c * plane + oy * n + ox] = v;
        } else {
          out[(oy * n + ox) * 3 + c] = v;
        }
      }
    }
  }
}

template <SampleType T>
void resize_typed(SampleLayout layout, const Image& image, const std::vector<Tap>& xs,
                  const std::vector<Tap>& ys, const std::array<float, 3>& scale,
                  const std::array<float, 3>& shift, bool rows_first, std::byte* out) {
  if (rows_first) {
    if (layout == SampleLayout::nchw) {
      resize_rows_first<T, SampleLayout::nchw>(image, xs, ys, scale, shift, out);
    } else {
      resize_rows_first<T, SampleLayout::nhwc>(image, xs, ys, scale, shift, out);
    }
  } else if (layout == SampleLayout::nchw) {
    resize_into<T, SampleLayout::nchw>(image, xs, ys, scale, shift, out);
  } else {
    resize_into<T, SampleLayout::nhwc>(image, xs, ys, scale, shift, out);
  }
}

}  // namespace

void resize_normalize(const Image& image, Region region, bool flip, const AugmentOptions& options,
                      std::span<std::byte> out) {
  // The taps are rebuilt per sample (2 * size entries, negligible beside the pixels); thread_local
  // keeps their memory across samples of one worker.
  thread_local std::vector<Tap> xs;
  thread_local std::vector<Tap> ys;
  make_taps(region.x, region.width, options.size, image.width, xs);
  make_taps(region.y, region.height, options.size, image.height, ys);
  if (flip) std::reverse(xs.begin(), xs.end());
  // (v / 255 - mean) / std as one multiply-add.
  std::array<float, 3> scale{};
  std::array<float, 3> shift{};
  for (std::size_t c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * options.std[c]);
    shift[c] = -options.mean[c] / options.std[c];
  }
  const bool rows_first = region.height > options.size;
  switch (options.type) {
    case SampleType::fp32:
      resize_typed<SampleType::fp32>(options.layout, image, xs, ys, scale, shift, rows_first,
                                     out.data());
      break;
    case SampleType::fp16:
      resize_typed<SampleType::fp16>(options.layout, image, xs, ys, scale, shift, rows_first,
                                     out.data());
      break;
    case SampleType::bf16:
      resize_typed<SampleType::bf16>(options.layout, image, xs, ys, scale, shift, rows_first,
                                     out.data());
      break;
  }
}

}  // namespace dlprobe::data
