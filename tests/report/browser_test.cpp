// The HTML report in a real browser engine: headless Chromium loads it from disk, runs its script
// and dumps the DOM. Checks: no console errors, every chart's <svg> present by id, one table row
// per configuration, and the sort script reorders the table when a heading is clicked.
// Skipped only when no Chromium is installed (scripts/setup.sh installs Debian's `chromium`).
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"

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

TEST_F(Browser, RendersChartsAndTableWithoutConsoleErrors) {
  auto r = chromium(html(), "--dump-dom");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(console_errors(r.err).empty()) << r.err;
  const std::string& dom = r.out;
  for (const char* id : {"chart-throughput", "chart-step-times", "chart-memory", "chart-gpu-util",
                         "chart-power", "chart-sm-clock"}) {
    EXPECT_EQ(count(dom, std::string("<svg id=\"") + id + "\""), 1u) << id;
  }
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
