// Every command's output files under one rule, as a user meets it: an earlier file is replaced
// only with --overwrite (and then keeps its permissions, and a link to it stays a link), two
// outputs naming one file are refused, and "-" is standard output; each refusal is one line, given
// before any work.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"
#include "dlprobe/results/results.h"

namespace dlprobe {
namespace {

namespace fs = std::filesystem;

const std::string kBench =
    "bench --device cpu --model resnet18 --width 16 --image-size 32 --classes 10 --batch 2 "
    "--mode infer --steps 1 --min-time 0s --warmup 0 --warmup-time 0s --no-ceiling -q";
const std::string kMemory =
    "memory --predict-only --model resnet18 --width 16 --image-size 32 --classes 10 --batch 2";
// Refused before the files are read, so they need not exist.
const std::string kStep = "step --device cpu --weights w.safetensors --input i.safetensors";
const std::string kEarlier = "earlier results\n";

using testing::slurp;

unsigned mode_of(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

struct Ran {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class OutputsCli : public ::testing::Test {
 protected:
  // dlprobe with `args` on a machine without GPU.
  static Ran run(const std::string& args) {
    testing::ProcessOptions options;
    options.env = {{"CUDA_VISIBLE_DEVICES", "-1"},
                   {"DLPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}};
    const testing::ProcessResult r = testing::run_dlprobe(testing::split_args(args), options);
    return {r.exit_code, r.out, r.err};
  }
  std::string earlier(const std::string& name) const {
    std::ofstream(dir_ / name) << kEarlier;
    return (dir_ / name).string();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  testing::TempFolder dir_;
};

TEST_F(OutputsCli, EveryCommandRefusesToReplaceAnEarlierFile) {
  const std::string f = earlier("earlier.out");
  const std::string html = earlier("earlier.html");
  std::ofstream(dir_ / "input.json") << results::serialize(results::Document{});
  fs::create_directories(dir_ / "evaluate");
  const std::string evaluated = earlier("evaluate/results.json");
  const std::pair<std::string, std::string> cases[] = {
      {"doctor --no-ceilings -o " + f, "--output: " + f},
      {kBench + " --json " + f, "--json: " + f},
      {kBench + " --csv " + f, "--csv: " + f},
      {kBench + " --md " + f, "--md: " + f},
      {kMemory + " --json " + f, "--json: " + f},
      {"run --json " + f + " -- touch " + path("ran"), "--json: " + f},
      {"run --details-json " + f + " -- touch " + path("ran"), "--details-json: " + f},
      {kStep + " --output " + f, "--output: " + f},
      {kStep + " --output " + path("o.safetensors") + " --state-output " + f,
       "--state-output: " + f},
      {"monitor --count 1 --csv " + f, "--csv: " + f},
      {"monitor --count 1 --jsonl " + f, "--jsonl: " + f},
      {"report " + path("input.json") + " -o " + html, "-o: " + html},
      {"evaluate --quick --device cpu --out " + path("evaluate"), "--output: " + evaluated},
      {"pipeline " + path("no_dataset") + " --json " + f, "--json: " + f},
  };
  for (const auto& [args, named] : cases) {
    const Ran r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.err,
              "dlprobe: error: " + named + ": exists and is not empty (--overwrite replaces it)\n")
        << args;
    EXPECT_EQ(r.out, "") << args;
  }
  for (const std::string& file : {f, html, evaluated}) EXPECT_EQ(slurp(file), kEarlier) << file;
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
  EXPECT_FALSE(fs::exists(dir_ / "o.safetensors"));
}

// --overwrite or not: the history a run adds to, the weights or tuning cache it reads, a results
// file it reports.
TEST_F(OutputsCli, AnOutputOverAFileTheCommandReadsIsRefused) {
  const std::string held = earlier("held.sqlite");
  const std::string html = earlier("held.html");
  fs::create_directories(dir_ / "evaluate");
  const std::string evaluated = earlier("evaluate/results.json");
  const std::string reads = ": the output would replace what the command reads";
  const std::pair<std::string, std::string> cases[] = {
      {kBench + " --json " + held + " --history " + held, "--history and --json both name " + held},
      {kBench + " --md " + held + " --weights " + held, "--weights and --md both name " + held},
      {kBench + " --csv " + held + " --tuning-cache " + held,
       "--tuning-cache and --csv both name " + held},
      {kMemory + " --json " + held + " --history " + held,
       "--history and --json both name " + held},
      {"run --json " + held + " --history " + held + " -- touch " + path("ran"),
       "--history and --json both name " + held},
      {"report --history " + html + " -o " + html, "--history and -o both name " + html},
      {"report " + html + " -o " + html, "the results file and -o both name " + html},
      {"history --history " + html + " trend --html " + html,
       "--history and --html both name " + html},
      {"history --history " + html + " --config " + held + " trend --html " + held,
       "--config and --html both name " + held},
      {"evaluate --quick --device cpu --out " + path("evaluate") + " --history " +
           path("evaluate/report.html"),
       "--output: --history and report.html both name " + path("evaluate/report.html")},
  };
  for (const auto& [args, message] : cases) {
    const Ran r = run(args + " --overwrite");
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.err, "dlprobe: error: " + message + reads + "\n") << args;
  }
  for (const std::string& file : {held, html, evaluated}) EXPECT_EQ(slurp(file), kEarlier) << file;
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
}

TEST_F(OutputsCli, TwoOutputsNamingOneFileAreRefused) {
  const std::string x = path("x.out");
  const std::string dotted = path("./x.out");
  fs::create_symlink("x.out", dir_ / "link.out");
  const std::string link = path("link.out");
  std::ofstream(dir_ / "empty.out").flush();
  fs::create_hard_link(dir_ / "empty.out", dir_ / "hard.out");
  const std::pair<std::string, std::string> cases[] = {
      {kBench + " --json " + x + " --csv " + x, "--json and --csv both name " + x},
      {kBench + " --json " + x + " --md " + dotted, "--json and --md both name " + dotted},
      {kBench + " --csv " + x + " --md " + link, "--csv and --md both name " + link},
      {kBench + " --json " + path("empty.out") + " --csv " + path("hard.out"),
       "--json and --csv both name " + path("hard.out")},
      {"run --json " + x + " --details-json " + x + " -- touch " + path("ran"),
       "--json and --details-json both name " + x},
      {kStep + " --output " + x + " --state-output " + link,
       "--output and --state-output both name " + link},
      {"monitor --count 1 --csv " + x + " --jsonl " + link, "--csv and --jsonl both name " + link},
  };
  for (const auto& [args, message] : cases) {
    const Ran r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.err, "dlprobe: error: " + message + ": give each a file of its own\n") << args;
  }
  const Ran both = run(kBench + " --json - --csv -");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_EQ(both.err,
            "dlprobe: error: --json and --csv cannot both write to standard output ('-')\n");
  EXPECT_EQ(both.out, "");
  EXPECT_FALSE(fs::exists(x));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(dir_ / "empty.out"), "");
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
}

TEST_F(OutputsCli, DashIsStandardOutputAndTheRestGoesToStderr) {
  const Ran doctor = run("doctor --no-ceilings --json -o -");
  ASSERT_EQ(doctor.exit_code, 0) << doctor.err;
  EXPECT_EQ(nlohmann::json::parse(doctor.out)["schema"], "dlprobe.doctor/1");

  const Ran memory = run(kMemory + " --json -");
  ASSERT_EQ(memory.exit_code, 0) << memory.err;
  const Result<results::Document> predicted = results::parse(memory.out);
  EXPECT_TRUE(predicted.has_value()) << predicted.status().message() << "\n" << memory.out;
  EXPECT_NE(memory.err.find("predicted"), std::string::npos) << memory.err;

  const Ran bench = run(kBench + " --json -");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const Result<results::Document> measured = results::parse(bench.out);
  ASSERT_TRUE(measured.has_value()) << measured.status().message() << "\n" << bench.out;
  EXPECT_EQ(measured->configurations.size(), 1u);
  EXPECT_NE(bench.err.find("throughput"), std::string::npos) << bench.err;

  const Ran ran = run("run -q --details-json - -- true");
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_EQ(nlohmann::json::parse(ran.out)["schema"], "dlprobe.run/1");

  // The report's format comes from the file's extension, which standard output has not; and
  // evaluate writes a folder.
  std::ofstream(dir_ / "input.json") << results::serialize(results::Document{});
  const Ran report = run("report " + path("input.json") + " -o -");
  EXPECT_EQ(report.exit_code, 2);
  EXPECT_EQ(testing::error_lines(report.err), 1) << report.err;
  EXPECT_NE(report.err.find("-o -: "), std::string::npos) << report.err;
  const Ran evaluate = run("evaluate --quick --device cpu --out -");
  EXPECT_EQ(evaluate.exit_code, 2);
  EXPECT_EQ(testing::error_lines(evaluate.err), 1) << evaluate.err;
  EXPECT_NE(evaluate.err.find("--output -: "), std::string::npos) << evaluate.err;

  EXPECT_FALSE(fs::exists("-"));  // where dlprobe ran
}

// What a command prints on standard output is its result too (the memory table, doctor's JSON):
// when that write fails, as on a full disk, the exit status must not say it was delivered.
TEST_F(OutputsCli, AFailedWriteToStandardOutputIsAnError) {
  for (const std::string& args : {kMemory, std::string("doctor --no-ceilings --json")}) {
    std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" > /dev/full",
                                     DLPROBE_BINARY};
    for (std::string& word : testing::split_args(args)) argv.push_back(std::move(word));
    testing::ProcessOptions options;
    options.env = {{"CUDA_VISIBLE_DEVICES", "-1"},
                   {"DLPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}};
    const testing::ProcessResult r = testing::run_process(argv, options);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_EQ(testing::error_lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("standard output: cannot write: "), std::string::npos) << r.err;
  }
}

TEST_F(OutputsCli, OverwriteReplacesTheFileALinkNamesAndKeepsItsPermissions) {
  const std::string kept = earlier("kept.json");
  fs::permissions(kept, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_symlink("kept.json", dir_ / "link.json");
  const Ran r = run(kMemory + " --overwrite --json " + path("link.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.json"));
  EXPECT_TRUE(results::read_file(kept).has_value()) << slurp(kept);
  EXPECT_EQ(mode_of(kept), 0600u);

  // A new file gets what the umask leaves of 0666, as any program's.
  const mode_t before = ::umask(002);
  const Ran fresh = run(kMemory + " --json " + path("new.json"));
  ::umask(before);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(mode_of(dir_ / "new.json"), 0664u);
}

}  // namespace
}  // namespace dlprobe
