// The memory timeline: one step of a `dlprobe memory` configuration, one point per layer visit
// (consecutive calls of a layer in one phase, at their highest moment), stacked by category, the
// phases shaded and the peak marked, drawn by Chart.js like the report's other charts.
#include "memory_chart.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>

#include "charts.h"
#include "dlprobe/core/units.h"

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

// Step-shaped areas stacked by category, one x unit per visit; the phases as shaded bands and the
// peak as a marker line (both drawn by the page's script).
nlohmann::json timeline_chart(const Timeline& t, const std::string& label, std::size_t index) {
  const std::size_t n = t.layer.size();
  std::vector<double> total(n, 0.0);
  for (const auto& cat : t.bytes) {
    for (std::size_t i = 0; i < n; ++i) total[i] += std::max(cat[i], 0.0);
  }
  const double top = *std::max_element(total.begin(), total.end());
  const bool gib = top >= kGiB;
  const double per = gib ? kGiB : kMiB;
  const char* unit = gib ? "GiB" : "MiB";
  json spec = chart_spec(fmt::format("chart-memory-timeline-{}", index), "line",
                         fmt::format("Memory over one step: {}", label), unit);
  json& config = spec["config"];
  json& datasets = config["data"]["datasets"];
  for (std::size_t k = 0; k < kStackOrder.size(); ++k) {
    const auto& v = t.bytes[k];
    if (std::all_of(v.begin(), v.end(), [](double b) { return b <= 0; })) continue;
    json data = json::array();
    for (std::size_t i = 0; i < n; ++i) {
      data.push_back({{"x", i}, {"y", std::max(v[i], 0.0) / per}});
    }
    // The last visit's step ends at n.
    data.push_back({{"x", n}, {"y", std::max(v[n - 1], 0.0) / per}});
    datasets.push_back({{"label", kStackOrder[k]},
                        {"data", std::move(data)},
                        {"stepped", "after"},
                        {"fill", datasets.empty() ? json("origin") : json("-1")},
                        {"borderColor", kColours[k]},
                        {"backgroundColor", kColours[k]},
                        {"borderWidth", 1},
                        {"pointRadius", 0}});
  }
  // The tooltip's title per visit: what it is and what it holds.
  json titles = json::array();
  for (std::size_t i = 0; i <= n; ++i) {
    const std::size_t v = std::min(i, n - 1);
    titles.push_back(fmt::format("{} ({}): {}", t.layer[v], t.phase[v],
                                 format_size(static_cast<std::uint64_t>(total[v]))));
  }
  spec["titles"] = std::move(titles);
  json bands = json::array();
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && t.phase[j] == t.phase[i]) ++j;
    bands.push_back({{"from", i},
                     {"to", j},
                     {"label", t.phase[i]},
                     {"fill", t.phase[i] == "forward"    ? "#f3f7fb"
                              : t.phase[i] == "backward" ? "#fbf6f0"
                                                         : "#f2f8f2"}});
    i = j;
  }
  spec["bands"] = std::move(bands);
  spec["markers"] = json::array({{{"x", static_cast<double>(t.peak_visit) + 0.5},
                                  {"label", t.peak_text},
                                  {"colour", "#b00020"}}});
  json& options = config["options"];
  options["interaction"] = {{"mode", "index"}, {"intersect", false}};
  options["scales"]["x"] = {
      {"type", "linear"},
      {"min", 0},
      {"max", n},
      {"title", axis_title(fmt::format("layers through the step, in call order ({} visits, {})", n,
                                       t.source))}};
  options["scales"]["y"] = {{"stacked", true},
                            {"beginAtZero", true},
                            {"title", axis_title(fmt::format("{} allocated", unit))}};
  return spec;
}

}  // namespace

std::string memory_timeline_section(const std::vector<MemoryTimelineInput>& inputs,
                                    nlohmann::json& charts) {
  // A sweep's page stays quick to open: each chart holds a few thousand points for a ResNet-50.
  constexpr std::size_t kMaxCharts = 12;
  std::string canvases;
  std::size_t drawn = 0;
  std::size_t available = 0;
  for (const MemoryTimelineInput& in : inputs) {
    if (in.config == nullptr || !in.config->memory || !in.config->memory->analysis.is_object()) {
      continue;
    }
    const std::optional<Timeline> t = read_timeline(in.config->memory->analysis);
    if (!t) continue;
    ++available;
    if (drawn >= kMaxCharts) continue;
    json spec = timeline_chart(*t, in.label, drawn++);
    canvases +=
        chart_canvas(spec["id"].get<std::string>(),
                     spec["config"]["options"]["plugins"]["title"]["text"].get<std::string>(), 360);
    charts.push_back(std::move(spec));
  }
  if (canvases.empty()) return "";
  std::string note;
  if (available > drawn) {
    note = fmt::format(" The first {} of {} configurations with a timeline are drawn.", drawn,
                       available);
  }
  return "<h3>Memory over one step</h3>\n<p class=\"sub\">One point per layer visit (its calls "
         "in one phase) at its highest moment, stacked by category; under the planned memory "
         "mode the arena is split into what its buffers hold and its unused rest." +
         note + "</p>\n" + canvases;
}

}  // namespace dlprobe::report
