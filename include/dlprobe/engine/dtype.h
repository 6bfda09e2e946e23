// Element types of the training engine's tensors, and the fp16/bf16 <-> float conversions.
//
// The 16-bit conversions are written here by hand: g++ 12 has no std::float16_t/std::bfloat16_t
// (<stdfloat> arrives in g++ 13), _Float16 is not usable in C++ with g++ 12, and Debian ships no
// small C++ library that converts both formats with round-to-nearest-even and documented NaN
// handling. They follow IEEE 754 binary16 and bfloat16 exactly: round to nearest, ties to even;
// overflow to infinity; subnormals kept (never flushed); NaN stays NaN (quiet, sign kept).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

enum class DType : std::uint8_t {
  fp64,
  fp32,
  fp16,
  bf16,
  int32,  // class labels
  int64,  // class labels as PyTorch gives them (torch.long)
};

std::size_t dtype_size(DType t);
// "fp64", "fp32", "fp16", "bf16", "int32", "int64".
std::string_view dtype_name(DType t);
// Accepts the names above and PyTorch's spellings ("float32", "float", "half", "bfloat16",
// "double", "long", "int"); anything else is a one-line error naming `flag`.
Result<DType> parse_dtype(std::string_view text, std::string_view flag = "dtype");
bool dtype_is_floating(DType t);

// Storage-only 16-bit types: the bit pattern, converted to float for any arithmetic.
struct Half {
  std::uint16_t bits = 0;
  friend bool operator==(Half a, Half b) = default;
};
struct BFloat16 {
  std::uint16_t bits = 0;
  friend bool operator==(BFloat16 a, BFloat16 b) = default;
};

Half float_to_half(float f);
float half_to_float(Half h);
BFloat16 float_to_bf16(float f);
float bf16_to_float(BFloat16 b);

// The DType that stores a C++ element type: dtype_of<float> == DType::fp32. Other types do not
// compile.
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::fp64;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::fp32;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::fp16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::int32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::int64;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace dlprobe
