#include "fleet.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "charts.h"
#include "dlprobe/core/units.h"
#include "dlprobe/report/html.h"

namespace dlprobe::report {
namespace {

using nlohmann::json;

// What a file records of the machine it ran on, as (what, value) pairs in a fixed order.
std::vector<std::pair<std::string, std::string>> machine_of(const results::Context& c) {
  // Each model with its count, in the order NVML lists them: "NVIDIA H200 ×8", or
  // "NVIDIA A100, NVIDIA H200 ×2" on a machine of mixed GPUs.
  std::vector<std::pair<std::string, std::size_t>> models;
  for (const results::Gpu& g : c.gpus) {
    auto it = std::find_if(models.begin(), models.end(),
                           [&](const auto& m) { return m.first == g.name; });
    if (it == models.end()) {
      models.emplace_back(g.name, 1);
    } else {
      ++it->second;
    }
  }
  std::string gpu = models.empty() ? "CPU " + c.cpu : "";
  for (const auto& [name, count] : models) {
    gpu += (gpu.empty() ? "" : ", ") + name + (count > 1 ? fmt::format(" ×{}", count) : "");
  }
  std::vector<std::pair<std::string, std::string>> out = {
      {"host", c.hostname},
      {"GPU", gpu},
      {"driver", c.driver_version.value_or("")},
      {"CUDA", c.cuda_runtime_version.value_or(c.cuda_driver_version.value_or(""))}};
  for (const auto& l : c.libraries) out.emplace_back(l.name, l.version);
  return out;
}

struct Cell {
  const results::Configuration* config = nullptr;
  std::string date;  // of its file: the latest run of a machine is the one shown
};

}  // namespace

std::string fleet_section(std::span<const results::NamedDocument> documents, json& charts) {
  std::vector<std::vector<std::pair<std::string, std::string>>> machines;
  std::vector<std::string> rows;
  std::map<std::pair<std::string, std::size_t>, Cell> cells;
  for (const auto& d : documents) {
    const auto machine = machine_of(d.document.context);
    auto m = static_cast<std::size_t>(std::find(machines.begin(), machines.end(), machine) -
                                      machines.begin());
    if (m == machines.size()) machines.push_back(machine);
    for (const auto& c : d.document.configurations) {
      if (c.status != results::RunStatus::ok || !c.statistics) continue;
      const std::string row = results::describe(c.kind, c.settings);
      if (std::find(rows.begin(), rows.end(), row) == rows.end()) rows.push_back(row);
      Cell& cell = cells[{row, m}];
      if (cell.config == nullptr || d.document.context.date >= cell.date) {
        cell = {&c, d.document.context.date};
      }
    }
  }
  if (machines.size() < 2 || rows.empty()) return "";

  // A column is headed by its host and GPU, and by whatever else is not the same on every machine.
  std::vector<std::string> differing;
  for (const auto& machine : machines) {
    for (const auto& [what, value] : machine) {
      if (what == "host" || what == "GPU") continue;
      if (std::find(differing.begin(), differing.end(), what) != differing.end()) continue;
      const bool same = std::all_of(machines.begin(), machines.end(), [&](const auto& other) {
        const auto it = std::find_if(other.begin(), other.end(),
                                     [&](const auto& field) { return field.first == what; });
        return it != other.end() && it->second == value;
      });
      if (!same) differing.push_back(what);
    }
  }
  const auto header = [&](std::size_t m, std::string_view separator) {
    std::string text;
    for (const auto& [what, value] : machines[m]) {
      const bool shown = what == "host" || what == "GPU" ||
                         std::find(differing.begin(), differing.end(), what) != differing.end();
      if (!shown) continue;
      if (!text.empty()) text += separator;
      text += what == "host" || what == "GPU"
                  ? value
                  : fmt::format("{} {}", what, value.empty() ? "unknown" : value);
    }
    return text;
  };

  std::string table =
      "<div class=\"wide\"><table id=\"machines\"><thead><tr><th>configuration</th>";
  for (std::size_t m = 0; m < machines.size(); ++m) {
    table += "<th>" + html_escape(header(m, "\n")) + "</th>";
  }
  table += "</tr></thead><tbody>\n";
  json spec = chart_spec("chart-machines", "bar", "Throughput by machine", "items / s");
  json& config = spec["config"];
  std::vector<json> data(machines.size(), json::array());
  std::vector<json> tips(machines.size(), json::array());
  for (const std::string& row : rows) {
    table += "<tr><td>" + html_escape(row) + "</td>";
    config["data"]["labels"].push_back(row.size() > 40 ? row.substr(0, 39) + "…" : row);
    std::optional<double> first;
    for (std::size_t m = 0; m < machines.size(); ++m) {
      const auto it = cells.find({row, m});
      if (it == cells.end()) {
        table += "<td></td>";
        data[m].push_back(nullptr);
        tips[m].push_back(nullptr);
        continue;
      }
      const auto& st = *it->second.config->statistics;
      std::string text = fmt::format("{} ({} – {})", format_grouped(st.throughput, 1),
                                     format_grouped(st.throughput_ci.low, 1),
                                     format_grouped(st.throughput_ci.high, 1));
      if (!first) {
        first = st.throughput;
      } else if (*first > 0 && std::isfinite(st.throughput / *first)) {
        text += fmt::format(" ×{:.3f}", st.throughput / *first);
      }
      table += fmt::format("<td class=\"n\">{}</td>", html_escape(text));
      const auto or_null = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
      data[m].push_back({{"x", config["data"]["labels"].back()},
                         {"y", or_null(st.throughput)},
                         {"low", or_null(st.throughput_ci.low)},
                         {"high", or_null(st.throughput_ci.high)}});
      tips[m].push_back(fmt::format("{}: {} items/s", header(m, ", "), text));
    }
    table += "</tr>\n";
  }
  table += "</tbody></table></div>\n";
  for (std::size_t m = 0; m < machines.size(); ++m) {
    config["data"]["datasets"].push_back({{"label", header(m, " · ")},
                                          {"data", std::move(data[m])},
                                          {"tips", std::move(tips[m])},
                                          {"borderColor", chart_colour(m)},
                                          {"backgroundColor", chart_colour(m)}});
  }
  spec["errorBars"] = true;
  config["options"]["scales"]["x"] = {{"type", "category"}};
  config["options"]["scales"]["y"] = {{"beginAtZero", true}, {"title", axis_title("items / s")}};
  std::string html = fmt::format(
      "<p class=\"sub\">{} machines: a column per machine, the configurations each ran; "
      "throughput in items/s with its CI, and × its ratio to the row's first machine. Where a "
      "machine ran a configuration in several files, the latest is shown.</p>\n",
      machines.size());
  html += chart_canvas("chart-machines", "Throughput by machine", 400);
  charts.push_back(std::move(spec));
  return html + table;
}

}  // namespace dlprobe::report
