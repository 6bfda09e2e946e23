#include "dlprobe/engine/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "dlprobe/core/parallel.h"

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

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// SplitMix64 (Steele, Lea, Flood 2014), written out because std::uniform_real_distribution's
// output differs between standard libraries, and test inputs must be the same everywhere. Its
// state only ever grows by kGolden, so the value of draw i is known without the draws before it,
// and a tensor's elements can be drawn by several threads with the same result.
std::uint64_t splitmix64(std::uint64_t& state) {
  state += kGolden;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
double unit_uniform(std::uint64_t& state) {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

// Calls f(std::type_identity<T>{}) with T the element type of `dtype`.
template <class F>
void with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::fp64:
      return f(std::type_identity<double>{});
    case DType::fp32:
      return f(std::type_identity<float>{});
    case DType::fp16:
      return f(std::type_identity<Half>{});
    case DType::bf16:
      return f(std::type_identity<BFloat16>{});
    case DType::int32:
      return f(std::type_identity<std::int32_t>{});
    case DType::int64:
      return f(std::type_identity<std::int64_t>{});
  }
}

// An element from a double as set() stores it, and back as get() reads it.
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half>) {
    return float_to_half(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return float_to_bf16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half>) {
    return half_to_float(v);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return bf16_to_float(v);
  } else {
    return static_cast<double>(v);
  }
}

// Elements a thread takes at least, in the whole-tensor loops below: enough to outweigh
// starting it.
constexpr std::int64_t kGrain = std::int64_t{1} << 18;

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
  const bool floating = dtype_is_floating(desc.dtype());
  with_element_type(desc.dtype(), [&]<class T>(std::type_identity<T>) {
    const std::span<T> out = t.values<T>();
    parallel_for(t.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
      // Element i is draw i + 1 of the sequence from `seed`.
      std::uint64_t state = seed + static_cast<std::uint64_t>(begin) * kGolden;
      for (std::int64_t i = begin; i < end; ++i) {
        const double u = unit_uniform(state);
        out[static_cast<std::size_t>(i)] =
            from_double<T>(floating ? lo + (hi - lo) * u : lo + std::floor((hi - lo) * u));
      }
    });
  });
  return t;
}

void HostTensor::fill(double value) {
  with_element_type(dtype(), [&]<class T>(std::type_identity<T>) {
    const std::span<T> out = values<T>();
    const T v = from_double<T>(value);
    parallel_for(numel(), kGrain * 4, [&](std::int64_t begin, std::int64_t end) {
      std::fill(out.begin() + begin, out.begin() + end, v);
    });
  });
}

double HostTensor::get(std::int64_t i) const {
  double v = 0.0;
  with_element_type(dtype(), [&]<class T>(std::type_identity<T>) {
    v = to_double(values<T>()[static_cast<std::size_t>(i)]);
  });
  return v;
}

void HostTensor::set(std::int64_t i, double value) {
  with_element_type(dtype(), [&]<class T>(std::type_identity<T>) {
    values<T>()[static_cast<std::size_t>(i)] = from_double<T>(value);
  });
}

namespace {

// Moves every element of `src` (laid out as `from`) to its place in `dst` (laid out as `to`).
template <class T>
void copy_layout(const TensorDesc& from, const T* src, const TensorDesc& to, T* dst) {
  parallel_for(from.dim(0), 1, [&](std::int64_t n_begin, std::int64_t n_end) {
    for (std::int64_t n = n_begin; n < n_end; ++n) {
      for (std::int64_t c = 0; c < from.dim(1); ++c) {
        for (std::int64_t h = 0; h < from.dim(2); ++h) {
          const std::int64_t s = from.offset(n, c, h, 0);
          const std::int64_t d = to.offset(n, c, h, 0);
          for (std::int64_t w = 0; w < from.dim(3); ++w) {
            dst[d + w * to.stride(3)] = src[s + w * from.stride(3)];
          }
        }
      }
    }
  });
}

}  // namespace

HostTensor HostTensor::to_layout(Layout layout) const {
  const TensorDesc out_desc = desc_.with_layout(layout);
  if (out_desc.layout() == desc_.layout()) {
    HostTensor out;
    out.desc_ = out_desc;
    out.storage_ = storage_;
    return out;
  }
  HostTensor out(out_desc);
  with_element_type(dtype(), [&]<class T>(std::type_identity<T>) {
    copy_layout(desc_, values<T>().data(), out_desc, out.values<T>().data());
  });
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
    with_element_type(this->dtype(), [&]<class S>(std::type_identity<S>) {
      with_element_type(dtype, [&]<class D>(std::type_identity<D>) {
        const std::span<const S> in = values<S>();
        const std::span<D> to = out.values<D>();
        parallel_for(numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i) {
            const auto k = static_cast<std::size_t>(i);
            to[k] = from_double<D>(to_double(in[k]));
          }
        });
      });
    });
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
