// The HTML report in a real browser engine: headless Chromium loads it from disk, runs its scripts
// and dumps the DOM. Checks: no console errors, Chart.js drew a chart into every <canvas> (each by
// id, with pixels painted), dragging across a chart zooms it and a double-click returns, one table
// row per configuration, and the sort script reorders the table when a heading is clicked.
// Skipped only when no Chromium is installed (scripts/setup.sh installs Debian's `chromium`).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <regex>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"
#include "dlprobe/report/trend_chart.h"
#include "dlprobe/results/results.h"

namespace dlprobe::testing {
namespace {

const std::string kNative = std::string(DLPROBE_FIXTURES) + "/synthetic_native.json";
const std::string kExternal = std::string(DLPROBE_FIXTURES) + "/synthetic_external.json";

std::string find_chromium() {
  if (const char* env = std::getenv("DLPROBE_CHROMIUM"); env && *env) return env;
  for (const char* p :
       {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

class Browser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = find_chromium();
    if (chromium_.empty()) GTEST_SKIP() << "no chromium installed (scripts/setup.sh installs it)";
    auto r = run_dlprobe({"report", kNative, kExternal, "-o", html()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::string html() const { return (dir_ / "report.html").string(); }

  // Headless flags: as root Chromium needs --no-sandbox; the rest keep it from reaching the
  // network or a GPU. --enable-logging=stderr --v=0 puts console messages on stderr.
  ProcessResult chromium(const std::string& page, const std::string& mode) {
    const auto profile = dir_ / "profile";
    std::filesystem::create_directories(profile);
    return run_process(
        split_args(quote(chromium_) +
                   " --headless --no-sandbox --disable-gpu --disable-quic"
                   " --no-first-run --disable-background-networking"
                   " --disable-component-update --disable-sync"
                   " --enable-logging=stderr --v=0 --user-data-dir=" +
                   quote(profile.string()) + " " + mode + " " + quote("file://" + page)),
        {.timeout = 120s});
  }

  static std::vector<std::string> console_errors(const std::string& log) {
    std::vector<std::string> out;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("Uncaught") != std::string::npos ||
          line.find("ERROR:CONSOLE") != std::string::npos ||
          (line.find(":CONSOLE(") != std::string::npos &&
           line.find("Content Security Policy") != std::string::npos)) {
        out.push_back(line);
      }
    }
    return out;
  }

  std::string chromium_;
  const TempFolder dir_;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `page` with `script` run after its own scripts.
std::string with_script(std::string page, const std::string& script) {
  page.insert(page.rfind("</body>"), "<script>" + script + "</script>");
  return page;
}

// The ids of the page's <canvas> elements, in order.
std::vector<std::string> canvas_ids(const std::string& page) {
  std::vector<std::string> ids;
  const std::regex canvas("<canvas id=\"([^\"]+)\"");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), canvas);
       it != std::sregex_iterator(); ++it) {
    ids.push_back((*it)[1]);
  }
  return ids;
}

// Each chart Chart.js made, by its canvas's id, with the pixels it painted there; and the console
// errors of the page.
struct Drawn {
  std::map<std::string, long> painted;
  std::vector<std::string> errors;
  std::string log;
};

class Charts : public Browser {
 protected:
  Drawn drawn(std::string page) {
    const std::string path = (dir_ / "drawn.html").string();
    std::ofstream(path) << with_script(
        std::move(page),
        "var found = Object.values(Chart.instances).map(function (c) {"
        "  var d = c.ctx.getImageData(0, 0, c.canvas.width, c.canvas.height).data, n = 0;"
        "  for (var i = 3; i < d.length; i += 4) if (d[i]) n++;"
        "  return c.canvas.id + '=' + n; });"
        "document.body.setAttribute('data-charts', found.join(' '));");
    auto r = chromium(path, "--window-size=1400,900 --dump-dom");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    Drawn out;
    out.errors = console_errors(r.err);
    out.log = r.err;
    std::smatch found;
    if (std::regex_search(r.out, found, std::regex("data-charts=\"([^\"]*)\""))) {
      std::istringstream words(found[1].str());
      for (std::string word; words >> word;) {
        const auto eq = word.find('=');
        out.painted[word.substr(0, eq)] = std::stol(word.substr(eq + 1));
      }
    }
    return out;
  }

  // What is wrong with the charts of `page`: a console error, a canvas without its chart, or a
  // chart that painted (almost) nothing. Empty when every chart is drawn.
  std::vector<std::string> problems(const std::string& page) {
    const Drawn d = drawn(page);
    std::vector<std::string> out = d.errors;
    for (const auto& id : canvas_ids(page)) {
      const auto it = d.painted.find(id);
      if (it == d.painted.end()) {
        out.push_back(id + ": no chart");
      } else if (it->second < 2000) {  // the axes and labels alone are more
        out.push_back(fmt::format("{}: {} pixels painted", id, it->second));
      }
    }
    if (d.painted.size() != canvas_ids(page).size()) {
      out.push_back(
          fmt::format("{} charts for {} canvases", d.painted.size(), canvas_ids(page).size()));
    }
    return out;
  }
};

TEST_F(Charts, ChartJsDrawsEveryChart) {
  const std::string page = slurp(html());
  const auto ids = canvas_ids(page);
  for (const char* id : {"chart-throughput", "chart-step-times", "chart-memory", "chart-gpu-util",
                         "chart-power", "chart-sm-clock"}) {
    EXPECT_EQ(std::count(ids.begin(), ids.end(), id), 1) << id;
  }
  const auto wrong = problems(page);
  EXPECT_TRUE(wrong.empty()) << fmt::format("{}", fmt::join(wrong, "\n"));
}

// The check above must be able to fail: a page whose chart data does not parse, and one without
// the library, draw nothing, and it says so.
TEST_F(Charts, TheChartCheckCatchesABrokenPage) {
  const std::string page = slurp(html());
  std::string bad_data = page;
  const std::string data_tag = "id=\"chart-data\">";
  bad_data.insert(bad_data.find(data_tag) + data_tag.size(), "{");
  EXPECT_FALSE(problems(bad_data).empty());
  std::string no_library = page;
  const auto begin = no_library.find("<script>/*!\n * Chart.js");
  ASSERT_NE(begin, std::string::npos);
  no_library.erase(begin, no_library.find("</script>", begin) + 9 - begin);
  const auto wrong = problems(no_library);
  EXPECT_GE(wrong.size(), canvas_ids(page).size()) << fmt::format("{}", fmt::join(wrong, "\n"));
}

// Dragging across the throughput chart narrows its x axis to the batches under the drag; a
// double-click shows them all again.
TEST_F(Charts, DragZoomsAndDoubleClickReturns) {
  const std::string path = (dir_ / "zoom.html").string();
  std::ofstream(path) << with_script(
      slurp(html()),
      "var c = Chart.getChart('chart-throughput'), a = c.chartArea, r = "
      "c.canvas.getBoundingClientRect();"
      "function at(type, x) { c.canvas.dispatchEvent(new MouseEvent(type, {bubbles: true, button: "
      "0,"
      "  clientX: r.left + x, clientY: r.top + (a.top + a.bottom) / 2})); }"
      "function range() { return c.scales.x.min + '-' + c.scales.x.max; }"
      "var whole = range();"
      "at('mousedown', a.left + 2); at('mousemove', a.left + (a.right - a.left) * 0.4);"
      "at('mouseup', a.left + (a.right - a.left) * 0.4);"
      "var zoomed = range() + (c.canvas.getAttribute('data-zoomed') || '');"
      "at('dblclick', a.left + 10);"
      "document.body.setAttribute('data-zoom', whole + ' ' + zoomed + ' ' + range());");
  auto r = chromium(path, "--window-size=1400,900 --dump-dom");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(console_errors(r.err).empty()) << r.err;
  std::smatch zoom;
  ASSERT_TRUE(std::regex_search(r.out, zoom, std::regex("data-zoom=\"([^\"]*)\""))) << r.out;
  std::istringstream words(zoom[1].str());
  std::string whole, zoomed, back;
  words >> whole >> zoomed >> back;
  EXPECT_NE(whole, zoomed.substr(0, zoomed.find('t')));
  EXPECT_NE(zoomed.find("true"), std::string::npos) << zoomed;
  EXPECT_EQ(whole, back);
}

// The report of two machines' files draws its machines chart too.
TEST_F(Charts, TheMachinesChartIsDrawn) {
  auto other = results::read_file(kNative);
  ASSERT_TRUE(other.has_value()) << other.status().message();
  other->context.hostname = "gpu-2";
  const std::string second = (dir_ / "gpu-2.json").string();
  std::ofstream(second) << results::serialize(*other);
  const std::string page = (dir_ / "machines.html").string();
  auto r = run_dlprobe({"report", kNative, second, "-o", page});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = slurp(page);
  const auto ids = canvas_ids(html);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "chart-machines"), 1);
  const auto wrong = problems(html);
  EXPECT_TRUE(wrong.empty()) << fmt::format("{}", fmt::join(wrong, "\n"));
}

TEST_F(Charts, TheTrendPageDrawsItsChart) {
  std::vector<report::TrendLine> lines(1);
  lines[0].name = "gpu-1, NVIDIA H200: resnet50 bs=256 bf16";
  lines[0].points = {{"2026-03-01T03:00:00Z", 3000, 2990, 3010, "#1"},
                     {"2026-03-02T03:00:00Z", 3005, 2995, 3015, "#2"},
                     {"2026-03-03T03:00:00Z", 2700, 2690, 2710, "#3"}};
  lines[0].regression = true;
  lines[0].verdict = "regression";
  const std::string page = report::render_trend_html("1 series", lines);
  ASSERT_EQ(canvas_ids(page), std::vector<std::string>{"chart-trend"});
  const auto wrong = problems(page);
  EXPECT_TRUE(wrong.empty()) << fmt::format("{}", fmt::join(wrong, "\n"));
}

TEST_F(Browser, RendersTheTableWithoutConsoleErrors) {
  auto r = chromium(html(), "--dump-dom");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(console_errors(r.err).empty()) << r.err;
  const std::string& dom = r.out;
  const auto table = dom.find("<table id=\"configurations\"");
  ASSERT_NE(table, std::string::npos);
  const std::string rows = dom.substr(table, dom.find("</table>", table) - table);
  // Header plus the 9 native and 2 external configurations.
  EXPECT_EQ(count(rows, "<tr"), 12u);
  EXPECT_NE(rows.find("cannot allocate 1.50 GiB for activations &lt;layer2.0.conv1&gt; &amp; "
                      "more"),
            std::string::npos);
}

TEST_F(Browser, ClickingAHeadingSortsTheTable) {
  // Click "throughput (items/s)" (column 8 after "file") once the page has loaded.
  std::string page = slurp(html());
  page.insert(page.rfind("</body>"),
              "<script>document.querySelectorAll('#configurations th')[8].click();</script>");
  const std::string clicked = (dir_ / "clicked.html").string();
  std::ofstream(clicked) << page;
  auto r = chromium(clicked, "--dump-dom");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(console_errors(r.err).empty()) << r.err;
  const auto table = r.out.find("<table id=\"configurations\"");
  const std::string rows = r.out.substr(table, r.out.find("</table>", table) - table);
  EXPECT_NE(rows.find("data-order=\"asc\""), std::string::npos);
  // The throughput cells, in row order, must now rise; rows without one go last.
  std::vector<double> values;
  const std::regex row_re("<tr>(.*?)</tr>");
  const std::regex cell_re("<td([^>]*)>");
  const std::regex sort_re("data-sort=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(rows.begin(), rows.end(), row_re);
       it != std::sregex_iterator(); ++it) {
    const std::string row = (*it)[1];
    int column = 0;
    for (auto c = std::sregex_iterator(row.begin(), row.end(), cell_re);
         c != std::sregex_iterator(); ++c, ++column) {
      const std::string attributes = (*c)[1];
      std::smatch value;
      if (column == 8 && std::regex_search(attributes, value, sort_re)) {
        values.push_back(std::stod(value[1]));
      }
    }
  }
  ASSERT_EQ(values.size(), 10u);
  EXPECT_TRUE(std::is_sorted(values.begin(), values.end()));
}

// In a 1400-pixel window the page does not scroll sideways: a table of many columns scrolls in a
// box of its own.
TEST_F(Browser, TheReportFitsTheWindow) {
  std::string page = slurp(html());
  page.insert(page.rfind("</body>"),
              "<script>document.body.setAttribute('data-width', "
              "document.documentElement.scrollWidth);</script>");
  const std::string measured = (dir_ / "measured.html").string();
  std::ofstream(measured) << page;
  auto r = chromium(measured, "--window-size=1400,900 --dump-dom");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch width;
  ASSERT_TRUE(std::regex_search(r.out, width, std::regex("data-width=\"([0-9]+)\""))) << r.out;
  EXPECT_LE(std::stoi(width[1]), 1400);
}

TEST_F(Browser, ConsoleErrorCheckCatchesABrokenScript) {
  // The check above must be able to fail: a page whose script throws is caught.
  const std::string broken = (dir_ / "broken.html").string();
  std::ofstream(broken) << "<!DOCTYPE html><html><body><script>undefinedFunction();</script>"
                           "</body></html>";
  auto r = chromium(broken, "--dump-dom");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(console_errors(r.err).empty()) << r.err;
}

TEST_F(Browser, Screenshot) {
  const auto png = dir_ / "report.png";
  auto r = chromium(html(), "--screenshot=" + quote(png.string()) +
                                " --window-size=1280,4200 "
                                "--hide-scrollbars");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(std::filesystem::exists(png));
  const std::string bytes = slurp(png);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_GT(bytes.size(), 50'000u);  // a blank page compresses to a few kB
  if (const char* keep = std::getenv("DLPROBE_KEEP_SCREENSHOT"); keep && *keep) {
    std::filesystem::copy_file(png, keep, std::filesystem::copy_options::overwrite_existing);
  }
}

}  // namespace
}  // namespace dlprobe::testing
