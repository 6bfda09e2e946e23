// The HTML report. Charts are SVG written here rather than drawn by a JavaScript chart library:
// the page must work offline and fetch nothing, and the few chart types needed (lines with error
// bars, box plots, stacked bars) are short to draw directly.
#include "dlprobe/report/html.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <span>
#include <tuple>

#include "dlprobe/core/units.h"
#include "dlprobe/stats/statistics.h"
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

// Colour-blind-safe qualitative palette (Okabe & Ito), then darker variants.
constexpr const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7",
                                    "#56B4E9", "#F0E442", "#000000", "#7f3c8d", "#11a579"};
constexpr std::size_t kPaletteSize = std::size(kPalette);
const char* colour(std::size_t i) {
  return kPalette[i % kPaletteSize];
}

std::string esc(std::string_view s) {
  return html_escape(s);
}

// Tick values at 1, 2 or 5 × 10^k covering [lo, hi] with about `target` intervals.
struct Axis {
  double lo = 0;
  double hi = 1;
  std::vector<double> ticks;
};

Axis nice_axis(double lo, double hi, int target = 5) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  Axis a;
  a.lo = std::floor(lo / step) * step;
  a.hi = std::ceil(hi / step) * step;
  for (double t = a.lo; t <= a.hi + step * 1e-9; t += step) a.ticks.push_back(t);
  return a;
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  return fmt::format("{:g}", v);
}

// The plotting area of one chart and its mapping from data to pixels.
struct Frame {
  double width = 1000;
  double height = 340;
  double left = 70;
  double right = 330;  // room for the legend
  double top = 30;
  double bottom = 50;
  double x0() const { return left; }
  double x1() const { return width - right; }
  double y0() const { return height - bottom; }
  double y1() const { return top; }
};

double map(double v, double lo, double hi, double p0, double p1) {
  return hi == lo ? (p0 + p1) / 2 : p0 + (v - lo) / (hi - lo) * (p1 - p0);
}

std::string svg_open(std::string_view id, const Frame& f, std::string_view title) {
  return fmt::format(
      "<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
      "height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n<title>{}</title>\n",
      esc(id), svg_number(f.width), svg_number(f.height), svg_number(f.width), svg_number(f.height),
      esc(title), esc(title));
}

// One tick of an axis: its grid line from (x1, y1) to (x2, y2) and its label at (x, y).
std::string tick(double x1, double y1, double x2, double y2, double x, double y,
                 std::string_view anchor, double value) {
  return fmt::format(
      "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>"
      "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"{}\">{}</text>\n",
      svg_number(x1), svg_number(y1), svg_number(x2), svg_number(y2), svg_number(x), svg_number(y),
      anchor, esc(tick_label(value)));
}

std::string y_axis(const Frame& f, const Axis& a, std::string_view label) {
  std::string s;
  for (double t : a.ticks) {
    const double y = map(t, a.lo, a.hi, f.y0(), f.y1());
    s += tick(f.x0(), y, f.x1(), y, f.x0() - 6, y + 4, "end", t);
  }
  s += fmt::format(
      "<text class=\"axis-label\" transform=\"translate(16 {}) rotate(-90)\" "
      "text-anchor=\"middle\">{}</text>\n",
      svg_number((f.y0() + f.y1()) / 2), esc(label));
  return s;
}

std::string x_axis(const Frame& f, const Axis& a, std::string_view label) {
  std::string s;
  for (double t : a.ticks) {
    const double x = map(t, a.lo, a.hi, f.x0(), f.x1());
    s += tick(x, f.y1(), x, f.y0(), x, f.y0() + 16, "middle", t);
  }
  s +=
      fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                  svg_number((f.x0() + f.x1()) / 2), svg_number(f.height - 10), esc(label));
  return s;
}

std::string legend(const Frame& f, const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const double y = f.y1() + 4 + 18 * static_cast<double>(i);
    std::string shown = names[i];
    if (shown.size() > 50) shown = shown.substr(0, 49) + "…";
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text class=\"legend\" x=\"{}\" y=\"{}\"><title>{}</title>{}</text>\n",
        svg_number(f.x1() + 14), svg_number(y), colour(i), svg_number(f.x1() + 32),
        svg_number(y + 10), esc(names[i]), esc(shown));
  }
  return s;
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

// Everything but the batch: the line a configuration belongs to in throughput vs batch.
std::string series_name(const Entry& e, bool several_files) {
  const std::string name = results::series_label(e.config->kind, e.config->settings);
  return several_files ? fmt::format("{}: {}", e.file->name, name) : name;
}

// One point of a per-batch curve: the value, its bar, and the words of its tooltip.
struct BatchPoint {
  double y = 0;
  double low = 0;
  double high = 0;
  std::string tip;
};
using PointOf = std::optional<BatchPoint> (*)(const Configuration&);

// A line per series over the batch sizes, a point with an error bar per configuration.
std::string chart_vs_batch(const std::vector<Entry>& all, bool several, std::string_view id,
                           std::string_view title, std::string_view unit, PointOf point_of) {
  std::map<std::string, std::vector<std::pair<std::int64_t, BatchPoint>>> series;
  std::vector<std::string> order;
  std::set<std::int64_t> batches;
  double top = 0;
  for (const auto& e : all) {
    const auto batch = results::batch_of(e.config->kind, e.config->settings);
    const auto point = point_of(*e.config);
    if (!batch || !point) continue;
    const std::string name = series_name(e, several);
    if (!series.count(name)) order.push_back(name);
    series[name].emplace_back(*batch, BatchPoint{point->y, point->low, point->high,
                                                 label(e, several) + ": " + point->tip});
    batches.insert(*batch);
    top = std::max(top, point->high);
  }
  if (series.empty()) return "";
  Frame f;
  const Axis y = nice_axis(0, top * 1.05);
  // Batches sit at even spacing: sweeps double the batch, and a linear axis would crowd the small
  // ones into a corner.
  const std::vector<std::int64_t> xs(batches.begin(), batches.end());
  auto x_of = [&](std::int64_t b) {
    const auto i = std::lower_bound(xs.begin(), xs.end(), b) - xs.begin();
    return xs.size() == 1 ? (f.x0() + f.x1()) / 2
                          : map(static_cast<double>(i), -0.5, static_cast<double>(xs.size()) - 0.5,
                                f.x0(), f.x1());
  };
  std::string s = svg_open(id, f, title);
  s += y_axis(f, y, unit);
  for (auto b : xs) {
    s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     svg_number(x_of(b)), svg_number(f.y0() + 16), b);
  }
  s += fmt::format(
      "<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">batch "
      "size</text>\n",
      svg_number((f.x0() + f.x1()) / 2), svg_number(f.height - 10));
  for (std::size_t i = 0; i < order.size(); ++i) {
    auto points = series[order[i]];
    std::stable_sort(points.begin(), points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string path;
    std::string marks;
    for (const auto& [batch, p] : points) {
      const double x = x_of(batch);
      const double yv = map(p.y, y.lo, y.hi, f.y0(), f.y1());
      const double ylo = map(p.low, y.lo, y.hi, f.y0(), f.y1());
      const double yhi = map(p.high, y.lo, y.hi, f.y0(), f.y1());
      path += fmt::format("{}{},{}", path.empty() ? "" : " ", svg_number(x), svg_number(yv));
      marks += fmt::format(
          "<g class=\"point\"><title>{}</title>"
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
          "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\"/></g>\n",
          esc(p.tip), svg_number(x), svg_number(ylo), svg_number(x), svg_number(yhi), colour(i),
          svg_number(x - 5), svg_number(ylo), svg_number(x + 5), svg_number(ylo), colour(i),
          svg_number(x - 5), svg_number(yhi), svg_number(x + 5), svg_number(yhi), colour(i),
          svg_number(x), svg_number(yv), colour(i));
    }
    s += fmt::format("<polyline class=\"series\" points=\"{}\" stroke=\"{}\"/>\n{}", path,
                     colour(i), marks);
  }
  s += legend(f, order);
  return s + "</svg>\n";
}

std::optional<BatchPoint> throughput_point(const Configuration& c) {
  if (!c.statistics) return std::nullopt;
  const auto& st = *c.statistics;
  return BatchPoint{st.throughput, st.throughput_ci.low, st.throughput_ci.high,
                    fmt::format("{:.1f} items/s ({:.0f}% CI {:.1f} – {:.1f})", st.throughput,
                                st.ci_level * 100, st.throughput_ci.low, st.throughput_ci.high)};
}

// Inference only: there a step is one batch's latency, what a server's users wait for.
std::optional<BatchPoint> latency_point(const Configuration& c) {
  if (c.kind != Kind::native || c.settings.mode != "infer" || !c.statistics) return std::nullopt;
  const auto& st = *c.statistics;
  return BatchPoint{st.median_s * 1e3, st.min_s * 1e3, st.p99_s * 1e3,
                    fmt::format("median {:.3f} ms, p90 {:.3f} ms, p99 {:.3f} ms, min {:.3f} ms",
                                st.median_s * 1e3, st.p90_s * 1e3, st.p99_s * 1e3, st.min_s * 1e3)};
}

// Each row on its own scale, as percent off its median: configurations differ tenfold in step time,
// and on one shared axis every box would shrink to a line. The median itself is written beside it.
std::string chart_step_times(const std::vector<Entry>& all, bool several) {
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
    // the row is left out; a percentage that overflows is left out of its box. Drawn, they would
    // be nan or inf in the SVG, which browsers refuse.
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
  if (rows.empty()) return "<p class=\"none\">No configuration has timed steps.</p>\n";
  Frame f;
  f.left = 330;
  f.right = 130;
  const double row_h = 26;
  f.height = f.top + f.bottom + row_h * static_cast<double>(rows.size());
  const Axis x = nice_axis(-reach * 1.25, reach * 1.25, 8);
  std::string s = svg_open("chart-step-times", f, "Step time distribution per configuration");
  s += x_axis(f, x,
              "step time, % off its median (box: quartiles, whiskers: range "
              "without outliers, circles: outliers, triangles: past the axis)");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const std::vector<double>& inliers = row.inliers;
    const double q1 = stats::percentile_sorted(inliers, 0.25);
    const double q3 = stats::percentile_sorted(inliers, 0.75);
    auto px = [&](double v) { return map(v, x.lo, x.hi, f.x0(), f.x1()); };
    const double yc = f.y1() + row_h * (static_cast<double>(i) + 0.5);
    const std::string name = label(*row.entry, several);
    std::string shown = name.size() > 48 ? name.substr(0, 47) + "…" : name;
    s += fmt::format(
        "<g class=\"box\"><title>{}: median {:.3f} ms, quartiles {:+.2f}% / {:+.2f}%, {} steps, {} "
        "outliers</title>"
        "<text class=\"row-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>"
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"16\" fill=\"{}\" fill-opacity=\"0.35\" "
        "stroke=\"{}\"/>"
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>"
        "<text class=\"row-label\" x=\"{}\" y=\"{}\">{:.3f} ms</text>",
        esc(name), row.median_s * 1e3, q1, q3, row.pct.size(), row.out.size(),
        svg_number(f.x0() - 8), svg_number(yc + 4), esc(shown), svg_number(px(inliers.front())),
        svg_number(yc), svg_number(px(inliers.back())), svg_number(yc), colour(i),
        svg_number(px(q1)), svg_number(yc - 8), svg_number(std::max(px(q3) - px(q1), 1.0)),
        colour(i), colour(i), svg_number(px(0)), svg_number(yc - 8), svg_number(px(0)),
        svg_number(yc + 8), colour(i), svg_number(f.x1() + 8), svg_number(yc + 4),
        row.median_s * 1e3);
    // Outliers on the axis as circles; those past either end as one triangle at that edge.
    std::vector<double> past_low;
    std::vector<double> past_high;
    for (std::size_t k : row.out) {
      const double v = row.pct[k];
      if (v < x.lo) {
        past_low.push_back(v);
      } else if (v > x.hi) {
        past_high.push_back(v);
      } else {
        s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.5\" fill=\"none\" stroke=\"{}\"/>",
                         svg_number(px(v)), svg_number(yc), colour(i));
      }
    }
    for (const auto& [past, edge, dir] :
         {std::tuple{&past_low, f.x0(), -1.0}, std::tuple{&past_high, f.x1(), 1.0}}) {
      if (past->empty()) continue;
      const auto [lo, hi] = std::minmax_element(past->begin(), past->end());
      s += fmt::format(
          "<path class=\"clipped\" d=\"M{} {}L{} {}L{} {}Z\" fill=\"{}\"><title>{} outlier{} "
          "past the axis, {:+.0f}% to {:+.0f}%</title></path>",
          svg_number(edge + dir * 6), svg_number(yc), svg_number(edge), svg_number(yc - 5),
          svg_number(edge), svg_number(yc + 5), colour(i), past->size(),
          past->size() == 1 ? "" : "s", *lo, *hi);
    }
    s += "</g>\n";
  }
  return s + "</svg>\n";
}

// Each configuration's warm-up curve (its first run's), step time against step: how long the first
// steps took and where the warm-up stopped. The y axis is capped at four times the largest median
// of the curves' second halves, so that a first step of seconds does not flatten the rest (its
// point sits on the top edge, its tooltip has the time).
std::string chart_warmup(const std::vector<Entry>& all, bool several) {
  std::vector<std::pair<std::string, const std::vector<double>*>> curves;
  double steps = 0;
  double settled = 0;
  for (const auto& e : all) {
    const auto& warmups = e.config->samples.warmup;
    if (warmups.empty() || warmups.front().step_seconds.size() < 2) continue;
    const std::vector<double>& t = warmups.front().step_seconds;
    curves.emplace_back(label(e, several), &t);
    steps = std::max(steps, static_cast<double>(t.size()));
    settled = std::max(settled, stats::median(std::span(t).last(t.size() / 2)) * 1e3);
  }
  if (curves.empty()) return "";
  Frame f;
  f.height = 260;
  const Axis x = nice_axis(1, steps);
  const Axis y = nice_axis(0, settled * 4);
  const auto px = [&](double v) { return map(v, x.lo, x.hi, f.x0(), f.x1()); };
  const auto py = [&](double v) { return map(std::min(v, y.hi), y.lo, y.hi, f.y0(), f.y1()); };
  std::string s = svg_open("chart-warmup", f, "Warm-up: step time per step until steady");
  s += x_axis(f, x, "warm-up step");
  s += y_axis(f, y, "ms per step");
  std::vector<std::string> names;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const auto& [name, t] = curves[i];
    std::string path;
    for (std::size_t k = 0; k < t->size(); ++k) {
      path +=
          fmt::format("{}{},{}", path.empty() ? "" : " ",
                      svg_number(px(static_cast<double>(k + 1))), svg_number(py((*t)[k] * 1e3)));
    }
    s += fmt::format(
        "<polyline class=\"series\" points=\"{}\" stroke=\"{}\"><title>{}: {} steps, first "
        "{:.4g} s, last {:.4g} s</title></polyline>\n",
        path, colour(i), esc(name), t->size(), t->front(), t->back());
    names.push_back(name);
  }
  return s + legend(f, names) + "</svg>\n";
}

std::string chart_memory(const std::vector<Entry>& all, bool several) {
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
  if (rows.empty()) return "";
  // Grouped by series, rising batch inside each, so a row reads as memory growing with the batch.
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    const auto sa = series_name(*a.entry, several);
    const auto sb = series_name(*b.entry, several);
    if (sa != sb) return sa < sb;
    return results::batch_of(a.entry->config->kind, a.entry->config->settings).value_or(0) <
           results::batch_of(b.entry->config->kind, b.entry->config->settings).value_or(0);
  });
  Frame f;
  f.left = 330;
  const double row_h = 26;
  f.height = std::max(f.top + f.bottom + row_h * static_cast<double>(rows.size()),
                      f.top + f.bottom + 18 * static_cast<double>(categories.size()) + 10);
  const Axis x = nice_axis(0, top / kGiB * 1.02);
  std::string s = svg_open("chart-memory", f, "Peak device memory by category");
  s += x_axis(f, x, "GiB at the peak");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double yc = f.y1() + row_h * (static_cast<double>(i) + 0.5);
    const std::string name = label(*rows[i].entry, several);
    const std::string shown = name.size() > 48 ? name.substr(0, 47) + "…" : name;
    s += fmt::format(
        "<text class=\"row-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}<title>{}"
        "</title></text>",
        svg_number(f.x0() - 8), svg_number(yc + 4), esc(shown), esc(name));
    double at = 0;
    for (const auto& [category, bytes] : rows[i].parts) {
      const auto k = static_cast<std::size_t>(
          std::find(categories.begin(), categories.end(), category) - categories.begin());
      const double gib = static_cast<double>(bytes) / kGiB;
      const double x0 = map(at, x.lo, x.hi, f.x0(), f.x1());
      const double x1 = map(at + gib, x.lo, x.hi, f.x0(), f.x1());
      s += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"16\" fill=\"{}\"><title>{}: {} "
          "{}</title></rect>",
          svg_number(x0), svg_number(yc - 8), svg_number(std::max(x1 - x0, 0.0)), colour(k),
          esc(name), esc(category),
          esc(format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(bytes, 0)))));
      at += gib;
    }
    s += "\n";
  }
  s += legend(f, categories);
  return s + "</svg>\n";
}

using SampleField = std::optional<double> results::TelemetrySample::*;

// Every configuration's timed window on one time axis, end to end in file and configuration order:
// a sweep reads as one run, where twenty overlaid lines would hide each other. A shaded band spans
// each configuration (hover it for the name, its number is on top); colours tell GPUs apart.
std::string chart_timeline(const std::vector<Entry>& all, bool several, std::string_view id,
                           std::string_view title, std::string_view unit, SampleField field) {
  struct Span {
    std::string name;
    double t0 = 0;
    double t1 = 0;
    // Per GPU of the configuration: its points, on the shared axis.
    std::vector<std::pair<int, std::vector<std::pair<double, double>>>> lines;
  };
  std::vector<Span> spans;
  std::vector<int> gpus;
  double at = 0;
  double v_max = 0;
  for (const auto& e : all) {
    Span span;
    span.name = label(e, several);
    span.t0 = at;
    double length = 0;
    for (const auto& t : e.config->telemetry) {
      std::vector<std::pair<double, double>> points;
      for (const auto& sample : t.timeline) {
        if (const auto v = sample.*field) {
          points.emplace_back(at + sample.t_s, *v);
          v_max = std::max(v_max, *v);
          length = std::max(length, sample.t_s);
        }
      }
      length = std::max(length, t.window_s);
      if (points.empty()) continue;
      if (std::find(gpus.begin(), gpus.end(), t.gpu) == gpus.end()) gpus.push_back(t.gpu);
      span.lines.emplace_back(t.gpu, std::move(points));
    }
    if (span.lines.empty()) continue;
    span.t1 = at + length;
    at = span.t1;
    spans.push_back(std::move(span));
  }
  if (spans.empty()) return "";
  Frame f;
  f.height = 260;
  const Axis x = nice_axis(0, at);
  const Axis y = nice_axis(0, v_max * 1.05);
  const auto px = [&](double t) { return map(t, x.lo, x.hi, f.x0(), f.x1()); };
  const auto py = [&](double v) { return map(v, y.lo, y.hi, f.y0(), f.y1()); };
  std::string s = svg_open(id, f, title);
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const Span& span = spans[i];
    s += fmt::format(
        "<g class=\"span\"><title>{}: {}</title><rect x=\"{}\" y=\"{}\" width=\"{}\" "
        "height=\"{}\" fill=\"{}\"/>",
        i + 1, esc(span.name), svg_number(px(span.t0)), svg_number(f.y1()),
        svg_number(std::max(px(span.t1) - px(span.t0), 0.5)), svg_number(f.y0() - f.y1()),
        i % 2 == 0 ? "#eef3f8" : "#f9fbfd");
    // Numbers only where they fit above their band.
    if (px(span.t1) - px(span.t0) >= 14) {
      s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                       svg_number((px(span.t0) + px(span.t1)) / 2), svg_number(f.y1() - 4), i + 1);
    }
    s += "</g>\n";
  }
  s += x_axis(f, x,
              "seconds of timed windows, configurations end to end (hover a band for its name)");
  s += y_axis(f, y, unit);
  for (const Span& span : spans) {
    for (const auto& [gpu, points] : span.lines) {
      const auto k =
          static_cast<std::size_t>(std::find(gpus.begin(), gpus.end(), gpu) - gpus.begin());
      std::string path;
      for (const auto& [t, v] : points) {
        path +=
            fmt::format("{}{},{}", path.empty() ? "" : " ", svg_number(px(t)), svg_number(py(v)));
      }
      s += fmt::format(
          "<polyline class=\"series\" points=\"{}\" stroke=\"{}\"><title>{} (GPU {})</title>"
          "</polyline>\n",
          path, colour(k), esc(span.name), gpu);
    }
  }
  std::vector<std::string> names;
  for (int gpu : gpus) names.push_back(fmt::format("GPU {}", gpu));
  s += legend(f, names);
  return s + "</svg>\n";
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

constexpr std::string_view kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; }
.sub { color: #666; margin-top: 0; }
svg.chart { display: block; margin: 8px 0 16px; background: #fff; }
svg .grid { stroke: #e6e6e6; }
svg .tick, svg .legend, svg .row-label { font-size: 11px; fill: #444; }
svg .axis-label { font-size: 12px; fill: #222; }
svg .series { fill: none; stroke-width: 2; }
table { border-collapse: collapse; margin: 8px 0; max-width: 100%; }
.wide { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; background: #f4f4f4; user-select: none; }
table.sortable th[data-order="asc"]::after { content: " \25B2"; }
table.sortable th[data-order="desc"]::after { content: " \25BC"; }
table.kv th { background: #f8f8f8; width: 220px; }
tr.sev-error td:first-child { color: #b00020; font-weight: bold; }
tr.sev-warning td:first-child { color: #a65e00; font-weight: bold; }
.none { color: #777; }
)";

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

  std::string body;
  body += fmt::format("<h1>dlprobe report</h1>\n<p class=\"sub\">{} configuration{} from {}</p>\n",
                      all.size(), all.size() == 1 ? "" : "s", esc(files));
  const std::string throughput = chart_vs_batch(
      all, several, "chart-throughput", "Throughput vs batch size", "items / s", throughput_point);
  body += "<h2>Throughput</h2>\n" +
          (throughput.empty() ? "<p class=\"none\">No configuration has both a batch and a "
                                "measured throughput.</p>\n"
                              : throughput);
  if (const std::string latency = chart_vs_batch(
          all, several, "chart-latency",
          "Inference latency vs batch size (median; bars from the fastest step to p99)",
          "ms per batch", latency_point);
      !latency.empty()) {
    body += "<h2>Inference latency</h2>\n" + latency;
  }
  body += "<h2>Step times</h2>\n" + chart_step_times(all, several);
  if (const std::string warmup = chart_warmup(all, several); !warmup.empty()) {
    body += "<h2>Warm-up</h2>\n" + warmup;
  }
  std::vector<MemoryTimelineInput> timelines;
  for (const auto& e : all) timelines.push_back({label(e, several), e.config});
  const std::string memory = chart_memory(all, several) + memory_timeline_section(timelines);
  if (!memory.empty()) body += "<h2>Memory</h2>\n" + memory;
  std::string telemetry =
      chart_timeline(all, several, "chart-gpu-util", "GPU utilisation", "utilisation (%)",
                     &results::TelemetrySample::gpu_util_pct) +
      chart_timeline(all, several, "chart-power", "Power draw", "W",
                     &results::TelemetrySample::power_w) +
      chart_timeline(all, several, "chart-sm-clock", "SM clock", "MHz",
                     &results::TelemetrySample::sm_clock_mhz);
  if (!telemetry.empty()) body += "<h2>GPU telemetry</h2>\n" + telemetry;
  body += "<h2>Warnings and findings</h2>\n" + notes_html(notes(all, documents, several));
  body += "<h2>Configurations</h2>\n<p class=\"sub\">Click a column heading to sort.</p>\n" +
          table_html(results::without_empty_columns(results::configuration_table(documents)));
  body += "<h2>Environment</h2>\n";
  for (const auto& d : documents) body += environment(d);

  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      // The page may load nothing from anywhere: only its own inline style and script run.
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>dlprobe report: {}</title>\n<style>{}</style>\n</head>\n<body>\n{}<script>{}"
      "</script>\n</body>\n</html>\n",
      esc(files), kStyle, body, kScript);
}

}  // namespace dlprobe::report
