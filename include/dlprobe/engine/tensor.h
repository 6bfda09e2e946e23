// Tensors of the training engine: a TensorDesc says what the elements are and where each one
// sits; HostTensor owns host memory for one. Device tensors (later, through the memory module's
// allocator) reuse TensorDesc with their own storage; TensorView is the common non-owning form.
//
// Dimensions are always given in logical order: N, C, H, W for rank 4 (activations; conv weights
// as K, C/groups, R, S), plain row-major order below rank 4. The layout only changes the strides:
// NCHW is row-major in N, C, H, W; NHWC is row-major in N, H, W, C. So index (n, c, h, w) means
// the same element in both layouts, and an op written with offset() works on either.
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/dtype.h"

namespace dlprobe {

enum class Layout : std::uint8_t { nchw, nhwc };
std::string_view layout_name(Layout layout);
Result<Layout> parse_layout(std::string_view text, std::string_view flag = "layout");

inline constexpr int kMaxRank = 4;

// Logical dimensions, rank 1..4, each >= 1 once validated by TensorDesc::make.
struct Shape {
  int rank = 0;
  std::array<std::int64_t, kMaxRank> dims{};

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d);
  std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  friend bool operator==(const Shape& a, const Shape& b);
  // "2x64x56x56".
  std::string str() const;
};

// Whether the shape's size is countable: its element count, at 8 bytes an element, fits in 63
// bits. Past that numel() and bytes() would wrap around to a small or negative count, which later
// checks would misread; the error names the shape and the overflow.
Status check_element_count(const Shape& shape);

class TensorDesc {
 public:
  TensorDesc() = default;
  // Refuses rank outside 1..4, a dimension < 1, a size that overflows (check_element_count) and
  // NHWC below rank 4.
  static Result<TensorDesc> make(const Shape& shape, DType dtype, Layout layout = Layout::nchw);

  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank; }
  std::int64_t dim(int i) const { return shape_[i]; }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  // Elements between neighbours along logical dimension i.
  std::int64_t stride(int i) const { return strides_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Element offsets of a logical index; the rank must match.
  std::int64_t offset(std::int64_t i0) const {
    assert(rank() == 1);
    return i0 * strides_[0];
  }
  std::int64_t offset(std::int64_t i0, std::int64_t i1) const {
    assert(rank() == 2);
    return i0 * strides_[0] + i1 * strides_[1];
  }
  std::int64_t offset(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) const {
    assert(rank() == 4);
    return n * strides_[0] + c * strides_[1] + h * strides_[2] + w * strides_[3];
  }

  TensorDesc with_dtype(DType dtype) const;
  // Same shape with other strides; a rank below 4 has only one layout and is returned unchanged.
  TensorDesc with_layout(Layout layout) const;
  // "fp32[2x64x56x56, NHWC]".
  std::string str() const;
  friend bool operator==(const TensorDesc& a, const TensorDesc& b);

 private:
  TensorDesc(const Shape& shape, DType dtype, Layout layout);

  Shape shape_;
  DType dtype_ = DType::fp32;
  Layout layout_ = Layout::nchw;
  std::array<std::int64_t, kMaxRank> strides_{};
};

// Non-owning: a description and the address of its first element, in whatever memory it lives.
struct TensorView {
  TensorDesc desc;
  void* data = nullptr;
};

// A tensor in host memory that owns its elements.
class HostTensor {
 public:
  HostTensor() = default;
  // Floating-point elements start as NaN and integers as INT_MIN, so an element an op forgets to
  // write shows up in a comparison instead of passing as a plausible zero.
  explicit HostTensor(const TensorDesc& desc);
  static HostTensor zeros(const TensorDesc& desc);
  // Deterministic uniform values in [lo, hi) (before rounding to the dtype) from `seed`, the same
  // on every platform and standard library (integer dtypes: whole numbers in [lo, hi)).
  static HostTensor random(const TensorDesc& desc, std::uint64_t seed, double lo = -1.0,
                           double hi = 1.0);

  const TensorDesc& desc() const { return desc_; }
  const Shape& shape() const { return desc_.shape(); }
  DType dtype() const { return desc_.dtype(); }
  Layout layout() const { return desc_.layout(); }
  std::int64_t numel() const { return desc_.numel(); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  TensorView view() { return {desc_, data()}; }

  // The elements in storage order; T must be the tensor's element type.
  template <class T>
  std::span<T> values() {
    assert(dtype_of<T> == desc_.dtype());
    return {reinterpret_cast<T*>(storage_.data()), static_cast<std::size_t>(numel())};
  }
  template <class T>
  std::span<const T> values() const {
    assert(dtype_of<T> == desc_.dtype());
    return {reinterpret_cast<const T*>(storage_.data()), static_cast<std::size_t>(numel())};
  }
  // Element at a logical index (same arguments as TensorDesc::offset).
  template <class T, class... Idx>
  T& at(Idx... idx) {
    return values<T>()[static_cast<std::size_t>(desc_.offset(idx...))];
  }
  template <class T, class... Idx>
  const T& at(Idx... idx) const {
    return values<T>()[static_cast<std::size_t>(desc_.offset(idx...))];
  }

  void fill(double value);
  // Any floating element as double (fp16/bf16 widened exactly); integers converted.
  double get(std::int64_t storage_index) const;
  void set(std::int64_t storage_index, double value);

  // Copies into another layout; the values at each logical index are unchanged.
  HostTensor to_layout(Layout layout) const;
  // Copies into another dtype: between floating types by rounding to nearest even (fp64 reaches
  // fp16/bf16 through fp32, as c10::Half and c10::BFloat16 do); between integer types only when
  // every value fits. Floating <-> integer is refused: labels and values never mix.
  Result<HostTensor> to_dtype(DType dtype) const;

 private:
  TensorDesc desc_;
  // 16-byte alignment (operator new's) is enough for every element type here.
  std::vector<std::byte> storage_;
};

}  // namespace dlprobe
