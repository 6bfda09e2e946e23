#include "dlprobe/stats/steady_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace dlprobe::stats {
namespace {

// The continued fraction of the regularised incomplete beta function I_x(a, b), evaluated by
// the modified Lentz method (Numerical Recipes, 3rd ed., 6.4). Written here because the one
// library that has it among Debian's packages, Boost.Math, is not otherwise a dependency, and the
// t interval needs nothing else from it.
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  constexpr double kEpsilon = 1e-15;
  const double qab = a + b;
  const double qap = a + 1;
  const double qam = a - 1;
  double c = 1;
  double d = 1 - qab * x / qap;
  if (std::abs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::abs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::abs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::abs(step - 1) < kEpsilon) break;
  }
  return h;
}

double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x));
  // The fraction converges fast below the mean of the beta distribution; above it, the symmetry
  // I_x(a, b) = 1 - I_{1-x}(b, a).
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, 1 - x) / b;
}

double student_t_cdf(double t, double df) {
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t));
  return t >= 0 ? 1 - tail : tail;
}

}  // namespace

SteadyVerdict steady_state(std::span<const double> step_seconds, const SteadyRule& rule) {
  SteadyVerdict v;
  const std::size_t window = std::max<std::size_t>(rule.window, 4);
  if (step_seconds.size() < window) return v;
  const std::span<const double> latest = step_seconds.last(window);
  const std::span<const double> older = latest.first(window / 2);
  const std::span<const double> newer = latest.last(window - window / 2);
  const double newer_median = median(newer);
  if (newer_median > 0) v.fall = (median(older) - newer_median) / newer_median;
  if (auto test = mann_whitney_u(older, newer)) v.p_value = test->p_value;
  v.slow_last = latest.back() > rule.slow_step * median(latest);
  const bool falling = v.fall > rule.min_fall && v.p_value < rule.alpha;
  v.steady = !falling && !v.slow_last;
  return v;
}

std::size_t unsettled_prefix(std::span<const double> step_seconds, double slow_step) {
  if (step_seconds.empty()) return 0;
  const double limit = slow_step * median(step_seconds);
  std::size_t n = 0;
  while (n < step_seconds.size() && step_seconds[n] > limit) ++n;
  return n;
}

double student_t_quantile(double p, double df) {
  if (p == 0.5) return 0;
  if (p < 0.5) return -student_t_quantile(1 - p, df);
  // The CDF rises monotonically; its p-quantile lies below this bound for every df >= 1 and
  // p <= 1 - 1e-12, and 200 halvings fix it to a double's precision.
  double low = 0;
  double high = 1e7;
  for (int i = 0; i < 200 && high - low > 1e-12 * high; ++i) {
    const double mid = (low + high) / 2;
    (student_t_cdf(mid, df) < p ? low : high) = mid;
  }
  return (low + high) / 2;
}

Result<RunSpread> run_spread(std::span<const double> values, double level) {
  if (values.size() < 2) {
    return invalid_argument(
        fmt::format("a spread between runs needs two runs or more, got {}", values.size()));
  }
  if (!(level > 0 && level < 1)) {
    return invalid_argument(fmt::format("confidence level must be between 0 and 1, got {}", level));
  }
  for (double v : values) {
    if (!std::isfinite(v) || v <= 0) {
      return invalid_argument(fmt::format("a run's value of {} is not a positive number", v));
    }
  }
  RunSpread s;
  s.runs = values.size();
  s.mean = mean(values);
  const auto [min, max] = std::minmax_element(values.begin(), values.end());
  s.min = *min;
  s.max = *max;
  const auto n = static_cast<double>(values.size());
  const double half =
      student_t_quantile(1 - (1 - level) / 2, n - 1) * stddev(values) / std::sqrt(n);
  s.ci = {s.mean - half, s.mean + half};
  s.level = level;
  return s;
}

}  // namespace dlprobe::stats
