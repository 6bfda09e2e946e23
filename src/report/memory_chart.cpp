// The memory timeline: one step of a `dlprobe memory` configuration, one point per layer visit
// (consecutive calls of a layer in one phase, at their highest moment), stacked by category, the
// phases shaded and the peak marked. Drawn as step-shaped SVG areas, like the other charts here
// written directly (the report fetches nothing).
#include "memory_chart.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>

#include "dlprobe/core/units.h"
#include "dlprobe/report/html.h"

namespace dlprobe::report {
namespace {

using nlohmann::json;

// Long-lived categories at the bottom, so the step's rise and fall sits on top of them.
constexpr std::array<std::string_view, 8> kStackOrder = {
    "weights",   "gradients",   "optimizer_state", "input",
    "workspace", "activations", "temporaries",     "arena"};
// Okabe & Ito, as the report's other charts.
constexpr std::array<const char*, 8> kColours = {"#0072B2", "#E69F00", "#009E73", "#56B4E9",
                                                 "#CC79A7", "#D55E00", "#F0E442", "#999999"};

struct Timeline {
  std::vector<std::string> layer;
  std::vector<std::string> phase;
  std::vector<std::vector<double>> bytes;  // by kStackOrder, per visit
  std::size_t peak_visit = 0;
  std::string peak_text;
  std::string source;  // "measured" or "predicted"
};

// The timeline of memory.analysis.measured or .predicted; none when absent or malformed (the
// results reader does not check analysis objects, so a hand-edited file must not break the page).
std::optional<Timeline> read_timeline(const json& analysis) {
  for (const char* key : {"measured", "predicted"}) {
    const auto part = analysis.find(key);
    if (part == analysis.end() || !part->is_object()) continue;
    const auto tl = part->find("timeline");
    if (tl == part->end() || !tl->is_object()) continue;
    Timeline t;
    t.source = key;
    try {
      t.layer = tl->at("layer").get<std::vector<std::string>>();
      t.phase = tl->at("phase").get<std::vector<std::string>>();
      const json& by = tl->at("by_category");
      for (std::string_view name : kStackOrder) {
        const auto it = by.find(name);
        std::vector<double> v(t.layer.size(), 0.0);
        if (it != by.end()) v = it->get<std::vector<double>>();
        if (v.size() != t.layer.size()) return std::nullopt;
        t.bytes.push_back(std::move(v));
      }
      const auto first = tl->at("first_call").get<std::vector<std::size_t>>();
      const auto last = tl->at("last_call").get<std::vector<std::size_t>>();
      const auto peak_call = part->at("peak_call").get<std::size_t>();
      if (t.phase.size() != t.layer.size() || first.size() != t.layer.size() ||
          last.size() != t.layer.size()) {
        return std::nullopt;
      }
      for (std::size_t i = 0; i < first.size(); ++i) {
        if (first[i] <= peak_call && peak_call <= last[i]) t.peak_visit = i;
      }
      const auto peak_bytes = part->at("peak").at("allocated_bytes").get<std::int64_t>();
      t.peak_text = fmt::format(
          "{} peak {} at {} ({})", key,
          format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(peak_bytes, 0))),
          part->at("peak_layer").get<std::string>(), part->at("peak_phase").get<std::string>());
    } catch (const json::exception&) {
      return std::nullopt;
    }
    if (t.layer.empty()) return std::nullopt;
    return t;
  }
  return std::nullopt;
}

double nice_top(double v) {
  if (!(v > 0)) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * magnitude >= v) return m * magnitude;
  }
  return 10 * magnitude;
}

std::string chart(const Timeline& t, const std::string& label, std::size_t index) {
  const double width = 1000;
  const double height = 360;
  const double x0 = 70;
  const double x1 = width - 190;
  const double y0 = height - 50;
  const double y1 = 30;
  const std::size_t n = t.layer.size();
  std::vector<double> total(n, 0.0);
  for (const auto& cat : t.bytes) {
    for (std::size_t i = 0; i < n; ++i) total[i] += std::max(cat[i], 0.0);
  }
  const double top = nice_top(*std::max_element(total.begin(), total.end()) / kGiB * 1.05);
  auto x = [&](double i) { return x0 + (x1 - x0) * i / static_cast<double>(n); };
  auto y = [&](double bytes) { return y0 - (y0 - y1) * (bytes / kGiB) / top; };

  const std::string title = fmt::format("Memory over one step: {}", label);
  std::string s = fmt::format(
      "<svg id=\"chart-memory-timeline-{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n"
      "<title>{}</title>\n",
      index, svg_number(width), svg_number(height), svg_number(width), svg_number(height),
      html_escape(title), html_escape(title));
  // Phases as light bands with their names.
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && t.phase[j] == t.phase[i]) ++j;
    const char* fill = t.phase[i] == "forward"    ? "#f3f7fb"
                       : t.phase[i] == "backward" ? "#fbf6f0"
                                                  : "#f2f8f2";
    const double left = x(static_cast<double>(i));
    const double band = x(static_cast<double>(j)) - left;
    s += fmt::format(
        "<rect class=\"phase\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\">"
        "<title>{}</title></rect>\n",
        svg_number(left), svg_number(y1), svg_number(band), svg_number(y0 - y1), fill,
        html_escape(t.phase[i]));
    // A phase too narrow for its name (the update is one call) keeps it in the tooltip.
    if (band > 60) {
      s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\">{}</text>\n", svg_number(left + 4),
                       svg_number(y1 - 6), html_escape(t.phase[i]));
    }
    i = j;
  }
  const int ticks = 5;
  for (int k = 0; k <= ticks; ++k) {
    const double v = top * k / ticks;
    const double yy = y(v * kGiB);
    s += fmt::format(
        "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>"
        "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{:g}</text>\n",
        svg_number(x0), svg_number(yy), svg_number(x1), svg_number(yy), svg_number(x0 - 6),
        svg_number(yy + 4), v);
  }
  s += fmt::format(
      "<text class=\"axis-label\" transform=\"translate(16 {}) rotate(-90)\" "
      "text-anchor=\"middle\">GiB allocated</text>\n"
      "<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">layers through the "
      "step, in call order ({} visits, {})</text>\n",
      svg_number((y0 + y1) / 2), svg_number((x0 + x1) / 2), svg_number(height - 10), n, t.source);
  // Step-shaped areas, each on the sum of those below it.
  std::vector<double> below(n, 0.0);
  for (std::size_t k = 0; k < kStackOrder.size(); ++k) {
    const auto& v = t.bytes[k];
    if (std::all_of(v.begin(), v.end(), [](double b) { return b <= 0; })) continue;
    std::string path = fmt::format("M{},{}", svg_number(x(0)), svg_number(y(below[0])));
    for (std::size_t i = 0; i < n; ++i) {
      const double top_i = below[i] + std::max(v[i], 0.0);
      path +=
          fmt::format(" L{},{} L{},{}", svg_number(x(static_cast<double>(i))), svg_number(y(top_i)),
                      svg_number(x(static_cast<double>(i + 1))), svg_number(y(top_i)));
    }
    for (std::size_t i = n; i-- > 0;) {
      path += fmt::format(" L{},{} L{},{}", svg_number(x(static_cast<double>(i + 1))),
                          svg_number(y(below[i])), svg_number(x(static_cast<double>(i))),
                          svg_number(y(below[i])));
    }
    s += fmt::format("<path class=\"area\" d=\"{} Z\" fill=\"{}\"><title>{}</title></path>\n", path,
                     kColours[k], html_escape(kStackOrder[k]));
    for (std::size_t i = 0; i < n; ++i) below[i] += std::max(v[i], 0.0);
  }
  // One hover target per visit: what it holds.
  for (std::size_t i = 0; i < n; ++i) {
    std::string parts;
    for (std::size_t k = 0; k < kStackOrder.size(); ++k) {
      if (t.bytes[k][i] <= 0) continue;
      parts += fmt::format(", {} {}", kStackOrder[k],
                           format_size(static_cast<std::uint64_t>(t.bytes[k][i])));
    }
    s += fmt::format(
        "<rect class=\"visit\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"transparent\">"
        "<title>{} ({}): {}{}</title></rect>\n",
        svg_number(x(static_cast<double>(i))), svg_number(y1), svg_number(x(1) - x(0)),
        svg_number(y0 - y1), html_escape(t.layer[i]), html_escape(t.phase[i]),
        format_size(static_cast<std::uint64_t>(total[i])), html_escape(parts));
  }
  const double px = x(static_cast<double>(t.peak_visit) + 0.5);
  s += fmt::format(
      "<line class=\"peak\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#b00020\" "
      "stroke-dasharray=\"4 3\"/><text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"{}\" "
      "fill=\"#b00020\">{}</text>\n",
      svg_number(px), svg_number(y1), svg_number(px), svg_number(y0),
      svg_number(px + (px > (x0 + x1) / 2 ? -4 : 4)), svg_number(y1 + 14),
      px > (x0 + x1) / 2 ? "end" : "start", html_escape(t.peak_text));
  for (std::size_t k = 0; k < kStackOrder.size(); ++k) {
    const double ly = y1 + 4 + 18 * static_cast<double>(k);
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text class=\"legend\" x=\"{}\" y=\"{}\">{}</text>\n",
        svg_number(x1 + 14), svg_number(ly), kColours[k], svg_number(x1 + 32), svg_number(ly + 10),
        html_escape(kStackOrder[k]));
  }
  return s + "</svg>\n";
}

}  // namespace

std::string memory_timeline_section(const std::vector<MemoryTimelineInput>& inputs) {
  // Each chart is about 100 kB of SVG for a ResNet-50 step; a sweep's page stays loadable.
  constexpr std::size_t kMaxCharts = 12;
  std::string charts;
  std::size_t drawn = 0;
  std::size_t available = 0;
  for (const MemoryTimelineInput& in : inputs) {
    if (in.config == nullptr || !in.config->memory || !in.config->memory->analysis.is_object()) {
      continue;
    }
    const std::optional<Timeline> t = read_timeline(in.config->memory->analysis);
    if (!t) continue;
    ++available;
    if (drawn < kMaxCharts) charts += chart(*t, in.label, drawn++);
  }
  if (charts.empty()) return "";
  std::string note;
  if (available > drawn) {
    note = fmt::format(" The first {} of {} configurations with a timeline are drawn.", drawn,
                       available);
  }
  return "<h3>Memory over one step</h3>\n<p class=\"sub\">One point per layer visit (its calls "
         "in one phase) at its highest moment, stacked by category; under the planned memory "
         "mode the arena is split into what its buffers hold and its unused rest." +
         note + "</p>\n" + charts;
}

std::string svg_number(double v) {
  constexpr double kFar = 1e6;  // pixels; the widest chart is 1000
  return fmt::format("{:.2f}", std::isnan(v) ? 0 : std::clamp(v, -kFar, kFar));
}

}  // namespace dlprobe::report
