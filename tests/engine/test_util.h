// Helpers shared by the engine tests: random tensors, layout-independent comparison, and central
// finite differences for gradient checks.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "dlprobe/engine/tensor.h"

namespace dlprobe::testing {

inline TensorDesc desc(const Shape& s, DType t = DType::fp64, Layout l = Layout::nchw) {
  return TensorDesc::make(s, t, l).value();
}

// A one-element tensor holding v.
inline HostTensor scalar(double v, DType t = DType::fp64) {
  HostTensor s(desc({1}, t));
  s.set(0, v);
  return s;
}

inline HostTensor rand(const Shape& s, std::uint64_t seed, DType t = DType::fp64,
                       Layout l = Layout::nchw, double lo = -1.0, double hi = 1.0) {
  return HostTensor::random(desc(s, t, l), seed, lo, hi);
}

// Calls f(index) for every logical index of `s` (unused trailing entries are 0).
inline void for_each_index(const Shape& s,
                           const std::function<void(std::array<std::int64_t, 4>)>& f) {
  std::array<std::int64_t, 4> i{};
  const std::int64_t total = s.numel();
  for (std::int64_t flat = 0; flat < total; ++flat) {
    std::int64_t rest = flat;
    for (int d = s.rank - 1; d >= 0; --d) {
      i[static_cast<std::size_t>(d)] = rest % s[d];
      rest /= s[d];
    }
    f(i);
  }
}

inline std::int64_t offset_of(const TensorDesc& d, const std::array<std::int64_t, 4>& i) {
  std::int64_t off = 0;
  for (int k = 0; k < d.rank(); ++k) off += i[static_cast<std::size_t>(k)] * d.stride(k);
  return off;
}

// Value at a logical index, whatever the layout and floating dtype.
inline double value_at(const HostTensor& t, const std::array<std::int64_t, 4>& i) {
  return t.get(offset_of(t.desc(), i));
}

inline std::string index_str(const Shape& s, const std::array<std::int64_t, 4>& i) {
  std::string out = "(";
  for (int k = 0; k < s.rank; ++k)
    out += (k ? "," : "") + std::to_string(i[static_cast<std::size_t>(k)]);
  return out + ")";
}

// Every element within atol + rtol * |expected|, compared by logical index (so across layouts).
inline ::testing::AssertionResult all_close(const HostTensor& actual, const HostTensor& expected,
                                            double rtol, double atol) {
  if (!(actual.shape() == expected.shape())) {
    return ::testing::AssertionFailure()
           << "shape " << actual.shape().str() << " vs " << expected.shape().str();
  }
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  int reported = 0;
  double worst = 0;
  for_each_index(actual.shape(), [&](std::array<std::int64_t, 4> i) {
    const double a = value_at(actual, i);
    const double e = value_at(expected, i);
    const double err = std::abs(a - e);
    if (!(err <= atol + rtol * std::abs(e))) {
      if (reported == 0) result = ::testing::AssertionFailure();
      if (reported < 5) {
        result << "at " << index_str(actual.shape(), i) << ": " << a << " vs expected " << e
               << " (diff " << err << ")\n";
      }
      ++reported;
      worst = std::max(worst, err);
    }
  });
  if (reported > 0) result << reported << " elements differ, worst by " << worst;
  return result;
}

// Every element equal, compared by logical index, with NaN equal to NaN (and inf to inf): the
// check for two runs of the same deterministic kernels.
inline ::testing::AssertionResult identical(const HostTensor& actual, const HostTensor& expected) {
  if (!(actual.shape() == expected.shape())) {
    return ::testing::AssertionFailure()
           << "shape " << actual.shape().str() << " vs " << expected.shape().str();
  }
  std::int64_t differ = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for_each_index(actual.shape(), [&](std::array<std::int64_t, 4> i) {
    const double a = value_at(actual, i);
    const double e = value_at(expected, i);
    if (a == e || (std::isnan(a) && std::isnan(e))) return;
    if (differ++ == 0) {
      result = ::testing::AssertionFailure()
               << "first at " << index_str(actual.shape(), i) << ": " << a << " vs " << e << "; ";
    }
  });
  if (differ > 0) result << differ << " of " << actual.numel() << " elements differ";
  return result;
}

// Sum over logical indices of a * b: the scalar loss <y, g> whose gradient w.r.t. y is g.
inline double dot(const HostTensor& a, const HostTensor& b) {
  double sum = 0;
  for_each_index(a.shape(),
                 [&](std::array<std::int64_t, 4> i) { sum += value_at(a, i) * value_at(b, i); });
  return sum;
}

// d loss / d x by central differences, perturbing x in place (restored afterwards). x is fp64.
inline HostTensor numeric_gradient(HostTensor& x, const std::function<double()>& loss,
                                   double h = 1e-6) {
  HostTensor grad(x.desc());
  auto v = x.values<double>();
  auto g = grad.values<double>();
  for (std::size_t k = 0; k < v.size(); ++k) {
    const double saved = v[k];
    v[k] = saved + h;
    const double up = loss();
    v[k] = saved - h;
    const double down = loss();
    v[k] = saved;
    g[k] = (up - down) / (2 * h);
  }
  return grad;
}

// Tolerances for a finite-difference check in fp64: central differences with h = 1e-6 are good to
// about 1e-9 on these O(1) values, so 1e-6 still catches any wrong term of a gradient.
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kGradRtol = 1e-6;
inline constexpr double kGradAtol = 1e-7;

}  // namespace dlprobe::testing
