#include "dlprobe/stats/statistics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dlprobe/stats/mersenne.h"

namespace dlprobe::stats {

double percentile_sorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) return 0;
  const double h = static_cast<double>(sorted.size() - 1) * std::clamp(q, 0.0, 1.0);
  const double lower = std::floor(h);
  const auto i = static_cast<std::size_t>(lower);
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (h - lower) * (sorted[i + 1] - sorted[i]);
}

double percentile(std::span<const double> values, double q) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return percentile_sorted(sorted, q);
}

double median(std::span<const double> values) {
  return percentile(values, 0.5);
}

double mean(std::span<const double> values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

double stddev(std::span<const double> values) {
  if (values.size() < 2) return 0;
  const double m = mean(values);
  double sum = 0;
  for (double v : values) sum += (v - m) * (v - m);
  return std::sqrt(sum / static_cast<double>(values.size() - 1));
}

double mad(std::span<const double> values) {
  const double m = median(values);
  std::vector<double> deviations;
  deviations.reserve(values.size());
  for (double v : values) deviations.push_back(std::abs(v - m));
  return median(deviations);
}

double coefficient_of_variation(std::span<const double> values) {
  const double m = mean(values);
  if (values.size() < 2 || m == 0) return 0;
  return stddev(values) / m;
}

std::vector<std::size_t> outliers(std::span<const double> values, double threshold) {
  std::vector<std::size_t> out;
  if (values.size() < 3) return out;
  const double m = median(values);
  // Scale so that the score is in standard deviations for normal data: 1.4826 MAD estimates sigma,
  // and so does 1.2533 times the mean absolute deviation (Iglewicz & Hoaglin's fallback).
  double scale = 1.4826 * mad(values);
  if (scale == 0) {
    double sum = 0;
    for (double v : values) sum += std::abs(v - m);
    scale = 1.2533 * sum / static_cast<double>(values.size());
  }
  if (scale == 0) return out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::abs(values[i] - m) / scale > threshold) out.push_back(i);
  }
  return out;
}

namespace {

Status check_steps(std::span<const double> seconds, std::span<const double> items,
                   std::string_view what) {
  if (seconds.empty()) return invalid_argument(fmt::format("{}: no timed steps", what));
  if (seconds.size() != items.size()) {
    return invalid_argument(
        fmt::format("{}: {} step times but {} item counts", what, seconds.size(), items.size()));
  }
  for (std::size_t i = 0; i < seconds.size(); ++i) {
    if (!std::isfinite(seconds[i]) || seconds[i] <= 0) {
      return invalid_argument(
          fmt::format("{}: step {} took {} s; step times must be positive", what, i, seconds[i]));
    }
    if (!std::isfinite(items[i]) || items[i] <= 0) {
      return invalid_argument(fmt::format("{}: step {} processed {} items; counts must be positive",
                                          what, i, items[i]));
    }
  }
  return {};
}

Status check_options(const BootstrapOptions& options) {
  if (options.resamples < 1) {
    return invalid_argument(
        fmt::format("bootstrap resamples must be at least 1, got {}", options.resamples));
  }
  if (!(options.level > 0 && options.level < 1)) {
    return invalid_argument(
        fmt::format("confidence level must be between 0 and 1, got {}", options.level));
  }
  return {};
}

double total(std::span<const double> values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum;
}

// A uniform index below n (`modulo`'s divisor; `threshold` is 2^64 mod n).
// std::uniform_int_distribution is not specified bit for bit, so the same seed could give other
// intervals with another standard library; MT19937-64 itself is specified, and rejection sampling
// over its output is exact and portable.
std::size_t uniform_index(Mt19937_64& rng, std::uint64_t threshold, const Remainder& modulo) {
  for (;;) {
    const std::uint64_t r = rng();
    if (r >= threshold) return static_cast<std::size_t>(modulo.of(r));
  }
}

// Consecutive steps summed into at most kMaxBootstrapBlocks blocks of near-equal length (sizes
// differ by at most one step); up to that many steps, every block is one step.
struct Blocks {
  std::vector<double> seconds;
  std::vector<double> items;
};

Blocks blocks_of(std::span<const double> seconds, std::span<const double> items) {
  const std::size_t n = seconds.size();
  const std::size_t count = std::min(n, kMaxBootstrapBlocks);
  Blocks b;
  b.seconds.reserve(count);
  b.items.reserve(count);
  for (std::size_t j = 0; j < count; ++j) {
    double t = 0;
    double k = 0;
    for (std::size_t i = j * n / count; i < (j + 1) * n / count; ++i) {
      t += seconds[i];
      k += items[i];
    }
    b.seconds.push_back(t);
    b.items.push_back(k);
  }
  return b;
}

// The throughput of one resample of the blocks.
double resampled_throughput(Mt19937_64& rng, const Blocks& blocks) {
  const std::size_t n = blocks.seconds.size();
  const std::uint64_t threshold = (0 - std::uint64_t{n}) % n;  // 2^64 mod n
  const Remainder modulo(n);
  double t = 0;
  double k = 0;
  for (std::size_t draw = 0; draw < n; ++draw) {
    const std::size_t i = uniform_index(rng, threshold, modulo);
    t += blocks.seconds[i];
    k += blocks.items[i];
  }
  return k / t;
}

Interval percentile_interval(std::vector<double> values, double level) {
  std::sort(values.begin(), values.end());
  const double tail = (1 - level) / 2;
  return {percentile_sorted(values, tail), percentile_sorted(values, 1 - tail)};
}

}  // namespace

Result<Interval> throughput_ci(std::span<const double> seconds, std::span<const double> items,
                               const BootstrapOptions& options) {
  DLPROBE_RETURN_IF_ERROR(check_steps(seconds, items, "throughput"));
  DLPROBE_RETURN_IF_ERROR(check_options(options));
  const Blocks blocks = blocks_of(seconds, items);
  Mt19937_64 rng(options.seed);
  std::vector<double> throughputs(static_cast<std::size_t>(options.resamples));
  for (auto& t : throughputs) t = resampled_throughput(rng, blocks);
  return percentile_interval(std::move(throughputs), options.level);
}

Result<Summary> summarize(std::span<const double> seconds, std::span<const double> items,
                          const BootstrapOptions& options) {
  DLPROBE_ASSIGN_OR_RETURN(const Interval ci, throughput_ci(seconds, items, options));
  std::vector<double> sorted(seconds.begin(), seconds.end());
  std::sort(sorted.begin(), sorted.end());
  Summary s;
  s.steps = seconds.size();
  s.total_items = total(items);
  s.total_seconds = total(seconds);
  s.throughput = s.total_items / s.total_seconds;
  s.throughput_ci = ci;
  s.ci_level = options.level;
  s.bootstrap_resamples = options.resamples;
  s.bootstrap_seed = options.seed;
  s.mean_s = mean(seconds);
  s.median_s = percentile_sorted(sorted, 0.5);
  s.p90_s = percentile_sorted(sorted, 0.9);
  s.p99_s = percentile_sorted(sorted, 0.99);
  s.min_s = sorted.front();
  s.max_s = sorted.back();
  s.mad_s = mad(seconds);
  s.cv = coefficient_of_variation(seconds);
  s.outliers = outliers(seconds).size();
  return s;
}

Result<Ratio> throughput_ratio(std::span<const double> base_seconds,
                               std::span<const double> base_items,
                               std::span<const double> new_seconds,
                               std::span<const double> new_items, const BootstrapOptions& options) {
  DLPROBE_RETURN_IF_ERROR(check_steps(base_seconds, base_items, "base"));
  DLPROBE_RETURN_IF_ERROR(check_steps(new_seconds, new_items, "new"));
  DLPROBE_RETURN_IF_ERROR(check_options(options));
  Ratio r;
  r.ratio = (total(new_items) / total(new_seconds)) / (total(base_items) / total(base_seconds));
  r.level = options.level;
  const Blocks base_blocks = blocks_of(base_seconds, base_items);
  const Blocks new_blocks = blocks_of(new_seconds, new_items);
  Mt19937_64 rng(options.seed);
  std::vector<double> ratios(static_cast<std::size_t>(options.resamples));
  for (auto& x : ratios) {
    const double base = resampled_throughput(rng, base_blocks);
    x = resampled_throughput(rng, new_blocks) / base;
  }
  r.ci = percentile_interval(std::move(ratios), options.level);
  return r;
}

namespace {

// The number of the C(m + n, m) orderings of samples of sizes m and n (no ties) with U <= u_max,
// and C(m + n, m) itself. The counts of U are the coefficients of the Gaussian binomial
// [m + n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i), taken up to q^u_max: at most 2m
// passes over u_max + 1 terms, linear in the larger sample where a recurrence over both sizes is
// quadratic in it (a results file may hold a million steps). In doubles the tail stayed within
// 5e-15 of the integer sums (m up to 8, n up to 30,000, u_max up to m n / 2).
struct Tail {
  double at_most = 0;
  double all = 1;
};
Tail u_tail(std::size_t m, std::size_t n, std::size_t u_max) {
  std::vector<double> counts(u_max + 1, 0.0);
  counts[0] = 1;
  for (std::size_t i = 1; i <= m; ++i) {  // / (1 - q^i): ascending, counts[u - i] is new
    for (std::size_t u = i; u <= u_max; ++u) counts[u] += counts[u - i];
  }
  for (std::size_t i = 1; i <= m; ++i) {  // * (1 - q^(n+i)): descending, counts[u - n - i] old
    for (std::size_t u = u_max + 1; u-- > n + i;) counts[u] -= counts[u - (n + i)];
  }
  Tail t;
  for (double c : counts) t.at_most += c;
  for (std::size_t i = 1; i <= m; ++i) {
    t.all = t.all * static_cast<double>(n + i) / static_cast<double>(i);
  }
  return t;
}

}  // namespace

Result<MannWhitney> mann_whitney_u(std::span<const double> a, std::span<const double> b) {
  if (a.empty() || b.empty()) {
    return invalid_argument("Mann-Whitney U needs at least one value in each sample");
  }
  struct Item {
    double value;
    bool from_a;
  };
  std::vector<Item> all;
  all.reserve(a.size() + b.size());
  for (double v : a) {
    if (!std::isfinite(v)) return invalid_argument("Mann-Whitney U: a value is not finite");
    all.push_back({v, true});
  }
  for (double v : b) {
    if (!std::isfinite(v)) return invalid_argument("Mann-Whitney U: a value is not finite");
    all.push_back({v, false});
  }
  std::sort(all.begin(), all.end(), [](const Item& x, const Item& y) { return x.value < y.value; });
  // Average ranks (1-based) over runs of ties; tie_term = sum of t^3 - t over the runs.
  double rank_sum_a = 0;
  double tie_term = 0;
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i;
    while (j < all.size() && all[j].value == all[i].value) ++j;
    const double rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (std::size_t k = i; k < j; ++k) {
      if (all[k].from_a) rank_sum_a += rank;
    }
    const auto t = static_cast<double>(j - i);
    tie_term += t * t * t - t;
    i = j;
  }
  const auto na = static_cast<double>(a.size());
  const auto nb = static_cast<double>(b.size());
  MannWhitney r;
  r.u_a = rank_sum_a - na * (na + 1) / 2;
  r.u_b = na * nb - r.u_a;

  if (tie_term == 0 && std::min(a.size(), b.size()) <= kMannWhitneyExactMax) {
    // No ties: U is a whole number. The distribution is symmetric, so the two-sided p-value is
    // twice the lower tail at the smaller U.
    const auto u_min = static_cast<std::size_t>(std::min(r.u_a, r.u_b));
    const Tail tail = u_tail(std::min(a.size(), b.size()), std::max(a.size(), b.size()), u_min);
    r.exact = true;
    r.p_value = std::min(1.0, 2 * tail.at_most / tail.all);
    return r;
  }

  const double n = na + nb;
  const double mu = na * nb / 2;
  const double variance = na * nb / 12 * ((n + 1) - tie_term / (n * (n - 1)));
  if (variance <= 0) {  // every value equal: no evidence of any difference
    r.p_value = 1;
    return r;
  }
  r.z = (std::max(r.u_a, r.u_b) - mu - 0.5) / std::sqrt(variance);
  r.p_value = std::min(1.0, std::erfc(r.z / std::sqrt(2.0)));
  return r;
}

}  // namespace dlprobe::stats
