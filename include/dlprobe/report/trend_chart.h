// The HTML page of `dlprobe history trend --html FILE`: throughput over time, one line per series
// (a configuration on one machine and GPU model) with its confidence interval as a band and the
// latest result of a series flagged a regression marked, drawn by the same embedded Chart.js as
// the report and as self-contained. It takes plain data, which the command fills from the
// history's trend.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlprobe::report {

struct TrendPoint {
  std::string date;       // ISO-8601 UTC ("2026-03-01T12:00:00Z"); a point without one is left out
  double throughput = 0;  // items per second
  std::optional<double> ci_low;
  std::optional<double> ci_high;
  std::string note;  // more words for its tooltip ("#12, driver 570.86")
};

struct TrendLine {
  std::string name;                // "machine, GPU: configuration"
  std::vector<TrendPoint> points;  // oldest first
  bool regression = false;         // the latest point is flagged a regression
  std::string verdict;             // the flag and its figures, for the table and the marker
};

// The page; `subtitle` says what was followed (the history file, the filters).
std::string render_trend_html(std::string_view subtitle, const std::vector<TrendLine>& lines);

}  // namespace dlprobe::report
