// End to end through the binary: a CPU bench sweep writes its results, CSV and Markdown; `dlprobe
// report` turns them into a page that headless Chromium renders without console errors and with
// its charts; `dlprobe compare` of the file with itself finds no change; `dlprobe evaluate --quick`
// on this machine leaves its folder and a five-line summary. Chromium is Debian's (setup.sh
// installs it); only the rendering is skipped without it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <regex>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"
#include "dlprobe/results/results.h"

namespace dlprobe::testing {
namespace {

std::string find_chromium() {
  if (const char* env = std::getenv("DLPROBE_CHROMIUM"); env && *env) return env;
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

// The page's DOM after its scripts ran, and the console lines that are errors.
struct Rendered {
  int exit_code = -1;
  std::string dom;
  std::vector<std::string> console_errors;
};

Rendered render(const std::string& chromium, const std::filesystem::path& page,
                const std::filesystem::path& dir) {
  const auto profile = dir / "chromium-profile";
  std::filesystem::create_directories(profile);
  // As root Chromium needs --no-sandbox; the rest keeps it off the network and the GPU.
  // --enable-logging=stderr --v=0 puts console messages on stderr.
  const ProcessResult r = run_process(
      split_args(quote(chromium) +
                 " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                 " --disable-background-networking --disable-component-update"
                 " --disable-sync --enable-logging=stderr --v=0 --user-data-dir=" +
                 quote(profile.string()) + " --dump-dom " + quote("file://" + page.string())),
      {.timeout = 120s});
  Rendered out;
  out.exit_code = r.exit_code;
  out.dom = r.out;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("Uncaught") != std::string::npos ||
        line.find("ERROR:CONSOLE") != std::string::npos ||
        (line.find(":CONSOLE(") != std::string::npos &&
         line.find("Content Security Policy") != std::string::npos)) {
      out.console_errors.push_back(line);
    }
  }
  return out;
}

// Whether Chart.js drew chart `id` in the rendered page: it sizes and styles the canvas it draws
// in.
bool drawn(const std::string& dom, const std::string& id) {
  return std::regex_search(
      dom,
      std::regex("<canvas id=\"" + id + "\"[^>]*style=\"display: block; box-sizing: border-box"));
}

// How many lines chart `id` of the report at `page` draws: the datasets of its specification.
std::size_t datasets(const std::filesystem::path& page, const std::string& id) {
  const std::string html = slurp(page);
  const std::string tag = "id=\"chart-data\">";
  const auto from = html.find(tag) + tag.size();
  for (const auto& chart :
       nlohmann::json::parse(html.substr(from, html.find("</script>", from) - from))) {
    if (chart["id"] == id) return chart["config"]["data"]["datasets"].size();
  }
  return 0;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(BenchEndToEnd, CpuSweepResultsReportAndCompare) {
  const TempFolder dir;
  const auto json = dir / "r.json";
  const auto csv = dir / "r.csv";
  const auto md = dir / "r.md";
  const ProcessResult bench = run_dlprobe(split_args(
      "bench --device cpu --model resnet18 --width 16 --image-size 32 --classes 10"
      " --batch 2,4 --mode train,infer --steps 2 --min-time 0s --warmup 0"
      " --warmup-time 0s --json " +
      quote(json.string()) + " --csv " + quote(csv.string()) + " --md " + quote(md.string())));
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  // The table on stdout, a row per configuration; progress on stderr.
  const std::regex row("resnet18-w16@32 bs=4 fp32 infer nhwc cpu classes=10 +ok +[0-9.,]+ ");
  EXPECT_TRUE(std::regex_search(bench.out, row)) << bench.out;
  EXPECT_NE(bench.err.find("[4/4]"), std::string::npos) << bench.err;

  auto doc = results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 4u);
  for (const auto& c : doc->configurations) {
    EXPECT_EQ(c.status, results::RunStatus::ok);
    ASSERT_TRUE(c.statistics.has_value());
    EXPECT_EQ(c.statistics->steps, 2u);
    EXPECT_EQ(c.samples.warmup_steps, 0);
    EXPECT_TRUE(c.memory.has_value());
    EXPECT_TRUE(c.compute.has_value());
  }
  EXPECT_FALSE(doc->context.command_line.empty());
  EXPECT_FALSE(doc->context.libraries.empty());
  const std::string csv_text = slurp(csv);
  EXPECT_EQ(count(csv_text, "\n"), 5u) << csv_text;  // header and four rows
  EXPECT_NE(slurp(md).find("| native | resnet18-w16@32 bs=2 fp32 train nhwc cpu sgd classes=10 |"),
            std::string::npos);

  const auto html = dir / "report.html";
  const ProcessResult report = run_dlprobe({"report", json.string(), "-o", html.string()});
  ASSERT_EQ(report.exit_code, 0) << report.err;

  const ProcessResult compare =
      run_dlprobe({"compare", json.string(), json.string(), "--fail-above", "3%"});
  EXPECT_EQ(compare.exit_code, 0) << compare.out << compare.err;
  EXPECT_EQ(count(compare.out, "no change"), 4u) << compare.out;

  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "no chromium installed (scripts/setup.sh installs it)";
  const Rendered page = render(chromium, html, dir.path());
  ASSERT_EQ(page.exit_code, 0);
  EXPECT_TRUE(page.console_errors.empty()) << page.console_errors.front();
  for (const char* id : {"chart-throughput", "chart-latency", "chart-step-times", "chart-memory"}) {
    EXPECT_EQ(count(page.dom, std::string("<canvas id=\"") + id + "\""), 1u) << id;
    EXPECT_TRUE(drawn(page.dom, id)) << id;
  }
  const auto table = page.dom.find("<table id=\"configurations\"");
  ASSERT_NE(table, std::string::npos);
  const std::string rows = page.dom.substr(table, page.dom.find("</table>", table) - table);
  EXPECT_EQ(count(rows, "<tr"), 5u);  // header and four configurations
  // Throughput: two series (train and infer), each a line with a point per batch; latency: the
  // infer one.
  EXPECT_EQ(datasets(html, "chart-throughput"), 2u);
  EXPECT_EQ(datasets(html, "chart-latency"), 1u);
}

TEST(Evaluate, QuickRunLeavesItsFolderAndFiveLines) {
#ifdef DLPROBE_SANITIZED_BUILD
  // Two minutes of sanitized CPU loops for code the sweep test above already runs sanitized; the
  // normal build runs it.
  GTEST_SKIP() << "evaluate's CPU sweep takes minutes under the sanitizers";
#endif
  const TempFolder dir;
  const auto out = dir / "eval";
  const ProcessResult r = run_dlprobe({"evaluate", "--quick", "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count(r.out, "\n"), 5u) << r.out;
  std::istringstream lines(r.out);
  for (const char* start : {"machine ", "ceilings ", "best ", "memory ", "findings "}) {
    std::string line;
    std::getline(lines, line);
    EXPECT_TRUE(line.starts_with(start)) << start << "\n" << r.out;
  }
  EXPECT_NE(r.out.find((out / "report.html").string()), std::string::npos);
  auto doc = results::read_file(out / "results.json");
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  EXPECT_FALSE(doc->configurations.empty());
  for (const auto& c : doc->configurations) EXPECT_EQ(c.status, results::RunStatus::ok);
  EXPECT_TRUE(std::filesystem::exists(out / "report.html"));
  EXPECT_TRUE(std::filesystem::exists(out / "doctor.json"));
  EXPECT_TRUE(std::filesystem::exists(out / "tuning.json"));
  // Doctor's findings travel with the results.
  bool from_doctor = false;
  for (const auto& f : doc->findings) from_doctor = from_doctor || f.id.starts_with("doctor.");
  EXPECT_TRUE(from_doctor);

  // A second run does not replace the first unasked.
  const ProcessResult again = run_dlprobe({"evaluate", "--quick", "--out", out.string()});
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("results.json: exists and is not empty (--overwrite replaces it)"),
            std::string::npos)
      << again.err;

  const std::string chromium = find_chromium();
  if (!chromium.empty()) {
    const Rendered page = render(chromium, out / "report.html", dir.path());
    ASSERT_EQ(page.exit_code, 0);
    EXPECT_TRUE(page.console_errors.empty()) << page.console_errors.front();
    EXPECT_TRUE(drawn(page.dom, "chart-throughput"));
  }
}

TEST(Evaluate, BadInputIsOneLine) {
  const TempFolder dir;
  for (const std::string& args :
       {std::string("--device tpu"), std::string("--conv-algo fastest"), std::string("--bogus"),
        std::string("--tuning-cache /nonexistent/dir/t.json"),
        std::string("--data /nonexistent/jpegs"), std::string("--data-threads 4"),
        std::string("--device cpu --data-decode gpu --data /nonexistent/jpegs"),
        std::string("--data-decode fast --data /nonexistent/jpegs"),
        std::string("--device cpu --data-gpu-pixels ycbcr --data /nonexistent/jpegs")}) {
    const ProcessResult r =
        run_dlprobe(split_args("evaluate " + args + " --out " + quote((dir / "x").string())));
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(count(r.err, "dlprobe: error:"), 1u) << args << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "x" / "results.json"));
  }
}

// A GPU that is not there: one line that says what is missing and what to run instead, and no
// folder left behind, as nothing was measured.
TEST(Evaluate, AMissingGpuLeavesNoFolder) {
  const TempFolder dir;
  const ProcessResult r =
      run_dlprobe(split_args("evaluate --quick --device cuda:0 -o " + quote((dir / "x").string())));
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count(r.err, "dlprobe: error:"), 1u) << r.err;
  EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
}

}  // namespace
}  // namespace dlprobe::testing
