// dlprobe history end to end through the binary: import, list, trend (exit 1 on a regression),
// diff; the measuring commands adding to the history by default, --history, --no-history; and bad
// input: a corrupt or newer history, a results file of another schema.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"
#include "dlprobe/results/results.h"
#include "history/sample.h"

namespace dlprobe {
namespace {

namespace fs = std::filesystem;
using history::testing::RunSpec;
using testing::error_lines;
using testing::run_dlprobe;
using testing::slurp;

const std::vector<std::string> kBench = {
    "bench", "--device",   "cpu", "--model",  "resnet18", "--width",       "16",    "--image-size",
    "32",    "--classes",  "10",  "--batch",  "2",        "--mode",        "infer", "--steps",
    "1",     "--min-time", "0s",  "--warmup", "0",        "--warmup-time", "0s",    "--no-ceiling",
    "-q"};

fs::path write_results(const testing::TempFolder& dir, const std::string& name, RunSpec spec) {
  const fs::path path = dir / name;
  std::ofstream(path) << results::serialize(history::testing::document(spec));
  return path;
}

std::vector<std::string> with(std::vector<std::string> args, std::vector<std::string> more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class HistoryCli : public ::testing::Test {
 protected:
  // `dlprobe history ARGS... --history <the test's database>`.
  testing::ProcessResult history(std::vector<std::string> args) {
    args.insert(args.begin(), "history");
    args.insert(args.begin() + 2, {"--history", db_.string()});
    return run_dlprobe(args);
  }
  // Six nightly results of one configuration; the last at `last_step_s` under `last_driver`.
  void six_nights(double last_step_s, const std::string& last_driver) {
    const double steps[] = {0.1000, 0.1004, 0.0997, 0.1002, 0.0999};
    std::vector<std::string> files = {"import"};
    for (int i = 0; i < 5; ++i) {
      files.push_back(
          write_results(
              dir_, "night" + std::to_string(i) + ".json",
              RunSpec().at("2026-03-0" + std::to_string(i + 1) + "T03:00:00Z").stepping(steps[i]))
              .string());
    }
    files.push_back(
        write_results(
            dir_, "night5.json",
            RunSpec().at("2026-03-06T03:00:00Z").stepping(last_step_s).driven_by(last_driver))
            .string());
    auto r = history(files);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  testing::TempFolder dir_;
  fs::path db_ = dir_ / "history.sqlite";
};

TEST_F(HistoryCli, ImportKeepsGoingPastAFileOfAnotherSchema) {
  const auto a = write_results(dir_, "a.json", RunSpec().on("alpha"));
  const auto b = write_results(dir_, "b.json", RunSpec().on("beta"));
  const fs::path other = dir_ / "other.json";
  std::ofstream(other) << R"({"schema": "dlprobe.results/2", "context": {}})";
  auto r = history({"import", a.string(), other.string(), b.string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("other.json"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("added 2 results from 2 files"), std::string::npos) << r.out;
  auto list = history({"list"});
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_NE(list.out.find("alpha"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("beta"), std::string::npos) << list.out;
  // Imported again: nothing doubles.
  auto again = history({"import", a.string()});
  EXPECT_NE(again.out.find("added 0 results from 1 file"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("1 already there"), std::string::npos) << again.out;
}

TEST_F(HistoryCli, ListFiltersAndPrices) {
  history({"import", write_results(dir_, "a.json", RunSpec().on("alpha")).string(),
           write_results(dir_, "b.json", RunSpec().on("beta").in("fp32")).string()});
  auto r = history({"list", "--machine", "alp", "--price-per-hour", "3.60"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.out.find("beta"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("$/epoch"), std::string::npos) << r.out;
  auto none = history({"list", "--precision", "fp16"});
  EXPECT_NE(none.out.find("no result in the history matches"), std::string::npos);
  auto bad = history({"list", "--price-per-hour", "free"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--price-per-hour 'free'"), std::string::npos) << bad.err;
}

TEST_F(HistoryCli, PricesFromTheConfigFileAndTheFlagOverIt) {
  history({"import", write_results(dir_, "a.json", RunSpec()).string()});
  const fs::path config = dir_ / "config" / "dlprobe" / "config.json";
  fs::create_directories(config.parent_path());
  std::ofstream(config) << R"({"price_per_gpu_hour": {"default": 1, "NVIDIA H200": 3.6}})";
  // The default file, found through XDG_CONFIG_HOME.
  const testing::ProcessOptions env{{{"XDG_CONFIG_HOME", (dir_ / "config").string()}}};
  auto r = run_dlprobe({"history", "--history", db_.string(), "list"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("cost per GPU-hour: $3.6 on NVIDIA H200;"), std::string::npos) << r.out;
  auto flag =
      run_dlprobe({"history", "--history", db_.string(), "list", "--price-per-hour", "7.2"}, env);
  EXPECT_NE(flag.out.find("cost at $7.2 per GPU-hour"), std::string::npos) << flag.out;
  auto named = history({"list", "--config", config.string()});
  EXPECT_NE(named.out.find("$3.6 on NVIDIA H200"), std::string::npos) << named.out;
}

TEST_F(HistoryCli, ABadConfigFileIsOneLineNamingIt) {
  history({"import", write_results(dir_, "a.json", RunSpec()).string()});
  const fs::path config = dir_ / "config.json";
  std::ofstream(config) << R"({"price_per_gpu_hour": {"NVIDIA H200": "3.6"}})";
  auto bad = history({"trend", "--config", config.string()});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(error_lines(bad.err), 1) << bad.err;
  EXPECT_EQ(bad.err, "dlprobe: error: config " + config.string() +
                         ": price_per_gpu_hour.NVIDIA H200: \"3.6\" is not a price (dollars per "
                         "GPU-hour, e.g. 2.49)\n");
  std::ofstream(config) << "{";
  auto broken = history({"list", "--config", config.string()});
  EXPECT_EQ(broken.exit_code, 2);
  EXPECT_NE(broken.err.find("config " + config.string() + ": not JSON"), std::string::npos)
      << broken.err;
  auto missing = history({"list", "--config", (dir_ / "absent.json").string()});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("absent.json: no such file"), std::string::npos) << missing.err;
}

TEST_F(HistoryCli, TrendExitsOneOnARegressionAndNamesTheChange) {
  six_nights(0.110, "590.10");
  auto r = history({"trend"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.out.find("REGRESSION"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the one change: driver: 580.65.06 -> 590.10"), std::string::npos) << r.out;
  auto diff = history({"diff", "5", "6"});
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_EQ(diff.out, "#5 -> #6: the one change: driver: 580.65.06 -> 590.10\n");
}

TEST_F(HistoryCli, TrendWritesItsHtmlPage) {
  six_nights(0.110, "590.10");
  const fs::path page = dir_ / "trend.html";
  auto r = history({"trend", "--html", page.string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;  // the page changes nothing of the verdict
  EXPECT_NE(r.out.find("REGRESSION"), std::string::npos) << r.out;
  const std::string html = slurp(page);
  EXPECT_NE(html.find("<canvas id=\"chart-trend\""), std::string::npos);
  EXPECT_NE(html.find("\"label\":\"regression\""), std::string::npos);
  EXPECT_NE(html.find("#6, driver 590.10"), std::string::npos);
  // An existing page is replaced only with --overwrite, and refused before any work.
  auto again = history({"trend", "--html", page.string()});
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_EQ(error_lines(again.err), 1) << again.err;
  EXPECT_NE(again.err.find("--html"), std::string::npos) << again.err;
  EXPECT_EQ(again.out, "");
  auto overwritten = history({"trend", "--html", page.string(), "--overwrite"});
  EXPECT_EQ(overwritten.exit_code, 1) << overwritten.output;
}

// A fleet's results gathered in one history: `dlprobe report --history` puts the latest of each
// machine side by side.
TEST_F(HistoryCli, ReportComparesTheMachinesOfAHistory) {
  auto r = history(
      {"import",
       write_results(dir_, "a1.json", RunSpec().on("alpha").at("2026-03-01T03:00:00Z")).string(),
       write_results(dir_, "a2.json",
                     RunSpec().on("alpha").at("2026-03-02T03:00:00Z").stepping(0.2))
           .string(),
       write_results(dir_, "b.json", RunSpec().on("beta")).string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path page = dir_ / "fleet.html";
  auto report = run_dlprobe({"report", "--history", db_.string(), "-o", page.string()});
  ASSERT_EQ(report.exit_code, 0) << report.output;
  const std::string html = slurp(page);
  const auto begin = html.find("<table id=\"machines\"");
  ASSERT_NE(begin, std::string::npos);
  const std::string table = html.substr(begin, html.find("</table>", begin) - begin);
  EXPECT_NE(table.find("alpha"), std::string::npos) << table;
  EXPECT_NE(table.find("beta"), std::string::npos) << table;
  // alpha's latest night only: its file, not the first.
  EXPECT_NE(html.find("alpha 2026-03-02"), std::string::npos);
  EXPECT_EQ(html.find("alpha 2026-03-01"), std::string::npos);
  auto neither = run_dlprobe({"report", "-o", (dir_ / "x.html").string()});
  EXPECT_EQ(neither.exit_code, 2) << neither.output;
  EXPECT_EQ(error_lines(neither.err), 1) << neither.err;
}

TEST_F(HistoryCli, DiffNamesANewImageAsTheOneChange) {
  history(
      {"import",
       write_results(dir_, "a.json",
                     RunSpec().inside({"docker", "nvcr.io/nvidia/pytorch:24.05-py3", "sha256:aa"}))
           .string(),
       write_results(dir_, "b.json",
                     RunSpec()
                         .at("2026-03-02T12:00:00Z")
                         .inside({"docker", "nvcr.io/nvidia/pytorch:24.06-py3", "sha256:bb"}))
           .string()});
  auto diff = history({"diff", "1", "2"});
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_EQ(diff.out,
            "#1 -> #2: the one change: container image: nvcr.io/nvidia/pytorch:24.05-py3 "
            "(sha256:aa) -> nvcr.io/nvidia/pytorch:24.06-py3 (sha256:bb)\n");
}

TEST_F(HistoryCli, TrendExitsZeroWhenSteady) {
  six_nights(0.1001, "580.65.06");
  auto r = history({"trend"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("no change"), std::string::npos) << r.out;
}

TEST_F(HistoryCli, ACorruptHistoryIsOneLineAndLeftAsItWas) {
  const std::string junk(4096, '\x5a');
  std::ofstream(db_, std::ios::binary) << junk;
  auto r = history({"list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(error_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("damaged or not a database"), std::string::npos) << r.err;
  auto imported = history({"import", write_results(dir_, "a.json", RunSpec()).string()});
  EXPECT_EQ(imported.exit_code, 2);
  EXPECT_EQ(slurp(db_), junk);
}

TEST_F(HistoryCli, AHistoryOfANewerDlprobeIsRefused) {
  history({"import", write_results(dir_, "a.json", RunSpec()).string()});
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto r = history({"list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(error_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("upgrade dlprobe"), std::string::npos) << r.err;
}

TEST_F(HistoryCli, NoHistoryYetIsSaid) {
  auto r = history({"list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no history at"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(db_));
}

TEST_F(HistoryCli, BenchAddsToTheDefaultHistoryUnlessTold) {
  const fs::path data = dir_ / "data";
  const testing::ProcessOptions env{{{"XDG_DATA_HOME", data.string()}}};
  auto r = run_dlprobe(kBench, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path default_db = data / "dlprobe" / "history.sqlite";
  ASSERT_TRUE(fs::exists(default_db));
  auto list = run_dlprobe({"history", "list"}, env);
  EXPECT_NE(list.out.find("resnet18"), std::string::npos) << list.output;

  auto skipped = run_dlprobe(with(kBench, {"--no-history", "--history", db_.string()}), env);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_FALSE(fs::exists(db_));
  const fs::path json = dir_ / "results.json";
  auto chosen =
      run_dlprobe(with(kBench, {"--history", db_.string(), "--json", json.string()}), env);
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_TRUE(fs::exists(db_));
  // The results file imported after the command stored it: the same row, kept once.
  auto again = history({"import", json.string()});
  EXPECT_NE(again.out.find("added 0 results from 1 file"), std::string::npos) << again.output;
  EXPECT_NE(again.out.find("1 already there"), std::string::npos) << again.output;
}

// A history named with --history that is not one is refused before anything is measured; the
// default history, which the user did not name, is a warning after the run, its results kept.
// A path the system cannot look at (a link to itself) is one line, where it had aborted.
TEST_F(HistoryCli, AHistoryPathThatCannotBeLookedAtIsOneLine) {
  fs::create_symlink("loop.sqlite", dir_ / "loop.sqlite");
  auto r = run_dlprobe({"history", "--history", (dir_ / "loop.sqlite").string(), "list"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("cannot look at it: "), std::string::npos) << r.err;
}

TEST_F(HistoryCli, ANamedHistoryThatCannotBeOpenedIsRefusedFirst) {
  std::ofstream(db_, std::ios::binary) << std::string(4096, '\x5a');
  const fs::path json = dir_ / "results.json";
  auto named = run_dlprobe(with(kBench, {"--history", db_.string(), "--json", json.string()}));
  EXPECT_EQ(named.exit_code, 2) << named.output;
  EXPECT_EQ(error_lines(named.err), 1) << named.err;
  EXPECT_NE(named.err.find("--history: "), std::string::npos) << named.err;
  EXPECT_FALSE(fs::exists(json));

  const fs::path data = dir_ / "data";
  fs::create_directories(data / "dlprobe");
  std::ofstream(data / "dlprobe" / "history.sqlite", std::ios::binary) << std::string(4096, '\x5a');
  const testing::ProcessOptions env{{{"XDG_DATA_HOME", data.string()}}};
  auto by_default = run_dlprobe(with(kBench, {"--json", json.string()}), env);
  EXPECT_EQ(by_default.exit_code, 0) << by_default.output;
  EXPECT_EQ(error_lines(by_default.err), 0) << by_default.err;
  // Said before the work, and after it.
  const std::size_t before = by_default.err.find("the results will not be added to the history: ");
  const std::size_t after = by_default.err.find("results not added to the history");
  ASSERT_NE(before, std::string::npos) << by_default.err;
  ASSERT_NE(after, std::string::npos) << by_default.err;
  EXPECT_LT(before, after) << by_default.err;
  // A default history with no folder to make.
  std::ofstream(dir_ / "afile") << "x";
  const testing::ProcessOptions in_file{{{"XDG_DATA_HOME", (dir_ / "afile").string()}}};
  auto no_folder = run_dlprobe(with(kBench, {"--json", json.string(), "--overwrite"}), in_file);
  EXPECT_EQ(no_folder.exit_code, 0) << no_folder.output;
  EXPECT_NE(no_folder.err.find("the results will not be added to the history: " +
                               (dir_ / "afile/dlprobe/history.sqlite").string() +
                               ": cannot make its folder in " + (dir_ / "afile").string()),
            std::string::npos)
      << no_folder.err;
  auto results = results::read_file(json);
  ASSERT_TRUE(results) << results.status().message();
  EXPECT_EQ(results->configurations.size(), 1u);
}

}  // namespace
}  // namespace dlprobe
