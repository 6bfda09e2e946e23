// Start-up, warm-up and the steady window of a run that reports no steps, from its telemetry.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "dlprobe/run/runner.h"

namespace dlprobe::run {

Phases find_phases(const std::vector<PhaseSample>& samples, std::optional<double> end_bound_s) {
  Phases out;
  const bool gpu = std::any_of(samples.begin(), samples.end(),
                               [](const PhaseSample& s) { return s.gpu_util_pct.has_value(); });
  const bool cpu = std::any_of(samples.begin(), samples.end(),
                               [](const PhaseSample& s) { return s.cpu_pct.has_value(); });
  if (!gpu && !cpu) {
    out.why_none = "no telemetry samples";
    return out;
  }
  out.series = gpu ? "gpu_util" : "cpu";
  auto value = [gpu](const PhaseSample& s) { return gpu ? s.gpu_util_pct : s.cpu_pct; };

  std::vector<double> t;
  std::vector<double> v;
  for (const PhaseSample& s : samples) {
    const auto x = value(s);
    if (!x) continue;
    if (!out.startup_end_s && *x > kSteadyMinLevelPct) out.startup_end_s = s.t_s;
    if (end_bound_s && s.t_s > *end_bound_s) continue;
    t.push_back(s.t_s);
    v.push_back(*x);
  }
  const std::string what = gpu ? "GPU utilisation" : "workload CPU";
  const std::string before =
      end_bound_s ? fmt::format(" before the throughput line at {:.1f} s", *end_bound_s) : "";
  if (v.size() < kSteadyMinSamples) {
    out.why_none = fmt::format("fewer than {} samples{}", kSteadyMinSamples, before);
    return out;
  }
  // The level: the highest median of three neighbours, so that a lone spike (an autotuning burst,
  // a sampling glitch) does not set it.
  double level = 0;
  for (std::size_t i = 1; i + 1 < v.size(); ++i) {
    std::array<double, 3> w{v[i - 1], v[i], v[i + 1]};
    std::sort(w.begin(), w.end());
    level = std::max(level, w[1]);
  }
  out.level_pct = level;
  if (level < kSteadyMinLevelPct) {
    out.why_none = fmt::format("{} never above {:.0f}%{}", what, kSteadyMinLevelPct, before);
    return out;
  }
  // The change points are the crossings of half the level; the longest active stretch is the
  // steady window. Ties go to the later stretch, the nearer to the throughput line.
  const double threshold = kSteadyActiveShare * level;
  std::size_t best_first = 0;
  std::size_t best_count = 0;
  std::size_t i = 0;
  while (i < v.size()) {
    if (v[i] < threshold) {
      ++i;
      continue;
    }
    const std::size_t first = i;
    std::size_t last = i;
    std::size_t j = i + 1;
    while (j < v.size()) {
      if (v[j] >= threshold) {
        last = j++;
        continue;
      }
      std::size_t k = j;
      while (k < v.size() && v[k] < threshold && k - j < kSteadyMaxDip) ++k;
      if (k < v.size() && v[k] >= threshold) {
        j = k;  // a short dip inside the stretch
      } else {
        break;
      }
    }
    const std::size_t count = last - first + 1;
    if (count >= best_count) {
      best_first = first;
      best_count = count;
    }
    i = last + 1;
  }
  if (best_count < kSteadyMinSamples) {
    out.why_none = fmt::format("no {} samples in a row with {} at or above {:.0f}%{}",
                               kSteadyMinSamples, what, threshold, before);
    return out;
  }
  out.steady = TimeWindow{t[best_first], t[best_first + best_count - 1]};
  return out;
}

}  // namespace dlprobe::run
