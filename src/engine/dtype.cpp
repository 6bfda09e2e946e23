#include "dlprobe/engine/dtype.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>

namespace dlprobe {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::fp64:
    case DType::int64:
      return 8;
    case DType::fp32:
    case DType::int32:
      return 4;
    case DType::fp16:
    case DType::bf16:
      return 2;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::fp64:
      return "fp64";
    case DType::fp32:
      return "fp32";
    case DType::fp16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view text, std::string_view flag) {
  struct Name {
    std::string_view name;
    DType type;
  };
  static constexpr Name kNames[] = {
      {"fp64", DType::fp64}, {"float64", DType::fp64},  {"double", DType::fp64},
      {"fp32", DType::fp32}, {"float32", DType::fp32},  {"float", DType::fp32},
      {"fp16", DType::fp16}, {"float16", DType::fp16},  {"half", DType::fp16},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16}, {"int32", DType::int32},
      {"int", DType::int32}, {"int64", DType::int64},   {"long", DType::int64},
  };
  for (const Name& n : kNames) {
    if (n.name == text) return n.type;
  }
  return invalid_argument(
      fmt::format("{}: unknown dtype '{}' (expected fp64, fp32, fp16, bf16, "
                  "int32 or int64)",
                  flag, text));
}

bool dtype_is_floating(DType t) {
  return t == DType::fp64 || t == DType::fp32 || t == DType::fp16 || t == DType::bf16;
}

Half float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {
    // Infinity stays infinity; a NaN keeps its top payload bits and is made quiet, so that a
    // payload living only in the low bits cannot turn into infinity.
    if (abs == 0x7F800000u) return Half{static_cast<std::uint16_t>(sign | 0x7C00u)};
    return Half{static_cast<std::uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu))};
  }
  // 65520 is halfway between the largest half (65504, odd mantissa) and 2^16: ties go to even,
  // which is infinity.
  if (abs >= 0x477FF000u) return Half{static_cast<std::uint16_t>(sign | 0x7C00u)};
  if (abs >= 0x38800000u) {
    // Normal in half (>= 2^-14): rebias the exponent (127 -> 15) and round the 13 dropped bits
    // to nearest even; a carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t odd = (abs >> 13) & 1u;
    const std::uint32_t rounded = abs - (112u << 23) + 0xFFFu + odd;
    return Half{static_cast<std::uint16_t>(sign | (rounded >> 13))};
  }
  // Subnormal in half: the result is m * 2^-24 with m in [0, 1024]. Below 2^-25 everything
  // rounds to zero (2^-25 itself is a tie, and zero is even).
  const std::uint32_t exp = abs >> 23;
  if (exp < 102) return Half{sign};
  const std::uint32_t significand = (abs & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126 - exp;  // 14..24
  std::uint32_t m = significand >> shift;
  const std::uint32_t rest = significand & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (m & 1u) != 0)) ++m;
  // m == 1024 is the encoding of the smallest normal, 2^-14, which is where it rounded to.
  return Half{static_cast<std::uint16_t>(sign | m)};
}

float half_to_float(Half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1Fu;
  const std::uint32_t mant = h.bits & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    // Zero or subnormal: m * 2^-24 is exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mant), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

BFloat16 float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: truncating could leave a zero mantissa (infinity), so force the quiet bit.
    return BFloat16{static_cast<std::uint16_t>((x >> 16) | 0x0040u)};
  }
  // bf16 is the top half of a float: round the low 16 bits to nearest even. Overflow carries into
  // the exponent and lands on infinity, as it should.
  const std::uint32_t odd = (x >> 16) & 1u;
  return BFloat16{static_cast<std::uint16_t>((x + 0x7FFFu + odd) >> 16)};
}

float bf16_to_float(BFloat16 b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}

}  // namespace dlprobe
