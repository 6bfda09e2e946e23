// The configuration table and its exports, the HTML report's content and escaping, and compare's
// verdicts, on the SYNTHETIC TEST FIXTURE documents and small hand-made ones.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>

#include "dlprobe/report/compare.h"
#include "dlprobe/report/html.h"
#include "dlprobe/report/trend_chart.h"
#include "dlprobe/results/table.h"
#include "fixture.h"

namespace dlprobe::report {
namespace {

using results::Configuration;
using results::Document;
using results::NamedDocument;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Fixture, CommittedFilesMatchTheGenerator) {
  // If this fails after an intended schema or fixture change, regenerate with
  // build/tests/report/make_report_fixture tests/report/fixtures
  EXPECT_EQ(read_text(DLPROBE_FIXTURES "/synthetic_native.json"),
            results::serialize(testing::synthetic_native_document()));
  EXPECT_EQ(read_text(DLPROBE_FIXTURES "/synthetic_external.json"),
            results::serialize(testing::synthetic_external_document()));
}

std::size_t count(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The specifications of the page's charts: the JSON its scripts read.
nlohmann::json charts_of(const std::string& html) {
  const std::string tag = "<script type=\"application/json\" id=\"chart-data\">";
  const auto begin = html.find(tag);
  if (begin == std::string::npos) return nlohmann::json::array();
  const auto from = begin + tag.size();
  return nlohmann::json::parse(html.substr(from, html.find("</script>", from) - from));
}

// The specification of chart `id`; null when the page has none.
nlohmann::json chart_of(const std::string& html, std::string_view id) {
  for (const auto& chart : charts_of(html)) {
    if (chart["id"] == id) return chart;
  }
  return nullptr;
}

std::size_t points(const nlohmann::json& chart) {
  std::size_t n = 0;
  for (const auto& d : chart["config"]["data"]["datasets"]) n += d["data"].size();
  return n;
}

// Every tooltip text of a chart, one per line.
std::string tips(const nlohmann::json& chart) {
  std::string out;
  for (const auto& d : chart["config"]["data"]["datasets"]) {
    for (const auto& t : d.value("tips", nlohmann::json::array())) {
      if (t.is_string()) out += t.get<std::string>() + "\n";
    }
  }
  return out;
}

std::vector<NamedDocument> both() {
  return {{"native.json", testing::synthetic_native_document()},
          {"external.json", testing::synthetic_external_document()}};
}

TEST(Table, OneRowPerConfigurationWithFileColumnWhenMerged) {
  const auto docs = both();
  const auto merged = results::configuration_table(docs);
  EXPECT_EQ(merged.columns.front(), "file");
  EXPECT_EQ(merged.rows.size(), 9u + 2u);
  for (const auto& r : merged.rows) EXPECT_EQ(r.size(), merged.columns.size());
  const auto single = results::configuration_table(std::span(docs).first(1));
  EXPECT_EQ(single.columns.front(), "kind");
  EXPECT_EQ(single.rows.size(), 9u);
  // The out-of-memory row has its status and error and no throughput.
  const auto& oom = single.rows[8];
  EXPECT_EQ(oom[6].text, "oom");
  EXPECT_FALSE(oom[7].number.has_value());
  EXPECT_EQ(oom.back().text, "cannot allocate 1.50 GiB for activations <layer2.0.conv1> & more");
}

TEST(Table, NamesEachIntervalAndShowsTheSpreadBetweenRuns) {
  auto docs = both();
  docs[0].document.configurations[0].run_spread =
      stats::RunSpread{3, 1700, 1690, 1712, {1680.25, 1719.75}, 0.95};
  const auto t = results::configuration_table(std::span(docs).first(1));
  const auto column = [&](std::string_view name) {
    const auto it = std::find(t.columns.begin(), t.columns.end(), name);
    EXPECT_NE(it, t.columns.end()) << name;
    return static_cast<std::size_t>(it - t.columns.begin());
  };
  const std::size_t within = column("CI low (within steps)");
  const std::size_t low = column("CI low (between runs)");
  const std::size_t high = column("CI high (between runs)");
  EXPECT_TRUE(t.rows[0][within].number.has_value());
  EXPECT_EQ(t.rows[0][low].number, 1680.25);
  EXPECT_EQ(t.rows[0][high].text, "1,719.8");
  EXPECT_EQ(t.rows[0][column("runs in")].text, "engines");
  EXPECT_FALSE(t.rows[1][low].number.has_value());  // one run: no spread between runs
  EXPECT_EQ(t.rows[1][column("runs in")].text, "");
  docs[0].document.configurations[0].runs_in = results::RunsIn::processes;
  EXPECT_EQ(results::configuration_table(std::span(docs).first(1)).rows[0][column("runs in")].text,
            "processes");
}

// Every GPU's energy over the items they made together, as the history counts it.
TEST(Table, EnergyPerItemIsEveryGpusOverAllItems) {
  auto docs = both();
  docs[0].document.configurations.resize(1);
  results::Configuration& c = docs[0].document.configurations[0];
  ASSERT_TRUE(c.statistics.has_value());
  const double items = c.statistics->total_items;
  c.telemetry.resize(2);
  c.telemetry[0].energy_j = 30;
  c.telemetry[1].energy_j = 30;
  const auto t = results::configuration_table(std::span(docs).first(1));
  const auto it = std::find(t.columns.begin(), t.columns.end(), "energy (J/item)");
  ASSERT_NE(it, t.columns.end());
  const auto column = static_cast<std::size_t>(it - t.columns.begin());
  ASSERT_TRUE(t.rows[0][column].number.has_value());
  EXPECT_DOUBLE_EQ(*t.rows[0][column].number, 60 / items);
  // One GPU's energy unknown: none, rather than the other's over every item.
  c.telemetry[1].energy_j.reset();
  EXPECT_FALSE(results::energy_j(c).has_value());
  const auto partial = results::configuration_table(std::span(docs).first(1));
  EXPECT_FALSE(partial.rows[0][column].number.has_value());
}

TEST(Table, CsvQuotesAndKeepsFullPrecision) {
  results::Table t;
  t.columns = {"a", "b,c"};
  t.rows = {{{"say \"hi\"", std::nullopt}, {"1,234.6", 1234.5678}},
            {{"two\nlines", std::nullopt}, {"", std::nullopt}}};
  EXPECT_EQ(results::to_csv(t), "a,\"b,c\"\r\n\"say \"\"hi\"\"\",1234.5678\r\n\"two\nlines\",\r\n");
}

TEST(Table, MarkdownEscapesPipes) {
  results::Table t;
  t.columns = {"x", "y"};
  t.rows = {{{"a|b", std::nullopt}, {"1.0", 1.0}}};
  EXPECT_EQ(results::to_markdown(t), "| x | y |\n|---|---|\n| a\\|b | 1.0 |\n");
}

TEST(Table, ThroughputIsGroupedAndPeakMemoryPrefersTheAllocator) {
  const Document d = testing::synthetic_native_document();
  const std::vector<NamedDocument> docs = {{"n", d}};
  const auto t = results::configuration_table(docs);
  const auto& c = d.configurations[3];  // bf16, batch 256
  EXPECT_DOUBLE_EQ(*t.rows[3][7].number, c.statistics->throughput);
  EXPECT_NE(t.rows[3][7].text.find(','), std::string::npos);  // thousands separator
  EXPECT_EQ(results::peak_memory_bytes(*c.memory),
            c.memory->allocator_stats["allocated_bytes.all.peak"].get<std::int64_t>());
  const auto parts = results::peak_by_category(*c.memory);
  ASSERT_EQ(parts.size(), 7u);
  EXPECT_EQ(parts.front().first, "weights");
  EXPECT_EQ(parts.back().first, "input");
}

// A planned step's arena is one block to the allocator; the memory chart shows what it held at its
// fullest where the file says, and the block whole where the parts do not add up to it.
TEST(Table, PlannedArenaIsToldByWhatItHolds) {
  results::Memory m;
  m.source = "allocator";
  m.allocator_stats = {{"peak.allocated_bytes.weights", 100}, {"peak.allocated_bytes.arena", 4096}};
  m.arena = {{"block_bytes", 4096},
             {"free_bytes", 596},
             {"live_gradient_bytes", 200},
             {"live_by_category",
              {{"weights", 0},
               {"gradients", 0},
               {"optimizer_state", 0},
               {"activations", 3000},
               {"workspace", 0},
               {"temporaries", 500},
               {"input", 0},
               {"arena", 0}}}};
  using Parts = std::vector<std::pair<std::string, std::int64_t>>;
  EXPECT_EQ(results::peak_by_category(m), (Parts{{"weights", 100},
                                                 {"arena: activations", 3000},
                                                 {"arena: backward gradients", 200},
                                                 {"arena: other temporaries", 300},
                                                 {"arena: free", 596}}));
  m.arena["free_bytes"] = 600;  // four bytes more than the block
  EXPECT_EQ(results::peak_by_category(m), (Parts{{"weights", 100}, {"arena", 4096}}));
  m.arena = nullptr;
  EXPECT_EQ(results::peak_by_category(m), (Parts{{"weights", 100}, {"arena", 4096}}));
}

TEST(Html, EscapesEverythingItWrites) {
  EXPECT_EQ(html_escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  Document d = testing::synthetic_external_document();
  d.configurations[0].settings.command = "<script>alert(1)</script>";
  d.context.hostname = "host\"><img src=x>";
  const std::vector<NamedDocument> docs = {{"evil <file>.json", d}};
  const std::string html = render_html(docs);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<file>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
}

TEST(Html, HasEveryChartAndTableAndFetchesNothing) {
  const auto docs = both();
  const std::string html = render_html(docs);
  for (const char* id : {"chart-throughput", "chart-step-times", "chart-memory", "chart-gpu-util",
                         "chart-power", "chart-sm-clock"}) {
    EXPECT_NE(html.find(fmt::format("<canvas id=\"{}\"", id)), std::string::npos) << id;
    EXPECT_FALSE(chart_of(html, id).is_null()) << id;
  }
  for (const char* id : {"configurations", "findings"}) {
    EXPECT_NE(html.find(fmt::format("id=\"{}\"", id)), std::string::npos) << id;
  }
  // One specification per canvas.
  EXPECT_EQ(charts_of(html).size(), count(html, "<canvas id="));
  // Chart.js is in the page, and nothing is fetched from anywhere.
  EXPECT_NE(html.find("Chart.js v3"), std::string::npos);
  for (const char* fetch : {"src=\"http", "href=\"http", "<link", "@import", "url("}) {
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  }
  // Three lines (bf16 and fp32 from one file, the external command from the other) through ten
  // points with error bars: the out-of-memory configuration has no point.
  const auto throughput = chart_of(html, "chart-throughput");
  EXPECT_EQ(throughput["config"]["data"]["datasets"].size(), 3u);
  EXPECT_EQ(points(throughput), 10u);
  EXPECT_TRUE(throughput["errorBars"].get<bool>());
  for (const auto& d : throughput["config"]["data"]["datasets"]) {
    for (const auto& p : d["data"]) EXPECT_LE(p["low"].get<double>(), p["high"].get<double>());
  }
  // One box per configuration with timed steps.
  const auto steps = chart_of(html, "chart-step-times");
  EXPECT_EQ(steps["config"]["data"]["labels"].size(), 10u);
  EXPECT_EQ(steps["config"]["data"]["datasets"][0]["data"].size(), 10u);
  // The table: a row per configuration.
  const auto table_begin = html.find("id=\"configurations\"");
  const std::string table =
      html.substr(table_begin, html.find("</table>", table_begin) - table_begin);
  EXPECT_EQ(count(table, "<tr>"), 1u + 11u);
}

TEST(Html, LeavesOutChartsWithoutData) {
  Document d = testing::synthetic_external_document();
  for (auto& c : d.configurations) c.memory.reset();
  const std::vector<NamedDocument> docs = {{"x.json", d}};
  const std::string html = render_html(docs);
  EXPECT_EQ(html.find("id=\"chart-memory\""), std::string::npos);
  EXPECT_EQ(html.find("id=\"chart-power\""), std::string::npos);
  EXPECT_NE(html.find("id=\"chart-throughput\""), std::string::npos);
  EXPECT_TRUE(chart_of(html, "chart-memory").is_null());
}

// A profiled configuration's step by call kind (largest first, its share of the sum) and its
// slowest calls, names escaped; no section where nothing was profiled.
TEST(Html, ShowsWhereAProfiledStepGoes) {
  Document d = testing::synthetic_external_document();
  EXPECT_EQ(render_html(std::vector<NamedDocument>{{"x.json", d}}).find("Where the step"),
            std::string::npos);
  d.configurations[0].profile = std::vector<results::CallTime>{{"conv<1>", "conv_forward", 3.0},
                                                               {"bn1", "batch_norm_forward", 0.5},
                                                               {"conv2", "conv_forward", 0.5},
                                                               {"fc", "linear_forward", 1.0}};
  const std::string html = render_html(std::vector<NamedDocument>{{"x.json", d}});
  const std::size_t section = html.find("<h2>Where the step's time goes</h2>");
  ASSERT_NE(section, std::string::npos);
  EXPECT_NE(html.find("5.000 ms a step", section), std::string::npos);
  const std::size_t conv = html.find("<td>conv_forward</td>", section);
  const std::size_t linear = html.find("<td>linear_forward</td>", section);
  ASSERT_NE(conv, std::string::npos);
  ASSERT_NE(linear, std::string::npos);
  EXPECT_LT(conv, linear) << "the largest kind first";
  EXPECT_NE(html.find("data-sort=\"70\">70.0 %", section), std::string::npos);
  EXPECT_NE(html.find("<th>3.000 ms</th><td>conv&lt;1&gt; (conv_forward)</td>", section),
            std::string::npos);
  EXPECT_EQ(html.find("conv<1>"), std::string::npos) << "a name written unescaped";
}

TEST(Html, DrawsEachWarmupCurve) {
  Document d = testing::synthetic_external_document();
  const std::vector<NamedDocument> without = {{"x.json", d}};
  EXPECT_EQ(render_html(without).find("id=\"chart-warmup\""), std::string::npos);
  d.configurations[0].samples.warmup = {{"steady", 4, 2.5, true, 0, {2.08, 0.15, 0.149, 0.15}}};
  d.configurations[1].samples.warmup = {{"fixed", 1, 0.2, false, 0, {0.2}}};  // one step: no line
  const std::vector<NamedDocument> docs = {{"x.json", d}};
  const std::string html = render_html(docs);
  const auto chart = chart_of(html, "chart-warmup");
  ASSERT_FALSE(chart.is_null());
  EXPECT_EQ(chart["config"]["data"]["datasets"].size(), 1u);
  EXPECT_NE(tips(chart).find("first 2.08 s, last 0.15 s"), std::string::npos) << tips(chart);
  // The first step (2.08 s) sits on the axis' top, four times the settled 149.5 ms; its tooltip
  // has its time.
  EXPECT_EQ(chart["unit"], "ms");
  EXPECT_DOUBLE_EQ(chart["config"]["options"]["scales"]["y"]["max"].get<double>(), 598);
  EXPECT_DOUBLE_EQ(chart["config"]["data"]["datasets"][0]["data"][0]["y"].get<double>(), 598);
  EXPECT_NE(tips(chart).find("step 1 of 4, 2080 ms"), std::string::npos) << tips(chart);
}

// A hand-edited or hostile file's step times: zero, and spread past a double's range around their
// median. The chart data stays JSON (no nan or inf, which JSON has not: JSON.parse would throw and
// no chart would be drawn).
TEST(Html, NoNonFiniteNumberReachesTheCharts) {
  Document d = testing::synthetic_external_document();
  d.configurations[0].samples.step_seconds.assign(d.configurations[0].samples.step_seconds.size(),
                                                  0.0);
  auto& spread = d.configurations[1].samples.step_seconds;
  spread.assign(spread.size(), 1e-300);
  spread.back() = 1e300;
  d.configurations[0].samples.warmup = {{"steady", 3, 0, true, 0, {0.0, 0.0, 0.0}}};
  d.configurations[1].samples.warmup = {{"steady", 3, 0, true, 0, {1e308, 1e-300, 1e308}}};
  d.configurations[1].statistics->throughput = std::numeric_limits<double>::infinity();
  const std::vector<NamedDocument> docs = {{"x.json", d}};
  const std::string html = render_html(docs);
  nlohmann::json charts;
  ASSERT_NO_THROW(charts = charts_of(html));
  const std::string text = charts.dump();
  for (const char* word : {"nan", "NaN", "inf", "Infinity"}) {
    EXPECT_EQ(text.find(fmt::format(":{}", word)), std::string::npos) << word;
  }
  // The configuration whose median is zero has no scale to draw on; the other keeps its box.
  const auto steps = chart_of(html, "chart-step-times");
  EXPECT_EQ(steps["config"]["data"]["labels"].size(), d.configurations.size() - 1);
}

// Text from a results file (a command line, a file name) inside the chart data cannot end the
// <script> element that holds it, and reads back as written.
TEST(Html, ChartDataCannotEndItsScript) {
  Document d = testing::synthetic_external_document();
  const std::string evil = "x</script><script>alert(1)</script><!--";
  d.configurations[0].settings.command = evil;
  const std::vector<NamedDocument> docs = {{"x.json", d}};
  const std::string html = render_html(docs);
  const std::string tag = "id=\"chart-data\">";
  const auto from = html.find(tag) + tag.size();
  const std::string data = html.substr(from, html.find("</script>", from) - from);
  EXPECT_EQ(data.find('<'), std::string::npos);
  EXPECT_NE(charts_of(html).dump().find(evil), std::string::npos);
}

// A CPU run: no GPU telemetry, a compute figure in GFLOP/s, and one step 16 times the median among
// steps within 1% of it.
Document cpu_run() {
  Document d = testing::synthetic_native_document();
  d.configurations.resize(1);
  Configuration& c = d.configurations[0];
  c.settings.device = "cpu";
  c.telemetry.clear();
  c.compute = results::Compute{};
  c.compute->achieved_tflops = 0.00412;
  c.samples.step_seconds.assign(40, 0.0);
  for (std::size_t i = 0; i < 40; ++i) {
    c.samples.step_seconds[i] = 0.1 * (1 + 0.01 * (static_cast<double>(i % 5) - 2) / 2);
  }
  c.samples.step_seconds[17] = 1.6;
  c.samples.step_items.assign(40, 8.0);
  c.samples.window_steps.clear();
  c.statistics = *stats::summarize(c.samples.step_seconds, c.samples.step_items);
  return d;
}

TEST(Html, ACpuRunsTableHasNoEmptyColumnsAndSuitableUnits) {
  const std::vector<NamedDocument> docs = {{"cpu.json", cpu_run()}};
  const std::string html = render_html(docs);
  const auto table = html.find("id=\"configurations\"");
  ASSERT_NE(table, std::string::npos);
  const std::string head = html.substr(table, html.find("</thead>", table) - table);
  for (const char* gpu_only : {"median power (W)", "energy (J/item)", "median GPU util (%)",
                               "median SM clock (MHz)", "of ceiling (%)", "error"}) {
    EXPECT_EQ(head.find(gpu_only), std::string::npos) << gpu_only;
  }
  EXPECT_NE(head.find("compute (FLOP/s)"), std::string::npos) << head;
  EXPECT_NE(html.find(">4.1 GFLOP/s<"), std::string::npos);
  // The CSV keeps every column for scripts.
  const results::Table full = results::configuration_table(docs);
  EXPECT_GT(full.columns.size(), results::without_empty_columns(full).columns.size());
  // A page of the window's width: the table scrolls in a box of its own.
  EXPECT_NE(html.find("<div class=\"wide\"><table id=\"configurations\""), std::string::npos);
  // No telemetry chart without telemetry.
  EXPECT_TRUE(chart_of(html, "chart-power").is_null());
}

TEST(Html, StepTimeAxisShowsTheBoxesAndMarksOutliersPastIt) {
  const std::vector<NamedDocument> docs = {{"cpu.json", cpu_run()}};
  const std::string html = render_html(docs);
  const auto chart = chart_of(html, "chart-step-times");
  ASSERT_FALSE(chart.is_null());
  // The outlier (+1500%) is past the axis, marked at its edge; the axis spans the whiskers.
  EXPECT_NE(tips(chart).find("1 outlier past the axis, +1500% to +1500%"), std::string::npos)
      << tips(chart);
  const auto& x = chart["config"]["options"]["scales"]["x"];
  EXPECT_LT(x["max"].get<double>(), 10);
  EXPECT_GT(x["min"].get<double>(), -10);
  const auto& past = chart["config"]["data"]["datasets"][4]["data"];
  ASSERT_EQ(past.size(), 1u);
  EXPECT_EQ(past[0]["x"], x["max"]);
  // The median is written in the row's name, in a unit that suits it.
  EXPECT_NE(chart["config"]["data"]["labels"][0].get<std::string>().find("· 100 ms"),
            std::string::npos)
      << chart["config"]["data"]["labels"][0];
}

// Files from two machines (another host with another driver, 10% faster), and a third file from the
// first machine: a column per machine, a row per configuration, the differing driver in the
// headings, and a chart with a bar group per configuration.
TEST(Html, ComparesMachinesSideBySide) {
  const Document here = testing::synthetic_native_document();
  Document there = here;
  there.context.hostname = "gpu-2";
  there.context.driver_version = "590.10";
  // A machine of mixed GPUs is named by each model's count.
  there.context.gpus.clear();
  for (const char* name : {"NVIDIA A100", "NVIDIA H200", "NVIDIA H200"}) {
    results::Gpu g;
    g.name = name;
    there.context.gpus.push_back(g);
  }
  for (auto& c : there.configurations) {
    if (c.statistics) c.statistics->throughput *= 1.1;
  }
  const std::vector<NamedDocument> one = {{"a.json", here},
                                          {"b.json", testing::synthetic_external_document()}};
  EXPECT_EQ(render_html(one).find("id=\"machines\""), std::string::npos);
  const std::vector<NamedDocument> docs = {{"a.json", here}, {"b.json", there}, {"c.json", here}};
  const std::string html = render_html(docs);
  const auto begin = html.find("<table id=\"machines\"");
  ASSERT_NE(begin, std::string::npos);
  const std::string table = html.substr(begin, html.find("</table>", begin) - begin);
  // The header and the 8 configurations that finished (the out-of-memory one has no figure).
  EXPECT_EQ(count(table, "<tr>"), 1u + 8u);
  EXPECT_EQ(count(table, "<th>"), 1u + 2u);
  EXPECT_NE(table.find("driver 590.10"), std::string::npos) << table;
  EXPECT_NE(table.find("NVIDIA A100, NVIDIA H200 ×2"), std::string::npos) << table;
  EXPECT_NE(table.find("×1.100"), std::string::npos) << table;
  const auto chart = chart_of(html, "chart-machines");
  ASSERT_FALSE(chart.is_null());
  EXPECT_EQ(chart["config"]["data"]["datasets"].size(), 2u);
  EXPECT_EQ(chart["config"]["data"]["labels"].size(), 8u);
  EXPECT_EQ(points(chart), 16u);
}

TEST(TrendChart, DrawsEachSeriesWithItsBandAndMarksRegressions) {
  std::vector<TrendLine> lines(2);
  lines[0].name = "gpu-1, NVIDIA H200: resnet50 bs=256 bf16";
  lines[0].points = {{"2026-03-01T12:00:00Z", 3000, 2990, 3010, "#1"},
                     {"2026-03-02T12:00:00Z", 3005, 2995, 3015, "#2"},
                     {"2026-03-03T12:00:00Z", 2700, 2690, 2710, "#3, driver 580.65"},
                     {"not a date", 1, 1, 1, ""}};
  lines[0].regression = true;
  lines[0].verdict = "regression: latest / the 2 results before it 0.899";
  lines[1].name = "cpu-box, CPU: resnet18 bs=8 fp32";
  lines[1].points = {{"2026-03-01", 40, std::nullopt, std::nullopt, ""}};
  lines[1].verdict = "too few";
  const std::string html = render_trend_html("2 series from h.sqlite", lines);
  const auto chart = chart_of(html, "chart-trend");
  ASSERT_FALSE(chart.is_null());
  EXPECT_NE(html.find("<canvas id=\"chart-trend\""), std::string::npos);
  EXPECT_NE(html.find("Chart.js v3"), std::string::npos);
  const auto& datasets = chart["config"]["data"]["datasets"];
  // Per series its line and the two edges of its band; then the regressions.
  ASSERT_EQ(datasets.size(), 3u * 2 + 1);
  EXPECT_EQ(datasets[0]["data"].size(), 3u);  // the point without a date is left out
  EXPECT_EQ(datasets[0]["data"][0]["x"].get<double>(), 1772366400000.0);
  EXPECT_EQ(datasets[1]["data"][2]["y"].get<double>(), 2690);
  EXPECT_EQ(datasets[2]["fill"], "-1");
  EXPECT_TRUE(datasets[4]["data"][0]["y"].is_null());  // no interval: no band
  const auto& regressions = datasets.back();
  EXPECT_EQ(regressions["label"], "regression");
  ASSERT_EQ(regressions["data"].size(), 1u);
  EXPECT_EQ(regressions["data"][0]["y"].get<double>(), 2700);
  EXPECT_NE(tips(chart).find("0.899"), std::string::npos);
  EXPECT_NE(tips(chart).find("#3, driver 580.65"), std::string::npos);
  // The table of series, the regression flagged.
  EXPECT_NE(html.find("<tr class=\"sev-error\"><td>gpu-1, NVIDIA H200"), std::string::npos);
}

// ---- compare ----

Configuration steps(std::int64_t batch, std::vector<double> seconds) {
  Configuration c;
  c.settings.model = "m";
  c.settings.batch = batch;
  c.settings.precision = "bf16";
  c.samples.step_items.assign(seconds.size(), static_cast<double>(batch));
  c.samples.step_seconds = std::move(seconds);
  c.statistics = *stats::summarize(c.samples.step_seconds, c.samples.step_items);
  return c;
}

std::vector<double> around(double mean, int n, double wiggle) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(mean * (1 + wiggle * ((i * 7) % 11 - 5) / 5.0));
  return v;
}

TEST(Compare, Verdicts) {
  Document base;
  Document next;
  base.configurations = {steps(32, around(0.100, 40, 0.01)), steps(64, around(0.200, 40, 0.01)),
                         steps(128, around(0.400, 40, 0.01)), steps(256, around(0.8, 40, 0.01))};
  next.configurations = {steps(32, around(0.100, 40, 0.01)),   // same
                         steps(64, around(0.180, 40, 0.01)),   // 11% faster
                         steps(128, around(0.440, 40, 0.01)),  // 9% slower
                         steps(512, around(1.6, 40, 0.01))};   // only in new
  auto r = compare(base, next);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_EQ(r->rows.size(), 3u);
  EXPECT_EQ(r->rows[0].verdict, Verdict::no_change);
  EXPECT_NEAR(r->rows[0].ratio->ratio, 1.0, 1e-12);
  EXPECT_EQ(r->rows[1].verdict, Verdict::faster);
  EXPECT_NEAR(r->rows[1].ratio->ratio, 0.2 / 0.18, 1e-9);
  EXPECT_LT(r->rows[1].mann_whitney->p_value, 1e-6);
  EXPECT_EQ(r->rows[2].verdict, Verdict::slower);
  EXPECT_NEAR(regression(r->rows[2]), 1 - 0.4 / 0.44, 1e-9);
  EXPECT_EQ(regression(r->rows[1]), 0);
  EXPECT_EQ(r->only_in_base, std::vector<std::string>{"m bs=256 bf16"});
  EXPECT_EQ(r->only_in_new, std::vector<std::string>{"m bs=512 bf16"});
  const auto j = comparison_json(*r);
  EXPECT_EQ(j["rows"][2]["verdict"], "slower");
  const std::string text = render_comparison_text(*r);
  EXPECT_NE(text.find("only in new: m bs=512"), std::string::npos);
}

// Where both sides were profiled, a row names the calls whose time moved most, largest first,
// a call of one side only with no time on the other, a repeated name summed; none where a side
// has no profile.
TEST(Compare, ProfiledRowsNameTheCallsThatMovedMost) {
  Document base;
  Document next;
  base.configurations = {steps(32, around(0.100, 40, 0.01)), steps(64, around(0.200, 40, 0.01))};
  next.configurations = {steps(32, around(0.110, 40, 0.01)), steps(64, around(0.200, 40, 0.01))};
  base.configurations[0].profile = std::vector<results::CallTime>{
      {"conv1", "conv_forward", 2.0}, {"bn1", "batch_norm_forward", 1.0}, {"relu", "relu", 0.5},
      {"relu", "relu", 0.25},         {"fc", "linear_forward", 0.1},      {"old", "fill", 0.05}};
  next.configurations[0].profile = std::vector<results::CallTime>{
      {"conv1", "conv_forward", 2.0}, {"bn1", "batch_norm_forward", 1.5}, {"relu", "relu", 0.5},
      {"relu", "relu", 0.5},          {"fc", "linear_forward", 0.05},     {"new", "fill", 0.2}};
  next.configurations[1].profile = base.configurations[0].profile;
  auto r = compare(base, next);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  const auto& moved = r->rows[0].moved_calls;
  std::vector<std::string> names;
  for (const auto& m : moved) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bn1", "relu", "new", "fc", "old"}));
  EXPECT_EQ(moved[1].base_ms, 0.75);
  EXPECT_EQ(moved[1].new_ms, 1.0);
  EXPECT_EQ(moved[2].base_ms, std::nullopt);
  EXPECT_EQ(moved[4].new_ms, std::nullopt);
  EXPECT_TRUE(r->rows[1].moved_calls.empty()) << "the base of bs=64 has no profile";
  const std::string text = render_comparison_text(*r);
  EXPECT_NE(text.find("calls that moved most (ms a step, base -> new), m bs=32 bf16:"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  bn1       1.000 ->     1.500  +0.500"), std::string::npos) << text;
  EXPECT_NE(text.find("  new           - ->     0.200  +0.200"), std::string::npos) << text;
  const auto j = comparison_json(*r);
  EXPECT_EQ(j["rows"][0]["moved_calls"][0]["name"], "bn1");
  EXPECT_TRUE(j["rows"][0]["moved_calls"][2]["base_ms"].is_null());
  EXPECT_FALSE(j["rows"][1].contains("moved_calls"));
}

TEST(Compare, NoChangeWhenTheTestsDisagreeOrTheDataIsTooNoisy) {
  Document base;
  Document next;
  // A 2% shift buried in 30% noise over few steps: neither the CI nor the U test can tell.
  base.configurations = {steps(32, around(0.100, 6, 0.3))};
  next.configurations = {steps(32, around(0.102, 6, 0.3))};
  auto r = compare(base, next);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rows[0].verdict, Verdict::no_change);
  EXPECT_TRUE(r->rows[0].ratio->ci.contains(1.0));
}

TEST(Compare, SignificantButBelowTheNoiseThresholdIsNoChange) {
  Document base;
  Document next;
  // 0.5% slower with 0.1% wiggle over 200 steps: both tests call it real, the threshold does not.
  base.configurations = {steps(32, around(0.1000, 200, 0.001))};
  next.configurations = {steps(32, around(0.1005, 200, 0.001))};
  auto r = compare(base, next);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->rows[0].ratio->ci.contains(1.0));
  EXPECT_LT(r->rows[0].mann_whitney->p_value, 0.05);
  EXPECT_EQ(r->rows[0].verdict, Verdict::no_change);
  CompareOptions strict;
  strict.noise = 0;
  auto s = compare(base, next, strict);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rows[0].verdict, Verdict::slower);
  CompareOptions bad;
  bad.noise = 1.5;
  EXPECT_FALSE(compare(base, next, bad).has_value());
}

TEST(Compare, TheSpreadBetweenRunsIsTheNoiseWhenLarger) {
  Document base;
  Document next;
  // 3% faster with 0.1% wiggle: real within the steps, and above the default 1% threshold...
  base.configurations = {steps(32, around(0.100, 200, 0.001))};
  next.configurations = {steps(32, around(0.097, 200, 0.001))};
  auto within = compare(base, next);
  ASSERT_TRUE(within.has_value());
  EXPECT_EQ(within->rows[0].verdict, Verdict::faster);
  EXPECT_EQ(within->rows[0].noise, 0.01);
  // ... but the base's three runs from scratch were 320 ± 16 img/s apart (t interval half-width
  // 5% of the mean): a 3% difference is within what a rerun moves.
  base.configurations[0].run_spread = stats::RunSpread{3, 320, 310, 330, {304, 336}, 0.95};
  auto between = compare(base, next);
  ASSERT_TRUE(between.has_value());
  EXPECT_NEAR(between->rows[0].noise, 0.05, 1e-12);
  EXPECT_EQ(between->rows[0].verdict, Verdict::no_change);
  EXPECT_EQ(between->rows[0].why, "within the spread between runs");
  // The same spread between fresh processes (bench --repeat-process) says so.
  base.configurations[0].runs_in = results::RunsIn::processes;
  auto processes = compare(base, next);
  ASSERT_TRUE(processes.has_value());
  EXPECT_EQ(processes->rows[0].why, "within the spread between processes");
  // A narrower spread than the threshold leaves the threshold.
  base.configurations[0].run_spread = stats::RunSpread{3, 320, 319, 321, {319, 321}, 0.95};
  auto narrow = compare(base, next);
  ASSERT_TRUE(narrow.has_value());
  EXPECT_EQ(narrow->rows[0].noise, 0.01);
  EXPECT_EQ(narrow->rows[0].verdict, Verdict::faster);
}

// A CPU run under load: a quarter slower by throughput, its interval well clear of 1, while the
// ranks of the step times overlap. The interval decides, and the verdict says the U test disagrees.
TEST(Compare, AnIntervalClearOfOneIsADifferenceWhateverTheUTestSays) {
  ComparisonRow row;
  row.ratio = stats::Ratio{0.750, {0.585, 0.942}, 0.95};
  row.mann_whitney = stats::MannWhitney{};
  row.mann_whitney->p_value = 0.651;
  judge(row, CompareOptions{});
  EXPECT_EQ(row.verdict, Verdict::slower);
  EXPECT_NEAR(regression(row), 0.25, 1e-12);
  EXPECT_NE(row.why.find("p = 0.651"), std::string::npos) << row.why;

  row.ratio = stats::Ratio{1.30, {1.08, 1.55}, 0.95};
  judge(row, CompareOptions{});
  EXPECT_EQ(row.verdict, Verdict::faster);
  EXPECT_FALSE(row.why.empty());

  // The other disagreement: the ranks moved, the interval holds 1.
  row.ratio = stats::Ratio{0.97, {0.90, 1.04}, 0.95};
  row.mann_whitney->p_value = 0.001;
  judge(row, CompareOptions{});
  EXPECT_EQ(row.verdict, Verdict::no_change);
  EXPECT_NE(row.why.find("p = 0.001"), std::string::npos) << row.why;
}

TEST(Compare, FailedRunsAreNotComparableAndNothingMatchingIsAnError) {
  Document base;
  Document next;
  base.configurations = {steps(32, around(0.1, 20, 0.01))};
  Configuration oom = steps(32, around(0.1, 20, 0.01));
  oom.status = results::RunStatus::oom;
  oom.samples = {};
  oom.statistics.reset();
  next.configurations = {oom};
  auto r = compare(base, next);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rows[0].verdict, Verdict::not_comparable);
  EXPECT_EQ(regression(r->rows[0]), 0);

  next.configurations = {steps(64, around(0.1, 20, 0.01))};
  auto none = compare(base, next);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.status().message(),
            "no configuration matches between the files (1 in base, 1 in new); they measured "
            "different settings");
}

// Step times so small that items / seconds overflows: the ratio and its interval are inf or nan,
// which says nothing about faster or slower.
TEST(Compare, NonFiniteThroughputIsNotComparable) {
  Document base;
  Document next;
  base.configurations = {steps(32, around(0.1, 20, 0.01)), steps(64, around(0.1, 20, 0.01))};
  next.configurations = base.configurations;
  for (auto* c : {&next.configurations[0], &base.configurations[1], &next.configurations[1]}) {
    c->samples.step_seconds.assign(c->samples.step_seconds.size(), 5e-324);
  }
  auto r = compare(base, next);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_EQ(r->rows.size(), 2u);
  for (const auto& row : r->rows) {
    EXPECT_EQ(row.verdict, Verdict::not_comparable);
    EXPECT_FALSE(row.ratio.has_value());
    EXPECT_EQ(regression(row), 0);
  }
  const std::string text = render_comparison_text(*r);
  EXPECT_EQ(count(text, "not comparable (throughput is not a finite number)"), 2u) << text;
  EXPECT_EQ(text.find("nan"), std::string::npos) << text;
  EXPECT_EQ(text.find("inf"), std::string::npos) << text;
  EXPECT_EQ(comparison_json(*r)["rows"][0]["verdict"], "not comparable");
}

}  // namespace
}  // namespace dlprobe::report
