// Whether a warm-up has reached the steady state, and the spread of a measurement between runs.
//
// Steady state (docs/bench.md, "Warm-up"): the latest `window` step times are cut into an older and
// a newer half. The steps are still falling when both hold:
//   - the older half's median is above the newer half's by more than `min_fall` (a material fall:
//     a drift of a fraction of a percent is not worth waiting for), and
//   - a two-sided Mann–Whitney U test of the two halves gives p below `alpha` (a fall the noise
//     does not explain: a noisy CPU's halves differ by a few percent either way by chance).
// The newest step must also be within `slow_step` times the window's median: a step that slow is
// not steady whatever the trend. Medians and ranks make one slow step (the first, which creates
// oneDNN's primitives or cuDNN's plans) count as one value, not as a trend.
//
// Spread between runs: a configuration run N times from scratch (fresh engines or processes) gives
// N throughputs. Their Student t interval, mean ± t(level, N - 1) s / sqrt(N), is the uncertainty
// of the figure across runs, which the bootstrap interval of one window (the steps of one run)
// cannot see: clocks, placement in memory and the algorithms picked differ from run to run.
#pragma once

#include <cstddef>
#include <span>

#include "dlprobe/core/status.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::stats {

struct SteadyRule {
  std::size_t window = 10;  // latest steps tested; at least 4 (two per half)
  double min_fall = 0.02;
  double alpha = 0.05;
  double slow_step = 1.5;
};

struct SteadyVerdict {
  bool steady = false;
  // (older median - newer median) / newer median over the window; 0 with too few steps.
  double fall = 0;
  double p_value = 1;  // Mann–Whitney's, older half against newer half
  bool slow_last = false;
};

// Fewer than `rule.window` steps are never steady.
SteadyVerdict steady_state(std::span<const double> step_seconds, const SteadyRule& rule = {});

// The leading steps of a timed window above `slow_step` times its median: steps the warm-up should
// have taken. 0 when the window starts steady.
std::size_t unsettled_prefix(std::span<const double> step_seconds, double slow_step);

// The quantile of Student's t distribution with `df` degrees of freedom at probability p in (0, 1)
// (the CDF through the regularised incomplete beta function, inverted by bisection).
double student_t_quantile(double p, double df);

struct RunSpread {
  std::size_t runs = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
  Interval ci;  // Student t interval of the mean
  double level = 0;

  friend bool operator==(const RunSpread&, const RunSpread&) = default;
};
// Errors: fewer than two runs, a value that is not finite and positive, a level outside (0, 1).
Result<RunSpread> run_spread(std::span<const double> run_values, double level = 0.95);

}  // namespace dlprobe::stats
