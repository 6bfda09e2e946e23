#include "dlprobe/report/trend_chart.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "charts.h"
#include "dlprobe/core/clock.h"
#include "dlprobe/report/html.h"

namespace dlprobe::report {
namespace {

using nlohmann::json;

// Milliseconds since 1970 of an ISO-8601 UTC time, the x of a point on the page's time axis; none
// when it is not one.
std::optional<double> epoch_ms(const std::string& date) {
  const auto t = parse_utc_time(date);
  if (!t) return std::nullopt;
  return static_cast<double>(t->time_since_epoch().count());
}

json finite(std::optional<double> v) {
  return v && std::isfinite(*v) ? json(*v) : json(nullptr);
}

json trend_chart(const std::vector<TrendLine>& lines) {
  json spec = chart_spec("chart-trend", "line", "Throughput over time", "items / s");
  spec["dates"] = true;
  json& datasets = spec["config"]["data"]["datasets"];
  json flagged = json::array();
  json flagged_tips = json::array();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const TrendLine& line = lines[i];
    json values = json::array(), low = json::array(), high = json::array(), tips = json::array();
    json last = nullptr;
    for (const TrendPoint& p : line.points) {
      const auto x = epoch_ms(p.date);
      if (!x) continue;
      last = {{"x", *x}, {"y", finite(p.throughput)}};
      values.push_back(last);
      low.push_back({{"x", *x}, {"y", finite(p.ci_low)}});
      high.push_back({{"x", *x}, {"y", finite(p.ci_high)}});
      std::string tip = fmt::format("{}: {:.1f} items/s", line.name, p.throughput);
      if (p.ci_low && p.ci_high) tip += fmt::format(" (CI {:.1f} – {:.1f})", *p.ci_low, *p.ci_high);
      if (!p.note.empty()) tip += ", " + p.note;
      tips.push_back(tip);
    }
    if (values.empty()) continue;
    const std::string colour = chart_colour(i);
    datasets.push_back({{"label", line.name},
                        {"data", std::move(values)},
                        {"tips", std::move(tips)},
                        {"group", i},
                        {"borderColor", colour},
                        {"backgroundColor", colour},
                        {"pointRadius", 3}});
    // The interval as a band: its lower edge, then its upper edge filled down to it.
    for (auto* edge : {&low, &high}) {
      datasets.push_back({{"label", line.name + (edge == &low ? " (CI low)" : " (CI high)")},
                          {"data", std::move(*edge)},
                          {"group", i},
                          {"legend", false},
                          {"fill", edge == &low ? json(false) : json("-1")},
                          {"borderWidth", 0},
                          {"pointRadius", 0},
                          {"pointHitRadius", 0},
                          {"backgroundColor", colour + "30"}});
    }
    if (line.regression) {
      flagged.push_back(last);
      flagged_tips.push_back(fmt::format("{}: {}", line.name, line.verdict));
    }
  }
  if (!flagged.empty()) {
    datasets.push_back({{"type", "scatter"},
                        {"label", "regression"},
                        {"data", std::move(flagged)},
                        {"tips", std::move(flagged_tips)},
                        {"pointStyle", "triangle"},
                        {"rotation", 180},
                        {"radius", 9},
                        {"borderColor", "#b00020"},
                        {"backgroundColor", "#b00020"}});
  }
  json& options = spec["config"]["options"];
  options["scales"]["x"] = {{"type", "linear"}, {"title", axis_title("date of the run (UTC)")}};
  options["scales"]["y"] = {{"beginAtZero", true}, {"title", axis_title("items / s")}};
  return spec;
}

}  // namespace

std::string render_trend_html(std::string_view subtitle, const std::vector<TrendLine>& lines) {
  std::string body = fmt::format("<h1>dlprobe history trend</h1>\n<p class=\"sub\">{}</p>\n",
                                 html_escape(subtitle));
  json charts = json::array();
  json spec = trend_chart(lines);
  if (spec["config"]["data"]["datasets"].empty()) {
    body += "<p class=\"none\">No result to draw.</p>\n";
  } else {
    body += chart_canvas("chart-trend", "Throughput over time", 480);
    charts.push_back(std::move(spec));
  }
  body +=
      "<h2>Series</h2>\n<div class=\"wide\"><table id=\"series\"><thead><tr><th>series</th>"
      "<th>results</th><th>latest (items/s)</th><th>verdict</th></tr></thead><tbody>\n";
  for (const TrendLine& line : lines) {
    body += fmt::format(
        "<tr{}><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>\n",
        line.regression ? " class=\"sev-error\"" : "", html_escape(line.name), line.points.size(),
        line.points.empty() ? "" : fmt::format("{:.1f}", line.points.back().throughput),
        html_escape(line.verdict));
  }
  body += "</tbody></table></div>\n";
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      // As the report: the page loads nothing from anywhere.
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>dlprobe history trend</title>\n<style>{}</style>\n</head>\n<body>\n{}{}</body>\n"
      "</html>\n",
      page_style(), body, chart_scripts(charts));
}

}  // namespace dlprobe::report
