// `dlprobe run` end to end: the binary runs the fake workload through sweeps, an OOM in the
// middle, a max-batch search, Ctrl-C, --shell with a regex, bad input, and the fake NVML.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/run_dlprobe.h"
#include "dlprobe/results/results.h"
#include "monitor/fake_script.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

struct Outcome {
  int code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class RunCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("dlprobe_run_cli_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // Without a driver here NVML does not load; tests that want telemetry point at the fake.
    unsetenv("DLPROBE_NVML_LIBRARY");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const char* name) const { return (dir_ / name).string(); }

  // Runs dlprobe with `args`; `interrupt_after` sends it SIGINT after that long.
  Outcome dlprobe(std::vector<std::string> args,
                  std::optional<std::chrono::milliseconds> interrupt_after = std::nullopt) {
    const dlprobe::testing::ProcessResult r =
        dlprobe::testing::run_dlprobe(std::move(args), {.interrupt_after = interrupt_after});
    return {r.exit_code, r.out, r.err};
  }

  json results() const { return json::parse(slurp(path("r.json"))); }

  std::filesystem::path dir_;
};

// dlprobe's -v is not taken after `run`: the workload, given without "--", may have a -v of its
// own, and it is refused rather than silently taken from it.
TEST_F(RunCli, AVerboseFlagAfterTheWorkloadIsNotDlprobes) {
  const Outcome o = dlprobe({"run", "--no-history", "echo", "hello", "-v"});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_EQ(o.out.find("hello"), std::string::npos) << o.out;
  EXPECT_NE(o.err.find("-v"), std::string::npos) << o.err;
}

TEST_F(RunCli, SweepGoesOnAfterAnOomInTheMiddle) {
  const auto o = dlprobe({"run", "-q", "--details-json", path("r.json"), "--warmup-steps", "2",
                          "--sweep", "batch=16,64,32", "--", DLPROBE_FAKE_WORKLOAD, "--batch",
                          "{batch}", "--oom-at-batch", "48", "--steps", "8", "--step-ms", "2"});
  EXPECT_EQ(o.code, 1) << o.err;  // one point failed
  const json r = results();
  EXPECT_EQ(r["schema"], "dlprobe.run/1");
  ASSERT_EQ(r["runs"].size(), 3u);
  EXPECT_EQ(r["runs"][0]["outcome"], "ok");
  EXPECT_EQ(r["runs"][1]["outcome"], "oom");
  EXPECT_EQ(r["runs"][1]["oom"]["framework"], "pytorch");
  EXPECT_EQ(r["runs"][2]["outcome"], "ok");
  EXPECT_EQ(r["runs"][2]["params"]["batch"], "32");
  EXPECT_EQ(r["runs"][2]["argv"][2], "32");
  EXPECT_NEAR(r["runs"][2]["throughput"]["items_per_s"].get<double>(), 16000, 1);
  EXPECT_EQ(r["runs"][2]["throughput"]["steps_measured"], 6);
  ASSERT_EQ(r["sweep_findings"].size(), 1u);
  EXPECT_EQ(r["sweep_findings"][0]["id"], "oom_batch");
  EXPECT_NE(o.out.find("batch=64"), std::string::npos);
  EXPECT_NE(o.out.find("oom"), std::string::npos);
}

TEST_F(RunCli, TwoSweepsRunEveryCombinationAndSetEnvironment) {
  const auto o = dlprobe({"run",
                          "-q",
                          "--details-json",
                          path("r.json"),
                          "--sweep",
                          "batch=8,16",
                          "--sweep",
                          "steps=3,4",
                          "--shell",
                          "--",
                          "test",
                          "\"$DLPROBE_BATCH\" = {batch}",
                          "&&",
                          DLPROBE_FAKE_WORKLOAD,
                          "--batch",
                          "{batch}",
                          "--steps",
                          "{steps}",
                          "--step-ms",
                          "1"});
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  ASSERT_EQ(r["runs"].size(), 4u);
  EXPECT_EQ(r["runs"][3]["params"]["batch"], "16");
  EXPECT_EQ(r["runs"][3]["params"]["steps"], "4");
  EXPECT_EQ(r["runs"][3]["throughput"]["steps_seen"], 4);
}

TEST_F(RunCli, MaxBatchBisects) {
  const auto o =
      dlprobe({"run", "-q", "--details-json", path("r.json"), "--max-batch", "--max-batch-start",
               "8", "--max-batch-runs", "12", "--", DLPROBE_FAKE_WORKLOAD, "--batch", "{batch}",
               "--oom-at-batch", "100", "--steps", "3", "--step-ms", "1"});
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  ASSERT_EQ(r["max_batch"].size(), 1u);
  EXPECT_EQ(r["max_batch"][0]["largest_ok"], 99);
  EXPECT_EQ(r["max_batch"][0]["smallest_failed"], 100);
  EXPECT_EQ(r["max_batch"][0]["converged"], true);
  EXPECT_LE(r["runs"].size(), 12u);
  EXPECT_NE(o.out.find("max batch: 99"), std::string::npos);
}

TEST_F(RunCli, MaxBatchBoundedByRuns) {
  const auto o =
      dlprobe({"run", "-q", "--details-json", path("r.json"), "--max-batch", "--max-batch-start",
               "1", "--max-batch-runs", "4", "--", DLPROBE_FAKE_WORKLOAD, "--batch", "{batch}",
               "--steps", "1", "--step-ms", "1"});
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  EXPECT_EQ(r["runs"].size(), 4u);
  EXPECT_EQ(r["max_batch"][0]["largest_ok"], 8);
  EXPECT_EQ(r["max_batch"][0]["converged"], false);
  EXPECT_EQ(r["max_batch"][0]["note"], "--max-batch-runs reached");
}

TEST_F(RunCli, CtrlCStopsTheWorkloadAndKeepsResults) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto o =
      dlprobe({"run", "-q", "--details-json", path("r.json"), "--sweep", "batch=4,8", "--",
               DLPROBE_FAKE_WORKLOAD, "--batch", "{batch}", "--steps", "3", "--hang"},
              1500ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 8s);
  EXPECT_EQ(o.code, 1) << o.err;
  const json r = results();
  EXPECT_EQ(r["interrupted"], true);
  ASSERT_EQ(r["runs"].size(), 1u);  // the second point never starts
  EXPECT_EQ(r["runs"][0]["outcome"], "interrupted");
  EXPECT_EQ(r["runs"][0]["signal"], SIGINT);
  EXPECT_EQ(r["runs"][0]["throughput"]["steps_seen"], 3);
  EXPECT_NE(o.out.find("interrupted"), std::string::npos);
}

TEST_F(RunCli, TimeoutAndLogDir) {
  const auto o = dlprobe({"run", "-q", "--details-json", path("r.json"), "--timeout", "500ms",
                          "--kill-grace", "200ms", "--log-dir", path("logs"), "--",
                          DLPROBE_FAKE_WORKLOAD, "--steps", "2", "--hang"});
  EXPECT_EQ(o.code, 1);
  const json r = results();
  EXPECT_EQ(r["runs"][0]["outcome"], "timeout");
  EXPECT_EQ(r["runs"][0]["signal"], SIGTERM);
  const std::string log = r["runs"][0]["logs"]["stdout"];
  EXPECT_NE(slurp(log).find("\"step\": 1"), std::string::npos);
}

TEST_F(RunCli, ShellPipelineWithThroughputRegex) {
  const std::string cmd =
      std::string(DLPROBE_FAKE_WORKLOAD) + " --regex --batch 10 --steps 6 --step-ms 2 | cat";
  const auto o = dlprobe({"run", "-q", "--details-json", path("r.json"), "--shell",
                          "--throughput-regex", "(?<ips>[0-9.]+) img/s", "--", cmd});
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  EXPECT_NEAR(r["runs"][0]["throughput"]["items_per_s"].get<double>(), 5000, 1);
  EXPECT_EQ(r["runs"][0]["throughput"]["source"], "regex");
  EXPECT_EQ(r["runs"][0]["argv"][0], "/bin/sh");
}

TEST_F(RunCli, PassesOutputThrough) {
  const auto o = dlprobe({"run", "--", DLPROBE_FAKE_WORKLOAD, "--steps", "5", "--batch", "3",
                          "--oom-at-batch", "1", "--oom-style", "tf"});
  EXPECT_EQ(o.code, 1);
  EXPECT_NE(o.err.find("OOM when allocating tensor"), std::string::npos);
}

TEST_F(RunCli, GpuMemoryFromTheFakeNvml) {
  const std::string procs = path("procs");
  std::ofstream(procs) << "";
  dlprobe::testing::FakeScript script(
      "device\nname NVIDIA H200\nmemory_total 150754820096\n"
      "gpu_util 90\nmem_util 30\nmem_used 4294967296\n"
      "process_file " +
      procs + "\n");
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  const auto o = dlprobe({"run", "-q", "--details-json", path("r.json"), "-i", "20ms", "--",
                          DLPROBE_FAKE_WORKLOAD, "--child", "--steps", "10", "--step-ms", "20",
                          "--gpu-file", procs, "--gpu-bytes", "3221225472"});
  unsetenv("DLPROBE_NVML_LIBRARY");
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  const json& gpu = r["runs"][0]["gpu"];
  EXPECT_EQ(gpu["telemetry"], true);
  EXPECT_EQ(gpu["attribution"], "process_tree");
  EXPECT_EQ(gpu["peak_bytes"], 3221225472u);
  EXPECT_EQ(gpu["name"], "NVIDIA H200");
  EXPECT_NE(o.out.find("3072"), std::string::npos);  // MiB in the table
}

TEST_F(RunCli, ResultsFileInTheSharedSchema) {
  const std::string procs = path("procs");
  std::ofstream(procs) << "";
  dlprobe::testing::FakeScript script(
      "device\nname NVIDIA H200\nmemory_total 150754820096\n"
      "gpu_util 90\nmem_util 30\nmem_used 4294967296\n"
      "sm_clock 1980\nclock_events 0x4\nprocess_file " +
      procs + "\n");
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  const auto o = dlprobe({"run",
                          "-q",
                          "--json",
                          path("results.json"),
                          "-i",
                          "20ms",
                          "--warmup-steps",
                          "2",
                          "--sweep",
                          "batch=16,64,32",
                          "--",
                          DLPROBE_FAKE_WORKLOAD,
                          "--batch",
                          "{batch}",
                          "--oom-at-batch",
                          "48",
                          "--steps",
                          "10",
                          "--step-ms",
                          "10",
                          "--gpu-file",
                          procs,
                          "--gpu-bytes",
                          "1073741824"});
  unsetenv("DLPROBE_NVML_LIBRARY");
  EXPECT_EQ(o.code, 1) << o.err;
  // The strict reader of the report branch accepts it.
  auto doc = dlprobe::results::read_file(path("results.json"));
  ASSERT_TRUE(doc) << doc.status().message();
  EXPECT_EQ(doc->context.gpus.size(), 1u);
  EXPECT_EQ(doc->context.command_line.at(1), "run");
  // The libraries doctor probes, as bench records them: one machine and stack reads alike.
  EXPECT_FALSE(doc->context.libraries.empty());
  ASSERT_EQ(doc->configurations.size(), 3u);
  const auto& ok = doc->configurations[0];
  EXPECT_EQ(ok.kind, dlprobe::results::Kind::external);
  EXPECT_EQ(ok.settings.sweep.at("batch"), "16");
  EXPECT_EQ(ok.status, dlprobe::results::RunStatus::ok);
  ASSERT_TRUE(ok.statistics);
  EXPECT_EQ(ok.statistics->steps, 8u);
  EXPECT_NEAR(ok.statistics->throughput, 1600, 1);
  EXPECT_EQ(ok.samples.warmup_steps, 2);
  ASSERT_TRUE(ok.memory);
  EXPECT_EQ(ok.memory->source, "framework");
  EXPECT_EQ(ok.memory->framework_peak_allocated_bytes, 16 << 20);
  EXPECT_EQ(ok.memory->nvml_process_peak_bytes, 1073741824);
  ASSERT_EQ(ok.telemetry.size(), 1u);
  EXPECT_EQ(ok.telemetry[0].throttle_reasons, std::vector<std::string>{"sw_power_cap"});
  EXPECT_EQ(doc->configurations[1].status, dlprobe::results::RunStatus::oom);
  EXPECT_NE(doc->configurations[1].error.find("CUDA out of memory"), std::string::npos);
  ASSERT_FALSE(doc->findings.empty());
  EXPECT_EQ(doc->findings[0].id, "oom_batch");
}

// A start-up of a second (a framework compiling) while the GPU idles, then steps at 90 %: the
// results' telemetry summary is the steps' (as the findings are), and the time line the whole
// run's.
TEST_F(RunCli, TelemetrySummaryCoversTheMeasuredSteps) {
  const std::string procs = path("procs");
  std::ofstream(procs) << "";
  dlprobe::testing::FakeScript script(
      "device\nname NVIDIA H200\nmemory_total 150754820096\n"
      "gpu_util 0 0 0 0 0 0 0 0 0 0 90\nmem_util 30\nmem_used 4294967296\nprocess_file " +
      procs + "\n");
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  const auto o = dlprobe({"run", "-q", "--json", path("results.json"), "-i", "20ms", "--",
                          DLPROBE_FAKE_WORKLOAD, "--spin-ms", "1000", "--steps", "10", "--step-ms",
                          "20", "--gpu-file", procs, "--gpu-bytes", "1073741824"});
  unsetenv("DLPROBE_NVML_LIBRARY");
  ASSERT_EQ(o.code, 0) << o.err;
  auto doc = dlprobe::results::read_file(path("results.json"));
  ASSERT_TRUE(doc) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  ASSERT_EQ(doc->configurations[0].telemetry.size(), 1u);
  const dlprobe::results::Telemetry& t = doc->configurations[0].telemetry[0];
  ASSERT_TRUE(t.gpu_util_pct);
  EXPECT_DOUBLE_EQ(t.gpu_util_pct->min, 90);  // none of the idle start-up's readings
  EXPECT_DOUBLE_EQ(t.gpu_util_pct->median, 90);
  EXPECT_LT(t.window_s, 0.9);  // the steps took 0.2 s; the run over 1 s
  EXPECT_EQ(t.samples, t.gpu_util_pct->count);
  ASSERT_FALSE(t.timeline.empty());
  EXPECT_LT(t.samples, t.timeline.size());
  EXPECT_DOUBLE_EQ(*t.timeline.front().gpu_util_pct, 0);
}

// Two GPUs, the workload on GPU 0 at 90 % and 300 W, GPU 1 idle at 70 W with a lower clock and a
// power cap: the results' telemetry is GPU 0's alone, and its "idle" clock event (a GPU waiting for
// input) is no throttling.
TEST_F(RunCli, TelemetryIsEachUsedGpusOwn) {
  const std::string procs = path("procs");
  std::ofstream(procs) << "";
  dlprobe::testing::FakeScript script(
      "device\nname NVIDIA H200\nmemory_total 150754820096\ngpu_util 90\nmem_util 40\n"
      "power_mw 300000\nsm_clock 1980\nmem_clock 3201\ntemperature 60\nmem_used 4294967296\n"
      "clock_events 0x1\nprocess_file " +
      procs +
      "\ndevice\nname NVIDIA H200\nmemory_total 150754820096\ngpu_util 0\nmem_util 0\n"
      "power_mw 70000\nsm_clock 345\nmem_clock 1593\ntemperature 80\nmem_used 1073741824\n"
      "clock_events 0x4\n");
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  const auto o = dlprobe({"run", "-q", "--json", path("results.json"), "-i", "20ms", "--",
                          DLPROBE_FAKE_WORKLOAD, "--steps", "10", "--step-ms", "20", "--gpu-file",
                          procs, "--gpu-bytes", "1073741824"});
  unsetenv("DLPROBE_NVML_LIBRARY");
  ASSERT_EQ(o.code, 0) << o.err;
  auto doc = dlprobe::results::read_file(path("results.json"));
  ASSERT_TRUE(doc) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  ASSERT_EQ(doc->configurations[0].telemetry.size(), 1u);
  const dlprobe::results::Telemetry& t = doc->configurations[0].telemetry[0];
  EXPECT_EQ(t.gpu, 0);
  ASSERT_TRUE(t.gpu_util_pct);
  ASSERT_TRUE(t.power_w);
  ASSERT_TRUE(t.sm_clock_mhz);
  ASSERT_TRUE(t.temperature_c);
  ASSERT_TRUE(t.mem_used_mib);
  ASSERT_TRUE(t.mem_util_pct);
  ASSERT_TRUE(t.mem_clock_mhz);
  EXPECT_DOUBLE_EQ(t.gpu_util_pct->median, 90);
  EXPECT_DOUBLE_EQ(t.mem_util_pct->median, 40);
  EXPECT_DOUBLE_EQ(t.mem_clock_mhz->max, 3201);
  EXPECT_DOUBLE_EQ(t.power_w->median, 300);
  EXPECT_DOUBLE_EQ(t.sm_clock_mhz->min, 1980);
  EXPECT_DOUBLE_EQ(t.temperature_c->max, 60);
  EXPECT_DOUBLE_EQ(t.mem_used_mib->median, 4096);
  EXPECT_TRUE(t.throttle_reasons.empty());
  ASSERT_FALSE(t.timeline.empty());
  EXPECT_DOUBLE_EQ(*t.timeline.front().power_w, 300);
}

TEST_F(RunCli, InvalidUtf8InTheOutputStillWritesResults) {
  const auto o = dlprobe({"run", "-q", "--json", path("results.json"), "--shell", "--",
                          "printf 'RuntimeError: CUDA out of memory \\377\\376\\n' >&2; exit 1"});
  EXPECT_EQ(o.code, 1) << o.err;
  auto doc = dlprobe::results::read_file(path("results.json"));
  ASSERT_TRUE(doc) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  EXPECT_EQ(doc->configurations[0].status, dlprobe::results::RunStatus::oom);
  EXPECT_NE(doc->configurations[0].error.find("CUDA out of memory"), std::string::npos);
}

// libstdc++'s std::regex recursed once per character of a line and overflowed the stack.
TEST_F(RunCli, HugeOutputLinesStillWriteResults) {
  const auto o = dlprobe({"run", "-q", "--json", path("results.json"), "--throughput-regex",
                          "(?<ips>[0-9.]+) img/s", "--shell", "--",
                          "head -c 300000 /dev/zero | tr '\\0' a; echo; "
                          "head -c 300000 /dev/zero | tr '\\0' 7; echo"});
  EXPECT_EQ(o.code, 0) << o.err;
  auto doc = dlprobe::results::read_file(path("results.json"));
  ASSERT_TRUE(doc) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  EXPECT_EQ(doc->configurations[0].status, dlprobe::results::RunStatus::ok);
}

// `dlprobe run ... | head -1`: our stdout closes while the workload runs. dlprobe must not die
// of SIGPIPE; it measures the workload to its end and writes the results.
TEST_F(RunCli, ClosedStdoutKeepsMeasuring) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string done = path("done");
  std::vector<std::string> args = {DLPROBE_BINARY,
                                   "run",
                                   "--json",
                                   path("results.json"),
                                   "--shell",
                                   "--",
                                   "echo 1; sleep 0.5; echo 2; sleep 0.5; echo 3; touch " + done};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    freopen(path("stderr.txt").c_str(), "w", stderr);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  // As `head -1`: read the first line, then go away.
  char c = 0;
  while (read(fds[0], &c, 1) == 1 && c != '\n') {
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  EXPECT_EQ(code, 0) << slurp(path("stderr.txt"));
  EXPECT_TRUE(std::filesystem::exists(done));
  auto doc = dlprobe::results::read_file(path("results.json"));
  ASSERT_TRUE(doc) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  EXPECT_EQ(doc->configurations[0].status, dlprobe::results::RunStatus::ok);
}

// An output file that cannot be written is refused before the workload starts, not after it ran.
TEST_F(RunCli, UnwritableDetailsAreRefusedBeforeTheWorkloadRuns) {
  const std::string ran = path("ran");
  const auto o =
      dlprobe({"run", "--details-json", path("missing/d.json"), "--", "sh", "-c", "touch " + ran});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("--details-json: " + path("missing/d.json") + ": cannot write there"),
            std::string::npos)
      << o.err;
  EXPECT_FALSE(std::filesystem::exists(ran));
  const auto folder = dlprobe({"run", "--details-json", dir_.string(), "--", "true"});
  EXPECT_EQ(folder.code, 2) << folder.err;
  EXPECT_NE(folder.err.find("is a folder"), std::string::npos) << folder.err;
}

// The search's bounds without the search would be ignored, and the user would believe it ran.
TEST_F(RunCli, MaxBatchBoundsWithoutMaxBatchAreRefused) {
  const std::string ran = path("ran");
  for (const char* flag :
       {"--max-batch-start", "--max-batch-limit", "--max-batch-step", "--max-batch-runs"}) {
    const auto o = dlprobe({"run", flag, "8", "--", "touch", ran});
    EXPECT_EQ(o.code, 2) << flag;
    EXPECT_EQ(o.err, std::string("dlprobe: error: ") + flag + ": only with --max-batch\n");
  }
  EXPECT_FALSE(std::filesystem::exists(ran));
}

TEST_F(RunCli, BadInputIsOneLineAndExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {"run"},
      {"run", "--timeout", "5", "--", "true"},
      {"run", "--sweep", "batch=1,2", "--", "true"},
      {"run", "--sweep", "batch", "--", "true", "{batch}"},
      {"run", "--max-batch", "--", "true"},
      {"run", "--throughput-regex", "no group", "--", "true"},
      {"run", "--throughput-regex", "([0-9]+ img/s", "--", "true"},
      {"run", "--copies", "0", "--", "true"},
      {"run", "--copies", "2", "--sweep", "batch=1,2", "--", "true", "{batch}"},
      {"run", "--memory-limit", "lots", "--", "true"},
      {"run", "--warmup-steps", "-1", "--", "true"},
      {"run", "--", "/nonexistent/dlprobe-nothing"},
  };
  for (const auto& args : cases) {
    const auto o = dlprobe(args);
    EXPECT_EQ(o.code, 2) << args.size() << " " << o.err;
    EXPECT_NE(o.err.find("dlprobe: error:"), std::string::npos) << o.err;
    // One line says what is wrong: no second error, no usage text.
    EXPECT_EQ(o.err.find("dlprobe: error:"), o.err.rfind("dlprobe: error:")) << o.err;
    EXPECT_EQ(o.err.find('\n', o.err.find("dlprobe: error:")) + 1, o.err.size()) << o.err;
  }
  // Refused before the workload starts: nothing echoed, no results file begun.
  const auto o = dlprobe({"run", "-i", "5ms", "--json", path("early.json"), "--", "true"});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_EQ(o.err, "dlprobe: error: --interval: '5ms' is below the minimum of 10ms\n");
  EXPECT_FALSE(std::filesystem::exists(path("early.json")));
}

// A script in the seed's form: no step lines, its throughput in "Throughput: X samples/sec" at the
// end, read without a regex; the details say which window the figures cover.
TEST_F(RunCli, SeedFormThroughputWithoutARegex) {
  const auto o =
      dlprobe({"run", "-q", "--details-json", path("r.json"), "--", DLPROBE_FAKE_WORKLOAD, "--seed",
               "--steps", "10", "--step-ms", "5", "--batch", "16"});
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  EXPECT_NEAR(r["runs"][0]["throughput"]["items_per_s"].get<double>(), 3200.0, 0.01);
  EXPECT_EQ(r["runs"][0]["throughput"]["source"], "printed: throughput");
  EXPECT_EQ(r["runs"][0]["throughput"]["batch"], 16);
  EXPECT_TRUE(r["runs"][0]["window"].contains("source"));
}

TEST_F(RunCli, CopiesRunTogether) {
  const auto o =
      dlprobe({"run", "-q", "--copies", "2", "--details-json", path("r.json"), "--",
               DLPROBE_FAKE_WORKLOAD, "--steps", "8", "--step-ms", "5", "--batch", "{copy}"});
  EXPECT_EQ(o.code, 0) << o.err;
  const json r = results();
  EXPECT_EQ(r["copies"], 2);
  ASSERT_EQ(r["runs"].size(), 2u);
  EXPECT_EQ(r["runs"][1]["params"]["copy"], "2");
  EXPECT_EQ(r["runs"][1]["throughput"]["batch"], 2);
  ASSERT_FALSE(r["sweep_findings"].empty());
  EXPECT_EQ(r["sweep_findings"][0]["id"], "shared_gpu");
  EXPECT_NE(o.out.find("copy=2"), std::string::npos) << o.out;
}

}  // namespace
