// `dlprobe report` and `dlprobe compare` run as a user runs them, on the SYNTHETIC TEST FIXTURE
// files and on variants written here.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"
#include "dlprobe/core/files.h"
#include "dlprobe/results/results.h"
#include "fixture.h"

namespace dlprobe::testing {
namespace {

const std::string kNative = std::string(DLPROBE_FIXTURES) + "/synthetic_native.json";
const std::string kExternal = std::string(DLPROBE_FIXTURES) + "/synthetic_external.json";

class Cli : public ::testing::Test {
 protected:
  ProcessResult dlprobe(const std::string& args) { return run_dlprobe(split_args(args)); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const results::Document& d) {
    EXPECT_TRUE(write_file_atomic(path(name), results::serialize(d)).is_ok());
    return path(name);
  }
  const TempFolder dir_;
};

TEST_F(Cli, ReportWritesHtmlMarkdownAndCsvByExtension) {
  auto r = dlprobe("report " + kNative + " " + kExternal + " -o " + path("r.html"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = slurp(path("r.html"));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("id=\"chart-throughput\""), std::string::npos);

  r = dlprobe("report " + kNative + " -o " + path("t.md"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = slurp(path("t.md"));
  EXPECT_EQ(md.rfind("| kind | configuration |", 0), 0u);
  EXPECT_EQ(std::count(md.begin(), md.end(), '\n'), 2 + 9);

  r = dlprobe("report " + kNative + " " + kExternal + " -o " + path("t.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string csv = slurp(path("t.csv"));
  EXPECT_EQ(csv.rfind("file,kind,configuration,", 0), 0u);
  std::size_t lines = 0;
  for (std::size_t at = csv.find("\r\n"); at != std::string::npos; at = csv.find("\r\n", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u + 11u);
}

TEST_F(Cli, ReportRefusesBadInputWithOneLine) {
  auto r = dlprobe("report " + kNative + " -o " + path("x.pdf"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "dlprobe: error: -o " + path("x.pdf") +
                       ": unknown extension '.pdf' (use .html, .md or .csv)\n");
  std::ofstream(path("half.json")) << slurp(kNative).substr(0, 5000);
  r = dlprobe("report " + path("half.json") + " -o " + path("x.html"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("dlprobe: error: " + path("half.json") + ": truncated JSON", 0), 0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_FALSE(std::filesystem::exists(path("x.html")));
}

results::Document slowed(double factor) {
  results::Document d = synthetic_native_document();
  for (auto& c : d.configurations) {
    if (c.samples.step_seconds.empty()) continue;
    for (auto& t : c.samples.step_seconds) t *= factor;
    c.statistics = *stats::summarize(c.samples.step_seconds, c.samples.step_items);
  }
  return d;
}

TEST_F(Cli, CompareSameFileIsNoChangeAndExitsZero) {
  auto r = dlprobe("compare " + kNative + " " + kNative + " --fail-above 3%");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no change"), std::string::npos);
  EXPECT_EQ(r.out.find("slower"), std::string::npos);
  EXPECT_NE(r.out.find("not comparable (base oom, new oom)"), std::string::npos) << r.out;
}

TEST_F(Cli, CompareGatesOnRegressionsAboveTheLimit) {
  const std::string slow = write("slow.json", slowed(1.10));  // about 9% less throughput
  auto r = dlprobe("compare " + kNative + " " + slow + " --fail-above 3%");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("slower"), std::string::npos);
  EXPECT_NE(r.err.find("dlprobe: regression: resnet50 bs=32 bf16 train nhwc cuda:0 sgd is 9.1% "
                       "slower (limit 3.0%)"),
            std::string::npos)
      << r.err;
  // Under a looser limit the same files pass; without one, compare only reports.
  EXPECT_EQ(dlprobe("compare " + kNative + " " + slow + " --fail-above 15%").exit_code, 0);
  EXPECT_EQ(dlprobe("compare " + kNative + " " + slow).exit_code, 0);
  // Faster is never a failure.
  EXPECT_EQ(dlprobe("compare " + slow + " " + kNative + " --fail-above 3%").exit_code, 0);
}

// A configuration the base measured that did not finish in the new file (out of memory here, or
// finished without timed steps) fails the gate as a slowdown would; one that failed on both sides
// does not.
TEST_F(Cli, CompareGatesOnAConfigurationTheNewRunLost) {
  results::Document broken = synthetic_native_document();
  results::Document empty = synthetic_native_document();
  std::string name;
  for (std::size_t i = 0; i < broken.configurations.size(); ++i) {
    if (broken.configurations[i].samples.step_seconds.empty()) continue;
    name = results::describe(broken.configurations[i].kind, broken.configurations[i].settings);
    broken.configurations[i].status = results::RunStatus::oom;
    broken.configurations[i].samples = {};
    broken.configurations[i].statistics.reset();
    empty.configurations[i].samples = {};
    break;
  }
  ASSERT_FALSE(name.empty());
  auto r = dlprobe("compare " + kNative + " " + write("lost.json", broken) + " --fail-above 3%");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(
      r.err.find("dlprobe: regression: " + name + " ran in the base but not in the new file (oom)"),
      std::string::npos)
      << r.err;
  r = dlprobe("compare " + kNative + " " + write("empty.json", empty) + " --fail-above 3%");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(" ran in the base but not in the new file (no timed steps)"),
            std::string::npos)
      << r.err;
  // Without a limit compare only reports; the reverse (the new run measured it) is no failure.
  EXPECT_EQ(dlprobe("compare " + kNative + " " + path("lost.json")).exit_code, 0);
  EXPECT_EQ(dlprobe("compare " + path("lost.json") + " " + kNative + " --fail-above 3%").exit_code,
            0);
}

// A CPU run under load: a fifth of the steps took 2.7 times as long. The throughput fell by a
// quarter, its interval well clear of 1, while the ranks of the step times barely moved (the U
// test's p is above 0.05): the verdict is "slower", says why the test disagrees, and the gate
// fails.
results::Document loaded(bool slow) {
  results::Document d;
  results::Configuration c;
  c.settings.model = "resnet18";
  c.settings.batch = 8;
  c.settings.precision = "fp32";
  c.settings.device = "cpu";
  for (int i = 0; i < 40; ++i) {
    const double t = 0.1 * (1 + 0.01 * ((i * 7) % 11 - 5) / 5.0);
    c.samples.step_seconds.push_back(slow && i % 5 == 4 ? t + 1.333 / 8 : t);
  }
  c.samples.step_items.assign(c.samples.step_seconds.size(), 8.0);
  c.statistics = *stats::summarize(c.samples.step_seconds, c.samples.step_items);
  d.configurations.push_back(c);
  return d;
}

TEST_F(Cli, CompareCallsADropSlowerWhenItsIntervalExcludesOne) {
  const std::string base = write("base.json", loaded(false));
  const std::string next = write("next.json", loaded(true));
  auto r = dlprobe("compare " + base + " " + next + " --fail-above 3%");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.out.find("no change"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("slower (the step-time test does not confirm it, p = "), std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("dlprobe: regression: resnet18 bs=8 fp32"), std::string::npos) << r.err;
}

TEST_F(Cli, CompareJson) {
  const std::string slow = write("slow.json", slowed(1.10));
  auto r = dlprobe("compare --json " + kNative + " " + slow);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema"], "dlprobe.compare/1");
  ASSERT_EQ(j["rows"].size(), 9u);
  EXPECT_EQ(j["rows"][0]["verdict"], "slower");
  EXPECT_NEAR(j["rows"][0]["ratio"].get<double>(), 1 / 1.10, 1e-6);
  EXPECT_TRUE(j["rows"][8]["ratio"].is_null());
}

TEST_F(Cli, CompareListsConfigurationsInOneFileOnly) {
  results::Document fewer = synthetic_native_document();
  fewer.configurations.erase(fewer.configurations.begin());
  const std::string f = write("fewer.json", fewer);
  auto r = dlprobe("compare " + kNative + " " + f);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("only in base: resnet50 bs=32 bf16 train nhwc cuda:0 sgd"),
            std::string::npos)
      << r.out;
}

TEST_F(Cli, CompareErrorsExitTwo) {
  auto r = dlprobe("compare " + kNative + " " + kExternal);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "dlprobe: error: " + kNative + " vs " + kExternal +
                       ": no configuration matches between the files (9 in base, 2 in new); they "
                       "measured different settings\n");
  std::ofstream(path("doctor.json")) << R"({"schema": "dlprobe.doctor/1"})";
  r = dlprobe("compare " + kNative + " " + path("doctor.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "dlprobe: error: " + path("doctor.json") +
                       ": not a dlprobe results file (schema is \"dlprobe.doctor/1\", expected "
                       "\"dlprobe.results/1\")\n");
  r = dlprobe("compare " + kNative + " " + path("missing.json"));
  EXPECT_EQ(r.exit_code, 2);
  r = dlprobe("compare " + kNative + " " + kNative + " --fail-above lots");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dlprobe: error: --fail-above: 'lots' is not a fraction (accepts 0 to 1, e.g. 0.9, or "
            "90%)\n");
  r = dlprobe("compare " + kNative + " " + kNative + " --alpha 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dlprobe: error: --alpha: 0 is no significance level (accepts more than 0, less than "
            "1, e.g. 0.05)\n");
  r = dlprobe("compare " + kNative + " " + kNative + " --noise 100%");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dlprobe: error: --noise: 100% is all of the throughput (accepts 0 up to, not with, "
            "1)\n");
}

}  // namespace
}  // namespace dlprobe::testing
