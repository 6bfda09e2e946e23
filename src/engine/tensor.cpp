#include "dlprobe/engine/tensor.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace dlprobe {

std::string_view layout_name(Layout layout) {
  return layout == Layout::nchw ? "NCHW" : "NHWC";
}

Result<Layout> parse_layout(std::string_view text, std::string_view flag) {
  if (text == "nchw" || text == "NCHW") return Layout::nchw;
  if (text == "nhwc" || text == "NHWC") return Layout::nhwc;
  return invalid_argument(
      fmt::format("{}: unknown layout '{}' (expected nchw or nhwc)", flag, text));
}

Shape::Shape(std::initializer_list<std::int64_t> d) : rank(static_cast<int>(d.size())) {
  assert(d.size() <= kMaxRank);
  std::size_t i = 0;
  for (std::int64_t v : d) dims[i++] = v;
}

std::int64_t Shape::numel() const {
  if (rank == 0) return 0;  // a default Shape describes nothing yet, not a scalar
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= (*this)[i];
  return n;
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s;
  for (int i = 0; i < rank; ++i) s += fmt::format("{}{}", i == 0 ? "" : "x", (*this)[i]);
  return s;
}

Status check_element_count(const Shape& shape) {
  std::int64_t bytes = 8;
  for (int i = 0; i < shape.rank; ++i) {
    if (__builtin_mul_overflow(bytes, shape[i], &bytes)) {
      return invalid_argument(
          fmt::format("shape {} has too many elements: its size overflows 64 bits", shape.str()));
    }
  }
  return Status::ok();
}

TensorDesc::TensorDesc(const Shape& shape, DType dtype, Layout layout)
    : shape_(shape), dtype_(dtype), layout_(layout) {
  // Row-major over the dimensions in storage order; NHWC stores N, H, W, C.
  std::array<int, kMaxRank> order{0, 1, 2, 3};
  if (layout == Layout::nhwc) order = {0, 2, 3, 1};
  std::int64_t stride = 1;
  for (int i = shape.rank - 1; i >= 0; --i) {
    const auto d = static_cast<std::size_t>(order[static_cast<std::size_t>(i)]);
    strides_[d] = stride;
    stride *= shape.dims[d];
  }
}

Result<TensorDesc> TensorDesc::make(const Shape& shape, DType dtype, Layout layout) {
  if (shape.rank < 1 || shape.rank > kMaxRank) {
    return invalid_argument(fmt::format("tensor rank {} is outside 1..{}", shape.rank, kMaxRank));
  }
  for (int i = 0; i < shape.rank; ++i) {
    if (shape[i] < 1) {
      return invalid_argument(fmt::format("tensor shape {} has a dimension < 1", shape.str()));
    }
  }
  DLPROBE_RETURN_IF_ERROR(check_element_count(shape));
  if (layout == Layout::nhwc && shape.rank != 4) {
    return invalid_argument(
        fmt::format("layout NHWC needs a rank-4 tensor, got shape {}", shape.str()));
  }
  return TensorDesc(shape, dtype, layout);
}

TensorDesc TensorDesc::with_dtype(DType dtype) const {
  return TensorDesc(shape_, dtype, layout_);
}

TensorDesc TensorDesc::with_layout(Layout layout) const {
  if (rank() != 4) return *this;
  return TensorDesc(shape_, dtype_, layout);
}

std::string TensorDesc::str() const {
  if (rank() == 4) {
    return fmt::format("{}[{}, {}]", dtype_name(dtype_), shape_.str(), layout_name(layout_));
  }
  return fmt::format("{}[{}]", dtype_name(dtype_), shape_.str());
}

bool operator==(const TensorDesc& a, const TensorDesc& b) {
  return a.shape_ == b.shape_ && a.dtype_ == b.dtype_ && a.layout_ == b.layout_;
}

namespace {

// SplitMix64 (Steele, Lea, Flood 2014), written out because std::uniform_real_distribution's
// output differs between standard libraries, and test inputs must be the same everywhere.
std::uint64_t splitmix64(std::uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
double unit_uniform(std::uint64_t& state) {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

}  // namespace

HostTensor::HostTensor(const TensorDesc& desc) : desc_(desc), storage_(desc.bytes()) {
  fill(dtype_is_floating(desc.dtype()) ? std::numeric_limits<double>::quiet_NaN()
                                       : static_cast<double>(std::numeric_limits<int>::min()));
}

HostTensor HostTensor::zeros(const TensorDesc& desc) {
  HostTensor t(desc);
  t.fill(0.0);
  return t;
}

HostTensor HostTensor::random(const TensorDesc& desc, std::uint64_t seed, double lo, double hi) {
  HostTensor t(desc);
  std::uint64_t state = seed;
  const bool floating = dtype_is_floating(desc.dtype());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double u = unit_uniform(state);
    t.set(i, floating ? lo + (hi - lo) * u : lo + std::floor((hi - lo) * u));
  }
  return t;
}

void HostTensor::fill(double value) {
  for (std::int64_t i = 0; i < numel(); ++i) set(i, value);
}

double HostTensor::get(std::int64_t i) const {
  const auto k = static_cast<std::size_t>(i);
  switch (dtype()) {
    case DType::fp64:
      return values<double>()[k];
    case DType::fp32:
      return values<float>()[k];
    case DType::fp16:
      return half_to_float(values<Half>()[k]);
    case DType::bf16:
      return bf16_to_float(values<BFloat16>()[k]);
    case DType::int32:
      return values<std::int32_t>()[k];
    case DType::int64:
      return static_cast<double>(values<std::int64_t>()[k]);
  }
  return 0.0;
}

void HostTensor::set(std::int64_t i, double value) {
  const auto k = static_cast<std::size_t>(i);
  switch (dtype()) {
    case DType::fp64:
      values<double>()[k] = value;
      return;
    case DType::fp32:
      values<float>()[k] = static_cast<float>(value);
      return;
    case DType::fp16:
      values<Half>()[k] = float_to_half(static_cast<float>(value));
      return;
    case DType::bf16:
      values<BFloat16>()[k] = float_to_bf16(static_cast<float>(value));
      return;
    case DType::int32:
      values<std::int32_t>()[k] = static_cast<std::int32_t>(value);
      return;
    case DType::int64:
      values<std::int64_t>()[k] = static_cast<std::int64_t>(value);
      return;
  }
}

HostTensor HostTensor::to_layout(Layout layout) const {
  const TensorDesc out_desc = desc_.with_layout(layout);
  HostTensor out(out_desc);
  if (out_desc.layout() == desc_.layout()) {
    out.storage_ = storage_;
    return out;
  }
  const std::size_t elem = dtype_size(dtype());
  for (std::int64_t n = 0; n < desc_.dim(0); ++n) {
    for (std::int64_t c = 0; c < desc_.dim(1); ++c) {
      for (std::int64_t h = 0; h < desc_.dim(2); ++h) {
        for (std::int64_t w = 0; w < desc_.dim(3); ++w) {
          const auto src = static_cast<std::size_t>(desc_.offset(n, c, h, w)) * elem;
          const auto dst = static_cast<std::size_t>(out_desc.offset(n, c, h, w)) * elem;
          for (std::size_t b = 0; b < elem; ++b) out.storage_[dst + b] = storage_[src + b];
        }
      }
    }
  }
  return out;
}

Result<HostTensor> HostTensor::to_dtype(DType dtype) const {
  const bool from_float = dtype_is_floating(this->dtype());
  if (from_float != dtype_is_floating(dtype)) {
    return error(Errc::unsupported,
                 fmt::format("cannot convert a {} tensor to {}: only floating <-> floating and "
                             "integer <-> integer",
                             dtype_name(this->dtype()), dtype_name(dtype)));
  }
  HostTensor out(desc_.with_dtype(dtype));
  if (from_float) {
    for (std::int64_t i = 0; i < numel(); ++i) out.set(i, get(i));
    return out;
  }
  for (std::int64_t i = 0; i < numel(); ++i) {
    const std::int64_t v = this->dtype() == DType::int64
                               ? values<std::int64_t>()[static_cast<std::size_t>(i)]
                               : values<std::int32_t>()[static_cast<std::size_t>(i)];
    if (dtype == DType::int32 && (v < std::numeric_limits<std::int32_t>::min() ||
                                  v > std::numeric_limits<std::int32_t>::max())) {
      return invalid_argument(fmt::format("value {} at element {} does not fit int32", v, i));
    }
    if (dtype == DType::int64) {
      out.values<std::int64_t>()[static_cast<std::size_t>(i)] = v;
    } else {
      out.values<std::int32_t>()[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v);
    }
  }
  return out;
}

}  // namespace dlprobe
