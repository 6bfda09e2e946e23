// The history as text for a terminal: the list of results, the trend of each configuration with
// its flag, and the environment difference of two results.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dlprobe/history/history.h"
#include "dlprobe/history/trend.h"

namespace dlprobe::history {

// One line per result: number, date, machine, GPU, driver, configuration, status, throughput with
// its CI, median step, peak memory, joules per image; with prices, $ per million images and $ per
// ImageNet epoch at the price of each row's GPU model, and a line naming the prices.
std::string render_list(const std::vector<Entry>& entries, const Prices& prices);

// Per series: a heading, one line per result, and the flag with the ratio to its window, its CI
// and p; beside a flagged result, what changed since the one before.
std::string render_trend(const std::vector<Series>& series, const Prices& prices);

// The flag of a series with the ratio of its latest result to its window, that ratio's CI and p:
// "regression: latest / the 5 results before it 0.912 [0.889, 0.935], p 0.000123".
std::string trend_verdict(const Series& series);

// "the one change: driver 570.86 -> 580.65" when one thing changed, else one line per change;
// "no difference in the recorded environment" when none.
std::string render_changes(const std::vector<Change>& changes);

}  // namespace dlprobe::history
