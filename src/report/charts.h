// Internal to the report: charts drawn in the page by Chart.js 3 (Debian's libjs-chart.js, embedded
// at build time, see CMakeLists.txt). Each chart is a <canvas> and a specification written here as
// JSON: Chart.js's own configuration (type, data, options) plus what the page's script adds to it
// (tooltip texts, error bars, shaded ranges, marker lines). The page's script reads the JSON, so
// the numbers stay data and never become code.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace dlprobe::report {

// Chart.js's minified source, as installed (generated source).
std::string_view chartjs_source();

// The CSS of the report's pages.
std::string_view page_style();

// Colour-blind-safe qualitative palette (Okabe & Ito), then darker variants.
const char* chart_colour(std::size_t i);

// A chart's place in the page: <canvas id="ID"> of that height in CSS pixels, its title as the
// accessible name and as the text shown where scripts do not run.
std::string chart_canvas(std::string_view id, std::string_view title, int height);

// A specification with Chart.js's configuration {type, data: {datasets: []}, options} filled with
// what every chart of the report shares: its title, the x scale (drag-to-zoom acts on it) and the
// value unit that tooltips append.
nlohmann::json chart_spec(std::string_view id, std::string_view type, std::string_view title,
                          std::string_view unit);

// An axis title.
nlohmann::json axis_title(std::string_view text);

// JSON to sit inside a <script> element: every '<' written as \u003c, so no string of the data
// (a file name, a command line) can end the element or open a comment.
std::string script_json(const nlohmann::json& value);

// What draws `charts` (an array of chart_spec()s) into their canvases: the JSON, Chart.js, and the
// page's script. "" when the array is empty.
std::string chart_scripts(const nlohmann::json& charts);

// A unit for durations around `seconds`: "s", "ms" or "µs", and how many of it make a second.
struct TimeUnit {
  const char* name;
  double per_second;
};
TimeUnit time_unit(double seconds);

}  // namespace dlprobe::report
