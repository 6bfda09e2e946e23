// The HTML report. Its charts are drawn in the page by Chart.js (charts.h), from specifications
// written here.
#include "dlprobe/report/html.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <span>
#include <tuple>

#include "charts.h"
#include "dlprobe/core/units.h"
#include "dlprobe/stats/statistics.h"
#include "fleet.h"
#include "memory_chart.h"

namespace dlprobe::report {

using results::Configuration;
using results::Kind;
using results::NamedDocument;

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

namespace {

using nlohmann::json;

std::string esc(std::string_view s) {
  return html_escape(s);
}

// A configuration with the file it came from.
struct Entry {
  const NamedDocument* file = nullptr;
  const Configuration* config = nullptr;
};

std::vector<Entry> entries(std::span<const NamedDocument> documents) {
  std::vector<Entry> out;
  for (const auto& d : documents) {
    for (const auto& c : d.document.configurations) out.push_back({&d, &c});
  }
  return out;
}

std::string label(const Entry& e, bool several_files) {
  const std::string d = results::describe(e.config->kind, e.config->settings);
  return several_files ? fmt::format("{}: {}", e.file->name, d) : d;
}

// A row's name on an axis: long ones are cut (the tooltip has the whole).
std::string short_label(const std::string& name) {
  return name.size() > 48 ? name.substr(0, 47) + "…" : name;
}

// Everything but the batch: the line a configuration belongs to in throughput vs batch.
std::string series_name(const Entry& e, bool several_files) {
  const std::string name = results::series_label(e.config->kind, e.config->settings);
  return several_files ? fmt::format("{}: {}", e.file->name, name) : name;
}

// A number for the chart's JSON: a value that is not finite (a hand-edited or hostile file) is
// null, which Chart.js leaves out, rather than a number no scale can place.
json number(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

// One point of a per-batch curve: the value, its bar, and the words of its tooltip.
struct BatchPoint {
  double y = 0;
  double low = 0;
  double high = 0;
  std::string tip;
};
using PointOf = std::optional<BatchPoint> (*)(const Configuration&, double per_second);

// A line per series over the batch sizes, a point with an error bar per configuration. The batches
// sit at even spacing (a category axis): sweeps double the batch, and a linear axis would crowd the
// small ones into a corner.
json chart_vs_batch(const std::vector<Entry>& all, bool several, std::string_view id,
                    std::string_view title, std::string_view unit, PointOf point_of,
                    double per_second = 1) {
  std::map<std::string, std::vector<std::pair<std::int64_t, BatchPoint>>> series;
  std::vector<std::string> order;
  std::set<std::int64_t> batches;
  double top = 0;
  for (const auto& e : all) {
    const auto batch = results::batch_of(e.config->kind, e.config->settings);
    const auto point = point_of(*e.config, per_second);
    if (!batch || !point) continue;
    const std::string name = series_name(e, several);
    if (!series.count(name)) order.push_back(name);
    series[name].emplace_back(*batch, BatchPoint{point->y, point->low, point->high,
                                                 label(e, several) + ": " + point->tip});
    batches.insert(*batch);
    if (std::isfinite(point->high)) top = std::max(top, point->high);
  }
  if (series.empty()) return nullptr;
  json spec = chart_spec(id, "line", title, unit);
  json& config = spec["config"];
  for (auto b : batches) config["data"]["labels"].push_back(std::to_string(b));
  for (std::size_t i = 0; i < order.size(); ++i) {
    auto points = series[order[i]];
    std::stable_sort(points.begin(), points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    json data = json::array();
    json tips = json::array();
    for (const auto& [batch, p] : points) {
      data.push_back({{"x", std::to_string(batch)},
                      {"y", number(p.y)},
                      {"low", number(p.low)},
                      {"high", number(p.high)}});
      tips.push_back(p.tip);
    }
    config["data"]["datasets"].push_back({{"label", order[i]},
                                          {"data", std::move(data)},
                                          {"tips", std::move(tips)},
                                          {"borderColor", chart_colour(i)},
                                          {"backgroundColor", chart_colour(i)},
                                          {"pointRadius", 4}});
  }
  spec["errorBars"] = true;
  config["options"]["scales"]["x"] = {{"type", "category"}, {"title", axis_title("batch size")}};
  // The bars' tops too, which Chart.js does not count in the scale.
  config["options"]["scales"]["y"] = {
      {"beginAtZero", true}, {"suggestedMax", top * 1.05}, {"title", axis_title(unit)}};
  return spec;
}

std::optional<BatchPoint> throughput_point(const Configuration& c, double) {
  if (!c.statistics) return std::nullopt;
  const auto& st = *c.statistics;
  return BatchPoint{st.throughput, st.throughput_ci.low, st.throughput_ci.high,
                    fmt::format("{:.1f} items/s ({:.0f}% CI {:.1f} – {:.1f})", st.throughput,
                                st.ci_level * 100, st.throughput_ci.low, st.throughput_ci.high)};
}

// Inference only: there a step is one batch's latency, what a server's users wait for.
std::optional<BatchPoint> latency_point(const Configuration& c, double per_second) {
  if (c.kind != Kind::native || c.settings.mode != "infer" || !c.statistics) return std::nullopt;
  const auto& st = *c.statistics;
  return BatchPoint{
      st.median_s * per_second, st.min_s * per_second, st.p99_s * per_second,
      fmt::format("median {:.4g}, p90 {:.4g}, p99 {:.4g}, min {:.4g}", st.median_s * per_second,
                  st.p90_s * per_second, st.p99_s * per_second, st.min_s * per_second)};
}

// The unit of the inference latency chart: that of its slowest median.
TimeUnit latency_unit(const std::vector<Entry>& all) {
  double slowest = 0;
  for (const auto& e : all) {
    if (e.config->statistics && std::isfinite(e.config->statistics->median_s)) {
      slowest = std::max(slowest, e.config->statistics->median_s);
    }
  }
  return time_unit(slowest);
}

// The end of an axis at or above `v` (positive), a round number: 1, 1.2, 1.5, ... or 8 times a
// power of ten.
double round_up(double v) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0}) {
    if (m * magnitude >= v) return m * magnitude;
  }
  return 10 * magnitude;
}

// Each row on its own scale, as percent off its median: configurations differ tenfold in step time,
// and on one shared axis every box would shrink to a line. The median itself is in the row's name.
// Chart.js has no box plot: the box is a floating bar from the first to the third quartile, the
// whiskers a thin floating bar under it, the median a line mark, the outliers circles, and those
// past the axis one triangle at its edge.
json chart_step_times(const std::vector<Entry>& all, bool several) {
  struct Row {
    const Entry* entry;
    double median_s;
    std::vector<double> pct;       // each step's time, percent off the median
    std::vector<std::size_t> out;  // the outliers among them
    std::vector<double> inliers;   // the rest, sorted
  };
  std::vector<Row> rows;
  // Percent either side of the median the axis covers: the boxes and whiskers. An outlier past it
  // (one step 15 times the median) is marked at the edge; scaled to it, the boxes would be lines.
  double reach = 1;
  for (const auto& e : all) {
    const auto& t = e.config->samples.step_seconds;
    if (t.empty()) continue;
    // A file can hold step times no run measures (zero, or spread past a double's range around
    // their median): a median that is not a positive finite number has no scale to draw on, and
    // the row is left out; a percentage that overflows is left out of its box.
    const double m = stats::median(t);
    if (!(m > 0 && std::isfinite(m))) continue;
    Row row{&e, m, {}, {}, {}};
    for (double v : t) {
      const double pct = (v / m - 1) * 100;
      if (std::isfinite(pct)) row.pct.push_back(pct);
    }
    if (row.pct.empty()) continue;
    row.out = stats::outliers(row.pct);
    for (std::size_t k = 0; k < row.pct.size(); ++k) {
      if (!std::binary_search(row.out.begin(), row.out.end(), k)) {
        row.inliers.push_back(row.pct[k]);
      }
    }
    if (row.inliers.empty()) continue;
    std::sort(row.inliers.begin(), row.inliers.end());
    reach = std::max({reach, std::abs(row.inliers.front()), std::abs(row.inliers.back())});
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return nullptr;
  const double edge = round_up(reach * 1.25);
  json spec =
      chart_spec("chart-step-times", "bar", "Step time distribution per configuration", "%");
  json& config = spec["config"];
  json whiskers = json::array(), boxes = json::array(), medians = json::array();
  json outliers = json::array(), past = json::array();
  json box_tips = json::array(), whisker_tips = json::array(), outlier_tips = json::array();
  json past_tips = json::array(), past_rotation = json::array(), colours = json::array();
  json outlier_colours = json::array(), past_colours = json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const std::vector<double>& inliers = row.inliers;
    const double q1 = stats::percentile_sorted(inliers, 0.25);
    const double q3 = stats::percentile_sorted(inliers, 0.75);
    const std::string name = label(*row.entry, several);
    const TimeUnit unit = time_unit(row.median_s);
    const std::string row_label =
        fmt::format("{} · {:.4g} {}", short_label(name), row.median_s * unit.per_second, unit.name);
    config["data"]["labels"].push_back(row_label);
    colours.push_back(chart_colour(i));
    boxes.push_back({number(q1), number(q3)});
    box_tips.push_back(fmt::format(
        "{}: median {:.4g} {}, quartiles {:+.2f}% / {:+.2f}%, {} steps, {} outliers", name,
        row.median_s * unit.per_second, unit.name, q1, q3, row.pct.size(), row.out.size()));
    whiskers.push_back({number(inliers.front()), number(inliers.back())});
    whisker_tips.push_back(fmt::format("{}: range without outliers {:+.2f}% to {:+.2f}%", name,
                                       inliers.front(), inliers.back()));
    medians.push_back({{"x", 0}, {"y", row_label}});
    std::vector<double> past_low;
    std::vector<double> past_high;
    for (std::size_t k : row.out) {
      const double v = row.pct[k];
      if (v < -edge) {
        past_low.push_back(v);
      } else if (v > edge) {
        past_high.push_back(v);
      } else {
        outliers.push_back({{"x", v}, {"y", row_label}});
        outlier_tips.push_back(fmt::format("{}: outlier {:+.1f}%", name, v));
        outlier_colours.push_back(chart_colour(i));
      }
    }
    for (const auto& [values, at, rotation] :
         {std::tuple{&past_low, -edge, -90}, std::tuple{&past_high, edge, 90}}) {
      if (values->empty()) continue;
      const auto [lo, hi] = std::minmax_element(values->begin(), values->end());
      past.push_back({{"x", at}, {"y", row_label}});
      past_tips.push_back(fmt::format("{}: {} outlier{} past the axis, {:+.0f}% to {:+.0f}%", name,
                                      values->size(), values->size() == 1 ? "" : "s", *lo, *hi));
      past_rotation.push_back(rotation);
      past_colours.push_back(chart_colour(i));
    }
  }
  json& datasets = config["data"]["datasets"];
  datasets.push_back({{"label", "quartiles"},
                      {"data", std::move(boxes)},
                      {"tips", std::move(box_tips)},
                      {"backgroundColor", colours},
                      {"borderColor", colours},
                      {"borderWidth", 1},
                      {"grouped", false},
                      {"barPercentage", 0.7},
                      {"order", 2}});
  datasets.push_back({{"label", "range without outliers"},
                      {"data", std::move(whiskers)},
                      {"tips", std::move(whisker_tips)},
                      {"backgroundColor", colours},
                      {"grouped", false},
                      {"barPercentage", 0.08},
                      {"order", 3}});
  datasets.push_back({{"type", "scatter"},
                      {"label", "median"},
                      {"data", std::move(medians)},
                      {"pointStyle", "line"},
                      {"rotation", 90},
                      {"radius", 9},
                      {"borderWidth", 2},
                      {"borderColor", "#222"},
                      {"order", 1}});
  datasets.push_back({{"type", "scatter"},
                      {"label", "outliers"},
                      {"data", std::move(outliers)},
                      {"tips", std::move(outlier_tips)},
                      {"borderColor", std::move(outlier_colours)},
                      {"backgroundColor", "rgba(0,0,0,0)"},
                      {"radius", 3},
                      {"order", 0}});
  datasets.push_back({{"type", "scatter"},
                      {"label", "outliers past the axis"},
                      {"data", std::move(past)},
                      {"tips", std::move(past_tips)},
                      {"pointStyle", "triangle"},
                      {"rotation", std::move(past_rotation)},
                      {"backgroundColor", past_colours},
                      {"borderColor", std::move(past_colours)},
                      {"radius", 6},
                      {"order", 0}});
  json& options = config["options"];
  options["indexAxis"] = "y";
  options["plugins"]["legend"] = {{"display", false}};
  options["scales"]["x"] = {
      {"type", "linear"},
      {"min", -edge},
      {"max", edge},
      {"title", axis_title("step time, % off its median (box: quartiles, whiskers: range without "
                           "outliers, circles: outliers, triangles: past the axis)")}};
  options["scales"]["y"] = {{"type", "category"}};
  return spec;
}

// Each configuration's warm-up curve (its first run's), step time against step: how long the first
// steps took and where the warm-up stopped. The y axis is capped at four times the largest median
// of the curves' second halves, so that a first step of seconds does not flatten the rest (its
// point sits on the top edge, its tooltip has the time).
json chart_warmup(const std::vector<Entry>& all, bool several) {
  std::vector<std::pair<std::string, const std::vector<double>*>> curves;
  double settled = 0;
  for (const auto& e : all) {
    const auto& warmups = e.config->samples.warmup;
    if (warmups.empty() || warmups.front().step_seconds.size() < 2) continue;
    const std::vector<double>& t = warmups.front().step_seconds;
    curves.emplace_back(label(e, several), &t);
    settled = std::max(settled, stats::median(std::span(t).last(t.size() / 2)));
  }
  if (curves.empty()) return nullptr;
  const TimeUnit unit = time_unit(settled);
  const double cap = settled * 4 * unit.per_second;
  json spec =
      chart_spec("chart-warmup", "line", "Warm-up: step time per step until steady", unit.name);
  json& config = spec["config"];
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const auto& [name, t] = curves[i];
    json data = json::array();
    json tips = json::array();
    for (std::size_t k = 0; k < t->size(); ++k) {
      const double v = (*t)[k] * unit.per_second;
      data.push_back({{"x", k + 1}, {"y", number(cap > 0 ? std::min(v, cap) : v)}});
      tips.push_back(fmt::format("{}: step {} of {}, {:.4g} {} (first {:.4g} s, last {:.4g} s)",
                                 name, k + 1, t->size(), v, unit.name, t->front(), t->back()));
    }
    config["data"]["datasets"].push_back({{"label", name},
                                          {"data", std::move(data)},
                                          {"tips", std::move(tips)},
                                          {"borderColor", chart_colour(i)},
                                          {"backgroundColor", chart_colour(i)},
                                          {"pointRadius", 2}});
  }
  config["options"]["scales"]["x"] = {{"type", "linear"}, {"title", axis_title("warm-up step")}};
  config["options"]["scales"]["y"] = {{"beginAtZero", true},
                                      {"title", axis_title(fmt::format("{} per step", unit.name))}};
  if (cap > 0 && std::isfinite(cap)) config["options"]["scales"]["y"]["max"] = cap;
  return spec;
}

json chart_memory(const std::vector<Entry>& all, bool several) {
  struct Row {
    const Entry* entry;
    std::vector<std::pair<std::string, std::int64_t>> parts;
  };
  std::vector<Row> rows;
  std::vector<std::string> categories;
  double top = 0;
  for (const auto& e : all) {
    if (!e.config->memory) continue;
    const auto& m = *e.config->memory;
    auto parts = results::peak_by_category(m);
    if (parts.empty()) {
      const auto peak = results::peak_memory_bytes(m);
      if (!peak) continue;
      const char* what = m.framework_peak_allocated_bytes ? "peak (framework)" : "peak (NVML)";
      parts.emplace_back(what, *peak);
    }
    double sum = 0;
    for (const auto& [name, bytes] : parts) {
      if (std::find(categories.begin(), categories.end(), name) == categories.end()) {
        categories.push_back(name);
      }
      sum += static_cast<double>(bytes);
    }
    top = std::max(top, sum);
    rows.push_back({&e, std::move(parts)});
  }
  if (rows.empty()) return nullptr;
  // Grouped by series, rising batch inside each, so a row reads as memory growing with the batch.
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    const auto sa = series_name(*a.entry, several);
    const auto sb = series_name(*b.entry, several);
    if (sa != sb) return sa < sb;
    return results::batch_of(a.entry->config->kind, a.entry->config->settings).value_or(0) <
           results::batch_of(b.entry->config->kind, b.entry->config->settings).value_or(0);
  });
  const bool gib = top >= kGiB;
  const double per = gib ? kGiB : kMiB;
  const char* unit = gib ? "GiB" : "MiB";
  json spec = chart_spec("chart-memory", "bar", "Peak device memory by category", unit);
  json& config = spec["config"];
  for (const Row& row : rows)
    config["data"]["labels"].push_back(short_label(label(*row.entry, several)));
  for (std::size_t k = 0; k < categories.size(); ++k) {
    json data = json::array();
    json tips = json::array();
    for (const Row& row : rows) {
      const auto it = std::find_if(row.parts.begin(), row.parts.end(),
                                   [&](const auto& p) { return p.first == categories[k]; });
      if (it == row.parts.end()) {
        data.push_back(nullptr);
        tips.push_back(nullptr);
        continue;
      }
      data.push_back(number(static_cast<double>(it->second) / per));
      tips.push_back(fmt::format(
          "{}: {} {}", label(*row.entry, several), categories[k],
          format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(it->second, 0)))));
    }
    config["data"]["datasets"].push_back({{"label", categories[k]},
                                          {"data", std::move(data)},
                                          {"tips", std::move(tips)},
                                          {"backgroundColor", chart_colour(k)}});
  }
  config["options"]["indexAxis"] = "y";
  config["options"]["scales"]["x"] = {{"type", "linear"},
                                      {"stacked", true},
                                      {"title", axis_title(fmt::format("{} at the peak", unit))}};
  config["options"]["scales"]["y"] = {{"type", "category"}, {"stacked", true}};
  return spec;
}

using SampleField = std::optional<double> results::TelemetrySample::*;

// Every configuration's timed window on one time axis, end to end in file and configuration order:
// a sweep reads as one run, where twenty overlaid lines would hide each other. A shaded band spans
// each configuration (its number on top, its name in the tooltip); colours tell GPUs apart.
json chart_timeline(const std::vector<Entry>& all, bool several, std::string_view id,
                    std::string_view title, std::string_view unit, SampleField field) {
  json spec = chart_spec(id, "line", title, unit);
  json& config = spec["config"];
  json& datasets = config["data"]["datasets"];
  json bands = json::array();
  std::vector<int> gpus;
  double at = 0;
  for (const auto& e : all) {
    const std::string name = label(e, several);
    const double t0 = at;
    double length = 0;
    bool any = false;
    for (const auto& t : e.config->telemetry) {
      json data = json::array();
      for (const auto& sample : t.timeline) {
        if (const auto v = sample.*field) {
          data.push_back({{"x", number(at + sample.t_s)}, {"y", number(*v)}});
          length = std::max(length, sample.t_s);
        }
      }
      length = std::max(length, t.window_s);
      if (data.empty()) continue;
      any = true;
      auto k = static_cast<std::size_t>(std::find(gpus.begin(), gpus.end(), t.gpu) - gpus.begin());
      const bool first = k == gpus.size();
      if (first) gpus.push_back(t.gpu);
      datasets.push_back({{"label", fmt::format("GPU {}", t.gpu)},
                          {"title", fmt::format("{}: {}", bands.size() + 1, name)},
                          {"group", t.gpu},
                          {"legend", first},
                          {"data", std::move(data)},
                          {"borderColor", chart_colour(k)},
                          {"backgroundColor", chart_colour(k)},
                          {"borderWidth", 1.5},
                          {"pointRadius", 0}});
    }
    if (!any) continue;
    at = t0 + length;
    bands.push_back({{"from", number(t0)},
                     {"to", number(at)},
                     {"label", std::to_string(bands.size() + 1)},
                     {"fill", bands.size() % 2 == 0 ? "#eef3f8" : "#f9fbfd"}});
  }
  if (bands.empty()) return nullptr;
  spec["bands"] = std::move(bands);
  config["options"]["interaction"] = {{"mode", "nearest"}, {"intersect", false}};
  config["options"]["scales"]["x"] = {
      {"type", "linear"},
      {"title", axis_title("seconds of timed windows, configurations end to end (numbered bands; "
                           "hover a line for the name)")}};
  config["options"]["scales"]["y"] = {{"beginAtZero", true}, {"title", axis_title(unit)}};
  return spec;
}

// Appends `spec`'s canvas to `html` and `spec` to `charts`, where there is a chart.
void place(std::string& html, json& charts, json spec, int height) {
  if (spec.is_null()) return;
  html += chart_canvas(spec["id"].get<std::string>(),
                       spec["config"]["options"]["plugins"]["title"]["text"].get<std::string>(),
                       height);
  charts.push_back(std::move(spec));
}

// A chart of one row per configuration: tall enough for each row's label.
int rows_height(const json& spec) {
  if (spec.is_null()) return 0;
  return 170 + 28 * static_cast<int>(spec["config"]["data"]["labels"].size());
}

std::string key_value_rows(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string s = "<table class=\"kv\">\n";
  for (const auto& [k, v] : rows) {
    s += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", esc(k), esc(v));
  }
  return s + "</table>\n";
}

template <class T>
std::string or_unknown(const std::optional<T>& v) {
  if (!v) return "unknown";
  if constexpr (std::is_same_v<T, std::string>) {
    return *v;
  } else {
    return fmt::format("{}", *v);
  }
}

std::string environment(const NamedDocument& d) {
  const auto& c = d.document.context;
  std::string command;
  for (const auto& arg : c.command_line) command += (command.empty() ? "" : " ") + arg;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"date (UTC)", c.date},
      {"dlprobe", fmt::format("{} ({})", c.dlprobe_version, c.git_hash)},
      {"command line", command},
      {"host", c.hostname},
      {"OS", c.os},
      {"CPU", c.cpu + (c.cpu_threads ? fmt::format(" ({} threads)", *c.cpu_threads) : "")},
      {"host memory",
       c.host_memory_bytes ? format_size(*c.host_memory_bytes) : std::string("unknown")},
      {"driver", or_unknown(c.driver_version)},
      {"CUDA (driver supports)", or_unknown(c.cuda_driver_version)},
      {"CUDA runtime", or_unknown(c.cuda_runtime_version)},
  };
  for (const auto& l : c.libraries) {
    rows.emplace_back(
        l.name, l.version.empty()
                    ? "not found"
                    : (l.path.empty() ? l.version : fmt::format("{} ({})", l.version, l.path)));
  }
  for (const auto& g : c.gpus) {
    rows.emplace_back(
        fmt::format("GPU {}", g.index),
        fmt::format("{} (cc {}, {} SMs, {}, {}, {})", g.name, or_unknown(g.compute_capability),
                    or_unknown(g.sm_count),
                    g.memory_total_bytes ? format_size(*g.memory_total_bytes) : "memory unknown",
                    g.pci_bus_id, g.uuid));
  }
  for (const auto& st : c.device_state) {
    std::string reasons;
    for (const auto& r : st.clock_event_reasons) reasons += (reasons.empty() ? "" : ", ") + r;
    std::string others;
    for (const auto& p : st.other_processes) {
      others += fmt::format("{}pid {}{}", others.empty() ? "" : ", ", p.pid,
                            p.used_bytes ? " (" + format_size(*p.used_bytes) + ")" : "");
    }
    rows.emplace_back(
        fmt::format("GPU {} at start", st.gpu),
        fmt::format("SM clock {} MHz, memory clock {} MHz, {} °C, {} W of {} W limit; throttle: "
                    "{}; other processes: {}",
                    or_unknown(st.sm_clock_mhz), or_unknown(st.mem_clock_mhz),
                    or_unknown(st.temperature_c), or_unknown(st.power_w),
                    or_unknown(st.power_limit_w), reasons.empty() ? "none" : reasons,
                    others.empty() ? "none" : others));
  }
  return fmt::format("<h3>{}</h3>\n{}", esc(d.name), key_value_rows(rows));
}

struct Note {
  std::string severity;
  std::string where;
  std::string id;
  std::string message;
  std::string evidence;
  std::string fix;
};

// What the numbers themselves warn about, next to the findings the measuring command recorded.
std::vector<Note> notes(const std::vector<Entry>& all, std::span<const NamedDocument> documents,
                        bool several) {
  std::vector<Note> out;
  for (const auto& d : documents) {
    for (const auto& f : d.document.findings) {
      out.push_back(
          {std::string(severity_name(f.severity)), d.name, f.id, f.message, f.evidence, f.fix});
    }
  }
  for (const auto& e : all) {
    const auto& c = *e.config;
    const std::string where = label(e, several);
    if (c.status != results::RunStatus::ok) {
      out.push_back({"error", where, std::string(results::run_status_name(c.status)),
                     c.error.empty() ? "did not finish" : c.error, "", ""});
    }
    // The measuring command may have recorded the same warning (bench does, with its evidence);
    // it is not repeated here.
    const auto recorded = [&](std::string_view id) {
      return std::any_of(c.findings.begin(), c.findings.end(),
                         [&](const results::Finding& f) { return f.id == id; });
    };
    if (c.statistics) {
      const auto& s = *c.statistics;
      if (s.cv > 0.05 && !recorded("noisy_steps")) {
        out.push_back(
            {"warning", where, "noisy_steps",
             "step times vary by more than 5%; the throughput is less certain",
             fmt::format("CV {:.1f}%, {} outliers in {} steps", s.cv * 100, s.outliers, s.steps),
             c.settings.device == "cpu"
                 ? "close other work on the machine, use more steps, keep the threads on their "
                   "cores (OMP_PROC_BIND=close)"
                 : "close other GPU work, use more steps, check the telemetry for throttling"});
      }
      if (s.steps < 10 && !recorded("few_steps")) {
        out.push_back({"warning", where, "few_steps", "fewer than 10 timed steps",
                       fmt::format("{} steps", s.steps), "time more steps"});
      }
    }
    for (const auto& t : c.telemetry) {
      if (t.throttle_reasons.empty() || recorded("clock_events")) continue;
      std::string reasons;
      for (const auto& r : t.throttle_reasons) reasons += (reasons.empty() ? "" : ", ") + r;
      out.push_back({"warning", where, "clock_events",
                     fmt::format("GPU {} lowered its clocks during the timed window", t.gpu),
                     reasons, ""});
    }
    for (const auto& f : c.findings) {
      out.push_back(
          {std::string(severity_name(f.severity)), where, f.id, f.message, f.evidence, f.fix});
    }
  }
  return out;
}

std::string notes_html(const std::vector<Note>& list) {
  if (list.empty()) return "<p class=\"none\">None.</p>\n";
  std::string s =
      "<div class=\"wide\"><table "
      "id=\"findings\"><thead><tr><th>severity</th><th>where</th><th>id</th>"
      "<th>message</th><th>evidence</th><th>fix</th></tr></thead><tbody>\n";
  for (const auto& n : list) {
    s += fmt::format(
        "<tr class=\"sev-{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "</tr>\n",
        esc(n.severity), esc(n.severity), esc(n.where), esc(n.id), esc(n.message), esc(n.evidence),
        esc(n.fix));
  }
  return s + "</tbody></table></div>\n";
}

// Where each profiled configuration's step goes (bench --profile): its time by call kind, then
// its slowest calls.
std::string profile_section(const std::vector<Entry>& all, bool several) {
  constexpr std::size_t kSlowest = 10;
  std::string s;
  for (const Entry& e : all) {
    if (!e.config->profile || e.config->profile->empty()) continue;
    const std::vector<results::CallTime>& calls = *e.config->profile;
    const std::vector<results::KindTime> kinds = results::time_by_kind(calls);
    double total = 0;
    for (const results::KindTime& k : kinds) total += k.ms;
    s += fmt::format(
        "<h3>{}</h3>\n<p class=\"sub\">{:.3f} ms a step: each call's median over the profiled "
        "steps, summed</p>\n<div class=\"wide\"><table class=\"sortable\"><thead><tr>"
        "<th>kind</th><th>ms</th><th>share</th><th>calls</th></tr></thead><tbody>\n",
        esc(label(e, several)), total);
    for (const results::KindTime& k : kinds) {
      const double share = total > 0 ? 100.0 * k.ms / total : 0.0;
      s += fmt::format(
          "<tr><td>{}</td><td class=\"n\" data-sort=\"{}\">{:.3f}</td><td class=\"n\" "
          "data-sort=\"{}\">{:.1f} %</td><td class=\"n\" data-sort=\"{}\">{}</td></tr>\n",
          esc(k.kind), k.ms, k.ms, share, share, k.calls, k.calls);
    }
    s += "</tbody></table></div>\n";
    const std::vector<const results::CallTime*> slowest = results::slowest_calls(calls, kSlowest);
    s += fmt::format("<p class=\"sub\">Its {} slowest calls:</p>\n<table class=\"kv\">\n",
                     slowest.size());
    for (const results::CallTime* c : slowest) {
      s += fmt::format("<tr><th>{:.3f} ms</th><td>{} ({})</td></tr>\n", c->ms, esc(c->name),
                       esc(c->kind));
    }
    s += "</table>\n";
  }
  return s;
}

std::string table_html(const results::Table& t) {
  // In a box of the page's width that scrolls, should a table of many columns still be wider.
  std::string s = "<div class=\"wide\"><table id=\"configurations\" class=\"sortable\"><thead><tr>";
  for (const auto& c : t.columns) s += fmt::format("<th>{}</th>", esc(c));
  s += "</tr></thead><tbody>\n";
  for (const auto& r : t.rows) {
    s += "<tr>";
    for (const auto& cell : r) {
      if (cell.number) {
        s += fmt::format("<td class=\"n\" data-sort=\"{}\">{}</td>", *cell.number, esc(cell.text));
      } else {
        s += fmt::format("<td>{}</td>", esc(cell.text));
      }
    }
    s += "</tr>\n";
  }
  return s + "</tbody></table></div>\n";
}

// Sorts the configuration table by the clicked column: numbers by their data-sort value, the rest
// as text; a second click reverses.
constexpr std::string_view kScript = R"(
document.querySelectorAll('table.sortable').forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, column) {
    th.addEventListener('click', function () {
      var ascending = th.getAttribute('data-order') !== 'asc';
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('data-order'); });
      th.setAttribute('data-order', ascending ? 'asc' : 'desc');
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[column], y = b.cells[column];
        var nx = x.getAttribute('data-sort'), ny = y.getAttribute('data-sort');
        var order;
        if (nx !== null && ny !== null) order = parseFloat(nx) - parseFloat(ny);
        else if (nx !== null) order = -1;
        else if (ny !== null) order = 1;
        else order = x.textContent.localeCompare(y.textContent);
        return ascending ? order : -order;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
)";

}  // namespace

std::string render_html(std::span<const NamedDocument> documents) {
  const bool several = documents.size() > 1;
  const std::vector<Entry> all = entries(documents);
  std::string files;
  for (const auto& d : documents) files += (files.empty() ? "" : ", ") + d.name;

  json charts = json::array();
  std::string body;
  body += fmt::format("<h1>dlprobe report</h1>\n<p class=\"sub\">{} configuration{} from {}</p>\n",
                      all.size(), all.size() == 1 ? "" : "s", esc(files));
  body += "<h2>Throughput</h2>\n";
  json throughput = chart_vs_batch(all, several, "chart-throughput", "Throughput vs batch size",
                                   "items / s", throughput_point);
  if (throughput.is_null()) {
    body += "<p class=\"none\">No configuration has both a batch and a measured throughput.</p>\n";
  }
  place(body, charts, std::move(throughput), 360);
  if (const std::string machines = fleet_section(documents, charts); !machines.empty()) {
    body += "<h2>Machines</h2>\n" + machines;
  }
  const TimeUnit latency = latency_unit(all);
  if (json chart = chart_vs_batch(
          all, several, "chart-latency",
          fmt::format("Inference latency vs batch size, {} per batch (median; bars from the "
                      "fastest step to p99)",
                      latency.name),
          latency.name, latency_point, latency.per_second);
      !chart.is_null()) {
    body += "<h2>Inference latency</h2>\n";
    place(body, charts, std::move(chart), 360);
  }
  body += "<h2>Step times</h2>\n";
  json steps = chart_step_times(all, several);
  if (steps.is_null()) body += "<p class=\"none\">No configuration has timed steps.</p>\n";
  const int steps_height = rows_height(steps);
  place(body, charts, std::move(steps), steps_height);
  if (json warmup = chart_warmup(all, several); !warmup.is_null()) {
    body += "<h2>Warm-up</h2>\n";
    place(body, charts, std::move(warmup), 300);
  }
  if (const std::string profiles = profile_section(all, several); !profiles.empty()) {
    body += "<h2>Where the step's time goes</h2>\n" + profiles;
  }
  std::string memory;
  json peak = chart_memory(all, several);
  const int peak_height = rows_height(peak);
  place(memory, charts, std::move(peak), peak_height);
  std::vector<MemoryTimelineInput> timelines;
  for (const auto& e : all) timelines.push_back({label(e, several), e.config});
  memory += memory_timeline_section(timelines, charts);
  if (!memory.empty()) body += "<h2>Memory</h2>\n" + memory;
  std::string telemetry;
  for (auto [id, title, unit, field] :
       {std::tuple{"chart-gpu-util", "GPU utilisation", "%",
                   &results::TelemetrySample::gpu_util_pct},
        std::tuple{"chart-power", "Power draw", "W", &results::TelemetrySample::power_w},
        std::tuple{"chart-sm-clock", "SM clock", "MHz", &results::TelemetrySample::sm_clock_mhz}}) {
    place(telemetry, charts, chart_timeline(all, several, id, title, unit, field), 300);
  }
  if (!telemetry.empty()) body += "<h2>GPU telemetry</h2>\n" + telemetry;
  body += "<h2>Warnings and findings</h2>\n" + notes_html(notes(all, documents, several));
  body += "<h2>Configurations</h2>\n<p class=\"sub\">Click a column heading to sort.</p>\n" +
          table_html(results::without_empty_columns(results::configuration_table(documents)));
  body += "<h2>Environment</h2>\n";
  for (const auto& d : documents) body += environment(d);

  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      // The page may load nothing from anywhere: only its own inline style and scripts run.
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>dlprobe report: {}</title>\n<style>{}</style>\n</head>\n<body>\n{}<script>{}"
      "</script>\n{}</body>\n</html>\n",
      esc(files), page_style(), body, kScript, chart_scripts(charts));
}

}  // namespace dlprobe::report
