// `dlprobe compare`: two results files, configuration by configuration (matched on kind and
// settings), with the throughput ratio new / base and its bootstrap CI, the Mann–Whitney U p-value
// of the step times, and a verdict. The throughput interval decides: "slower" or "faster" when it
// excludes 1 and the ratio is beyond the noise threshold, else "no change"; where the U test
// disagrees, the verdict says so with its p. (The throughput is what a user pays for: a quarter of
// the steps at four times the time is a real drop, though the typical step, which the U test
// ranks, did not change.) A real difference smaller than the noise threshold is "no change": with
// hundreds of steps a 0.3% drift of the GPU clock between two runs is significant, and calling it
// "slower" would cry wolf.
// Where a side was run several times from scratch (bench --repeat), the half-width of its
// interval between runs, relative to their mean, is the noise when it is the larger: the interval
// within the steps of one run does not see what changes from run to run.
// Where both sides were profiled (bench --profile), a row also names the calls whose device time
// moved most, so that a slower step says where it got slower.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/results/results.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::report {

enum class Verdict {
  faster,
  slower,
  no_change,
  not_comparable,  // one side did not finish (oom, failed, ...) or has no timed steps, or the
                   // step times give no finite throughput
};
std::string_view verdict_name(Verdict verdict);

struct ComparisonRow {
  results::Kind kind = results::Kind::native;
  results::Settings settings;
  results::RunStatus base_status = results::RunStatus::ok;
  results::RunStatus new_status = results::RunStatus::ok;
  std::optional<double> base_throughput;
  std::optional<double> new_throughput;
  std::optional<stats::Ratio> ratio;  // new / base
  std::optional<stats::MannWhitney> mann_whitney;
  Verdict verdict = Verdict::not_comparable;
  // The base measured this configuration (it finished, with timed steps) and the new file did
  // not: a run that broke, which `--fail-above` gates on as on a slowdown.
  bool lost = false;
  double noise = 0;  // the threshold applied: the option's, or the spread between runs
  // Why two finished runs are not comparable, or where the two tests disagree; else empty.
  std::string why;
  // With both sides profiled: the calls (by name, their times summed where a name repeats)
  // whose ms moved most, largest move first, at most kMovedCalls; a call of one side only has
  // no time on the other.
  struct MovedCall {
    std::string name;
    std::optional<double> base_ms;
    std::optional<double> new_ms;
  };
  std::vector<MovedCall> moved_calls;
};
inline constexpr std::size_t kMovedCalls = 8;

struct Comparison {
  std::vector<ComparisonRow> rows;
  std::vector<std::string> only_in_base;  // described configurations
  std::vector<std::string> only_in_new;
};

struct CompareOptions {
  double alpha = 0.05;
  // |ratio - 1| below this is no change, however significant (criterion.rs's noise threshold).
  double noise = 0.01;
  stats::BootstrapOptions bootstrap;
};

// Fails (one line) when no configuration of one file matches one of the other: the files measured
// different things and a comparison would say nothing.
Result<Comparison> compare(const results::Document& base, const results::Document& next,
                           const CompareOptions& options = {});

// The verdict (and its why) of a row from its ratio and U test, beside the larger of the options'
// noise and the row's; not comparable without them.
void judge(ComparisonRow& row, const CompareOptions& options);

// The throughput drop of a slower row, 1 - ratio; 0 for any other verdict.
double regression(const ComparisonRow& row);

std::string render_comparison_text(const Comparison& comparison);
nlohmann::json comparison_json(const Comparison& comparison);

}  // namespace dlprobe::report
