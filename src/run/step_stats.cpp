// Step statistics of a run; order statistics come from the project's statistics library.
#include <algorithm>

#include "dlprobe/run/runner.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::run {

namespace {

double quantile(const std::vector<double>& sorted, double q) {
  return stats::percentile_sorted(sorted, q);
}

}  // namespace

StepStats summarize_steps(const std::vector<StepRecord>& steps, const std::vector<double>& rates,
                          std::int64_t warmup_steps, std::optional<std::int64_t> default_batch) {
  StepStats s;
  s.steps_seen = static_cast<std::int64_t>(steps.size());
  const bool marked = std::any_of(steps.begin(), steps.end(),
                                  [](const StepRecord& r) { return r.warmup.has_value(); });
  std::vector<const StepRecord*> measured;
  // Each measured step's time from when its line came, where a line came before it: the measured
  // steps' time without step times. A warm-up step between measured ones (an evaluation) leaves
  // its own interval out, so that the measured items are not divided by the time since it alone.
  double arrival_time_s = 0;
  std::optional<double> first_start_s;  // arrival of the line before the first measured step
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& r = steps[i];
    const bool warm =
        marked ? r.warmup.value_or(false) : static_cast<std::int64_t>(i) < warmup_steps;
    if (warm) {
      ++s.warmup_dropped;
    } else {
      if (measured.empty() && i > 0) first_start_s = steps[i - 1].arrival_s;
      if (i > 0) arrival_time_s += r.arrival_s - steps[i - 1].arrival_s;
      measured.push_back(&r);
    }
    if (r.batch) s.batch = r.batch;
  }
  if (!s.batch) s.batch = default_batch;
  s.steps_measured = static_cast<std::int64_t>(measured.size());

  if (!measured.empty()) {
    const StepRecord& first = *measured.front();
    s.measured_start_s =
        first_start_s ? *first_start_s : first.arrival_s - first.step_time_s.value_or(0.0);
    s.measured_end_s = measured.back()->arrival_s;
    std::vector<double> times;
    double data = 0;
    bool all_data = true;
    for (const auto* r : measured) {
      if (r->step_time_s) times.push_back(*r->step_time_s);
      if (r->data_time_s) {
        data += *r->data_time_s;
      } else {
        all_data = false;
      }
    }
    const bool all_timed = times.size() == measured.size();
    if (all_timed) {
      double sum = 0;
      for (double t : times) sum += t;
      s.elapsed_s = sum;
      if (all_data && sum > 0) s.data_wait_share = data / sum;
    } else if (first_start_s && arrival_time_s > 0) {
      // Without step times, the time the measured steps took is read from when their lines came.
      s.elapsed_s = arrival_time_s;
    }
    if (!times.empty()) {
      std::sort(times.begin(), times.end());
      s.step_min_s = times.front();
      s.step_max_s = times.back();
      s.step_median_s = quantile(times, 0.5);
      s.step_p90_s = quantile(times, 0.9);
      double sum = 0;
      for (double t : times) sum += t;
      s.step_mean_s = sum / static_cast<double>(times.size());
    }
    double items = 0;
    bool all_batched = true;
    for (const auto* r : measured) {
      if (r->batch) {
        items += static_cast<double>(*r->batch);
      } else if (default_batch) {
        items += static_cast<double>(*default_batch);
      } else {
        all_batched = false;
      }
    }
    if (all_batched) s.items = items;
    // A step printed as taking 0 s (a coarse clock: "0.000s") has no throughput of its own: the
    // per-step samples, which the results file refuses to hold such a step in, are left out, and
    // the throughput comes from the steps' total time as before.
    const bool all_positive =
        std::all_of(times.begin(), times.end(), [](double t) { return t > 0; });
    if (all_timed && all_batched && all_positive) {
      for (const auto* r : measured) {
        s.step_seconds.push_back(*r->step_time_s);
        s.step_items.push_back(static_cast<double>(r->batch ? *r->batch : *default_batch));
      }
    }
    if (s.items && s.elapsed_s && *s.elapsed_s > 0) {
      s.items_per_s = *s.items / *s.elapsed_s;
      s.throughput_source = "steps";
    }
  }
  if (!s.items_per_s && !rates.empty()) {
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    s.items_per_s = quantile(sorted, 0.5);
    s.throughput_source = "reported rate";
  }
  return s;
}

// Ten short steps can fit between two samples; the nearest samples then still describe the steps
// (NVML's utilisation is itself an average over its last sampling period), where falling back to
// the whole run would describe its start-up.
TimeWindow widen_to_samples(TimeWindow window, const std::vector<double>& sample_times,
                            std::size_t k) {
  if (sample_times.empty() || k == 0) return window;
  std::vector<double> distance;
  distance.reserve(sample_times.size());
  for (double t : sample_times) {
    distance.push_back(t < window.start_s ? window.start_s - t
                                          : (t > window.end_s ? t - window.end_s : 0.0));
  }
  const std::size_t nth = std::min(k, distance.size()) - 1;
  std::nth_element(distance.begin(), distance.begin() + static_cast<std::ptrdiff_t>(nth),
                   distance.end());
  const double by = distance[nth];
  return {window.start_s - by, window.end_s + by};
}

}  // namespace dlprobe::run
