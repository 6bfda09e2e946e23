// Statistics of a timed benchmark: per-step times and the items (images, samples) each step
// processed in, a throughput with its confidence interval, robust spread, outliers, and the
// comparison of two runs (Mann–Whitney U, ratio of throughputs with a bootstrap interval).
//
// Definitions (docs/results-schema.md repeats them for readers of the results files):
//   throughput   total items / total seconds over the timed steps. Never the mean of per-step
//                rates: that over-weights fast steps and is not what the user gets end to end.
//   percentile   numpy's default ("linear", Hyndman & Fan type 7): on the sorted values x[0..n-1],
//                h = (n - 1) q, result = x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]).
//   MAD          median of |x - median|, unscaled.
//   CV           sample standard deviation (n - 1) / mean; 0 for fewer than two values.
//   outlier      modified z-score |x - median| / (1.4826 MAD) above a threshold (default 3.5,
//                Iglewicz & Hoaglin), the robust score hyperfine also uses. When MAD is 0 (more
//                than half the steps identical) the mean absolute deviation × 1.2533 stands in for
//                1.4826 MAD, as Iglewicz & Hoaglin recommend, so a tie-heavy clock does not mark
//                every other step an outlier.
//   bootstrap    a block bootstrap: the steps, in the order they ran, are cut into at most
//                kMaxBootstrapBlocks blocks of consecutive steps of near-equal length (up to that
//                many steps, each step is a block of its own), the blocks are resampled with
//                replacement (time and items together), the throughput of each resample computed,
//                and the interval is the percentile interval of those. Consecutive step times are
//                correlated (clocks, temperature, caches), which resampling single steps ignores;
//                a block keeps that correlation inside it. The cost is resamples x blocks,
//                whatever the number of steps. The generator is seeded, so the same input always
//                gives the same interval.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe::stats {

// numpy-linear percentile of `sorted` (ascending, non-empty) at q in [0, 1].
double percentile_sorted(std::span<const double> sorted, double q);
// The same on unsorted values (copies and sorts).
double percentile(std::span<const double> values, double q);
double median(std::span<const double> values);
double mean(std::span<const double> values);
// Sample standard deviation (n - 1); 0 for fewer than two values.
double stddev(std::span<const double> values);
double mad(std::span<const double> values);
double coefficient_of_variation(std::span<const double> values);

inline constexpr double kDefaultOutlierThreshold = 3.5;
// Indices of the outliers of `values` (see the definition above), ascending.
std::vector<std::size_t> outliers(std::span<const double> values,
                                  double threshold = kDefaultOutlierThreshold);

// Blocks of the bootstrap at most (see the definition above): enough for the interval's 2.5% and
// 97.5% points to rest on many distinct resample sums, and few enough that 2,000 resamples of a
// run of millions of steps take milliseconds.
inline constexpr std::size_t kMaxBootstrapBlocks = 1000;

struct BootstrapOptions {
  int resamples = 2000;
  std::uint64_t seed = 0x646c70726f6265;  // "dlprobe"
  double level = 0.95;
};

struct Interval {
  double low = 0;
  double high = 0;
  bool contains(double x) const { return low <= x && x <= high; }
  friend bool operator==(const Interval&, const Interval&) = default;
};

struct Summary {
  std::size_t steps = 0;
  double total_items = 0;
  double total_seconds = 0;
  double throughput = 0;  // items per second: total_items / total_seconds
  Interval throughput_ci;
  double ci_level = 0;
  int bootstrap_resamples = 0;
  std::uint64_t bootstrap_seed = 0;
  // Step times, in seconds.
  double mean_s = 0;
  double median_s = 0;
  double p90_s = 0;
  double p99_s = 0;
  double min_s = 0;
  double max_s = 0;
  double mad_s = 0;
  double cv = 0;
  std::size_t outliers = 0;

  friend bool operator==(const Summary&, const Summary&) = default;
};

// `step_seconds` and `step_items` pair up step by step. Errors: no steps, sizes that differ, a time
// that is not finite and positive, items that are not finite and positive, options out of range.
Result<Summary> summarize(std::span<const double> step_seconds, std::span<const double> step_items,
                          const BootstrapOptions& options = {});

// The bootstrap interval of the throughput alone (summarize() computes it too).
Result<Interval> throughput_ci(std::span<const double> step_seconds,
                               std::span<const double> step_items,
                               const BootstrapOptions& options = {});

// new throughput / base throughput, with the percentile interval of the ratio over resamples that
// draw each run's blocks independently.
struct Ratio {
  double ratio = 0;
  Interval ci;
  double level = 0;
};
Result<Ratio> throughput_ratio(std::span<const double> base_seconds,
                               std::span<const double> base_items,
                               std::span<const double> new_seconds,
                               std::span<const double> new_items,
                               const BootstrapOptions& options = {});

// Two-sided Mann–Whitney U test of whether `a` and `b` come from the same distribution.
// Exact (the permutation distribution of U) when there are no ties and the smaller sample has at
// most kMannWhitneyExactMax values, as scipy's method="auto" does; otherwise the normal
// approximation with the tie correction of the variance and a continuity correction of 0.5.
inline constexpr std::size_t kMannWhitneyExactMax = 8;
struct MannWhitney {
  double u_a = 0;  // U of `a`: pairs (x in a, y in b) with x > y, ties counted one half
  double u_b = 0;  // n_a n_b - u_a
  double z = 0;    // normal approximation's statistic (0 when exact)
  double p_value = 1;
  bool exact = false;
};
Result<MannWhitney> mann_whitney_u(std::span<const double> a, std::span<const double> b);

}  // namespace dlprobe::stats
