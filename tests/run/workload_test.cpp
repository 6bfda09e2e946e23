// run_workload against the fake workload: output and protocol, the process tree, OOM in three
// frameworks' words, exits and signals, timeout, hang, Ctrl-C, and GPU memory attribution through
// the fake NVML (whose process list a test rewrites with pids it learns while the run goes).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "dlprobe/core/process_env.h"
#include "dlprobe/run/runner.h"
#include "dlprobe/run/session.h"
#include "monitor/fake_script.h"

namespace dlprobe::run {
namespace {

using namespace std::chrono_literals;

RunOptions options(std::vector<std::string> args) {
  RunOptions o;
  o.argv = {DLPROBE_FAKE_WORKLOAD};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.echo = false;
  o.interval = 20ms;
  o.kill_grace = 300ms;
  return o;
}

RunResult run_ok(const RunOptions& o) {
  auto r = run_workload(o);
  EXPECT_TRUE(r) << r.status().message();
  return r ? std::move(r).value() : RunResult{};
}

bool has_finding(const RunResult& r, std::string_view id) {
  for (const auto& f : r.findings) {
    if (f.id == id) return true;
  }
  return false;
}

std::string temp_path(const char* stem) {
  return ::testing::TempDir() + stem + std::to_string(getpid());
}

TEST(RunWorkload, ProtocolStepsAndThroughput) {
  auto o = options({"--steps", "12", "--step-ms", "4", "--data-ms", "1", "--batch", "32"});
  o.warmup_steps = 2;
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.outcome, Outcome::ok);
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_TRUE(r.end_marker);
  EXPECT_EQ(r.steps.steps_seen, 12);
  EXPECT_EQ(r.steps.steps_measured, 10);
  ASSERT_TRUE(r.steps.items_per_s);
  // Step times come from the workload's own figures: 32 items per 5 ms.
  EXPECT_NEAR(*r.steps.items_per_s, 6400, 1);
  EXPECT_NEAR(*r.steps.data_wait_share, 0.2, 1e-6);
  EXPECT_TRUE(has_finding(r, "input_bound"));
  EXPECT_EQ(r.framework.peak_bytes, 32u << 20);
  EXPECT_EQ(r.steps.batch, 32);
  EXPECT_FALSE(r.gpu.telemetry);
  EXPECT_TRUE(has_finding(r, "no_gpu_telemetry"));
  EXPECT_EQ(r.stdout_tail.size(), 13u);  // 12 steps and the end marker
}

TEST(RunWorkload, RegexThroughput) {
  auto o = options({"--regex", "--steps", "8", "--batch", "10", "--step-ms", "2"});
  auto re = ThroughputRegex::compile(R"(: (?<ips>[0-9.]+) img/s)");
  ASSERT_TRUE(re);
  o.throughput_regex = std::move(re).value();
  const RunResult r = run_ok(o);
  ASSERT_TRUE(r.steps.items_per_s);
  EXPECT_NEAR(*r.steps.items_per_s, 5000, 1);
  EXPECT_EQ(r.steps.throughput_source, "regex");
}

TEST(RunWorkload, FollowsChildrenAndHostMemory) {
  const RunResult r =
      run_ok(options({"--child", "--alloc-mib", "64", "--steps", "15", "--step-ms", "20"}));
  EXPECT_EQ(r.outcome, Outcome::ok);
  EXPECT_GE(r.host.max_processes, 2u);
  EXPECT_GE(r.host.rss_peak_bytes, 64ull << 20);
  EXPECT_GT(r.host.cores, 0u);
  EXPECT_EQ(r.steps.steps_seen, 15);
}

TEST(RunWorkload, KeepsLogFiles) {
  auto o = options({"--steps", "3", "--step-ms", "1"});
  o.stdout_log = temp_path("out.log");
  o.stderr_log = temp_path("err.log");
  run_ok(o);
  std::ifstream in(o.stdout_log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"step\": 2"), std::string::npos);
  EXPECT_NE(text.str().find("\"end\": true"), std::string::npos);
  std::remove(o.stdout_log.c_str());
  std::remove(o.stderr_log.c_str());
}

TEST(RunWorkload, OutOfMemoryInEachFramework) {
  const std::pair<const char*, Framework> styles[] = {
      {"pytorch", Framework::pytorch}, {"tf", Framework::tensorflow}, {"jax", Framework::jax}};
  for (const auto& [style, framework] : styles) {
    const RunResult r =
        run_ok(options({"--batch", "512", "--oom-at-batch", "256", "--oom-style", style}));
    EXPECT_EQ(r.outcome, Outcome::oom) << style;
    ASSERT_TRUE(r.oom) << style;
    EXPECT_EQ(r.oom->framework, framework) << style;
    EXPECT_EQ(r.exit.exit_code, 1);
    EXPECT_EQ(r.steps.steps_seen, 2);
    EXPECT_TRUE(has_finding(r, "oom")) << style;
    EXPECT_TRUE(r.error_line) << style;
  }
}

TEST(RunWorkload, OutOfMemoryThroughTheProtocol) {
  const RunResult r =
      run_ok(options({"--batch", "512", "--oom-at-batch", "256", "--oom-protocol"}));
  EXPECT_EQ(r.outcome, Outcome::oom);
  ASSERT_TRUE(r.oom);
  EXPECT_EQ(r.oom->framework, Framework::pytorch);
}

TEST(RunWorkload, ExitStatusAndSignal) {
  const RunResult failed = run_ok(options({"--steps", "2", "--exit", "3"}));
  EXPECT_EQ(failed.outcome, Outcome::failed);
  EXPECT_EQ(failed.exit.exit_code, 3);
  EXPECT_TRUE(has_finding(failed, "failed"));
  EXPECT_FALSE(has_finding(failed, "crashed"));

  const RunResult killed = run_ok(options({"--steps", "2", "--signal", "15"}));
  EXPECT_EQ(killed.outcome, Outcome::crashed);
  EXPECT_EQ(killed.exit.signal, SIGTERM);
  EXPECT_EQ(describe_exit(killed.exit), "signal 15 (SIGTERM)");
  EXPECT_TRUE(has_finding(killed, "crashed"));
}

// NVLink multicast stays off in the workload unless the user chose otherwise.
TEST(RunWorkload, ChildSeesNvlsOffUnlessTheUserSetIt) {
  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  const std::string saved = before != nullptr ? before : "";
  RunOptions o = options({});
  o.argv = {"sh", "-c", "echo nvls=${NCCL_NVLS_ENABLE-unset}"};
  unsetenv("NCCL_NVLS_ENABLE");
  RunResult r = run_ok(o);
  ASSERT_FALSE(r.stdout_tail.empty());
  EXPECT_EQ(r.stdout_tail.front(), "nvls=0");

  setenv("NCCL_NVLS_ENABLE", "1", 1);
  r = run_ok(o);
  ASSERT_FALSE(r.stdout_tail.empty());
  EXPECT_EQ(r.stdout_tail.front(), "nvls=1");
  unsetenv("NCCL_NVLS_ENABLE");

  o.env_set["NCCL_NVLS_ENABLE"] = "2";  // --env NCCL_NVLS_ENABLE=2
  r = run_ok(o);
  ASSERT_FALSE(r.stdout_tail.empty());
  EXPECT_EQ(r.stdout_tail.front(), "nvls=2");
  if (before != nullptr) setenv("NCCL_NVLS_ENABLE", saved.c_str(), 1);
}

// What dlprobe sets for its own GPU work (CUDA_DEVICE_MAX_CONNECTIONS where it decodes on the
// GPU) stays out of the workload's environment; --env still sets it.
TEST(RunWorkload, ChildGoesWithoutWhatDlprobeSetForItself) {
  ASSERT_TRUE(set_default_env("DLPROBE_TEST_OWN_SETTING", "32"));
  RunOptions o = options({});
  o.argv = {"sh", "-c", "echo own=${DLPROBE_TEST_OWN_SETTING-unset}"};
  RunResult r = run_ok(o);
  ASSERT_FALSE(r.stdout_tail.empty());
  EXPECT_EQ(r.stdout_tail.front(), "own=unset");

  o.env_set["DLPROBE_TEST_OWN_SETTING"] = "5";
  r = run_ok(o);
  ASSERT_FALSE(r.stdout_tail.empty());
  EXPECT_EQ(r.stdout_tail.front(), "own=5");
}

TEST(RunWorkload, LaunchError) {
  RunOptions o = options({});
  o.argv = {"/nonexistent/dlprobe-no-such-program"};
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.outcome, Outcome::launch_error);
  EXPECT_NE(r.launch_error.find("cannot execute"), std::string::npos);
}

TEST(RunWorkload, TimeoutStopsTheWholeTree) {
  auto o = options({"--child", "--steps", "2", "--hang"});
  o.timeout = 1s;
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run_ok(o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(r.outcome, Outcome::timeout);
  EXPECT_EQ(r.steps.steps_seen, 2);
  EXPECT_TRUE(has_finding(r, "timeout"));
}

TEST(RunWorkload, HangWithoutOutput) {
  auto o = options({"--steps", "2", "--hang"});
  o.hang_after = 700ms;
  o.timeout = 8s;
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.outcome, Outcome::hang);
  ASSERT_TRUE(has_finding(r, "hang"));
  for (const auto& f : r.findings) {
    if (f.id == "hang") {
      EXPECT_EQ(f.evidence, "no output and no GPU activity for 0.7 s");
    }
  }
  EXPECT_LT(r.wall_s, 5.0);
}

// Runs `o` while a user presses Ctrl-C at each of `presses` (times since the start), as the CLI's
// interrupt guard counts them.
RunResult run_pressing_ctrl_c(RunOptions o, std::vector<std::chrono::milliseconds> presses) {
  std::atomic<int> interrupt{0};
  o.interrupt = &interrupt;
  std::thread press([&] {
    const auto start = std::chrono::steady_clock::now();
    for (const auto at : presses) {
      std::this_thread::sleep_until(start + at);
      interrupt.fetch_add(1);
    }
  });
  const RunResult r = run_ok(o);
  press.join();
  return r;
}

TEST(RunWorkload, InterruptForwardsSigintThenEscalates) {
  // The workload ignores SIGINT, so the runner must go on to SIGTERM after the grace period.
  auto o = options({"--steps", "3", "--hang", "--ignore-sigint"});
  const RunResult r = run_pressing_ctrl_c(o, {700ms});
  EXPECT_EQ(r.outcome, Outcome::interrupted);
  EXPECT_EQ(r.exit.signal, SIGTERM);
  EXPECT_EQ(r.steps.steps_seen, 3);
}

TEST(RunWorkload, InterruptEndsAWorkloadThatObeysSigint) {
  auto o = options({"--steps", "3", "--hang"});
  const RunResult r = run_pressing_ctrl_c(o, {700ms});
  EXPECT_EQ(r.outcome, Outcome::interrupted);
  EXPECT_EQ(r.exit.signal, SIGINT);
}

TEST(RunWorkload, SecondInterruptKillsAtOnce) {
  // The workload ignores SIGINT and SIGTERM; the user presses Ctrl-C twice and must not wait out
  // the grace period.
  auto o = options({"--steps", "3", "--hang", "--ignore-sigint", "--ignore-sigterm"});
  o.kill_grace = 30s;
  const RunResult r = run_pressing_ctrl_c(o, {500ms, 800ms});
  EXPECT_EQ(r.outcome, Outcome::interrupted);
  EXPECT_EQ(r.exit.signal, SIGKILL);
  EXPECT_EQ(r.steps.steps_seen, 3);
  EXPECT_LT(r.wall_s, 10.0);
}

// The pid a workload's --setsid-child wrote, and whether that process is still there (a zombie
// counts: it must have been reaped too). Kills it when it is, so a failing test leaves nothing.
bool setsid_child_survived(const std::string& pid_file) {
  std::ifstream in(pid_file);
  int pid = 0;
  if (!(in >> pid) || pid <= 0) {
    ADD_FAILURE() << "no pid in " << pid_file;
    return false;
  }
  std::remove(pid_file.c_str());
  if (kill(pid, 0) != 0) return false;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return true;
}

TEST(RunWorkload, NormalEndStopsADescendantThatLeftTheSession) {
  ASSERT_TRUE(become_subreaper());  // as run::Session does
  const std::string pid_file = temp_path("setsid_end");
  auto o = options({"--steps", "2", "--setsid-child", pid_file});
  o.subreaper = true;
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.outcome, Outcome::ok);
  EXPECT_FALSE(setsid_child_survived(pid_file));
}

TEST(RunWorkload, TimeoutStopsADescendantThatLeftTheSession) {
  ASSERT_TRUE(become_subreaper());
  const std::string pid_file = temp_path("setsid_timeout");
  auto o = options({"--steps", "2", "--hang", "--setsid-child", pid_file});
  o.subreaper = true;
  o.timeout = 500ms;
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.outcome, Outcome::timeout);
  EXPECT_FALSE(setsid_child_survived(pid_file));
}

std::string h200_script(const std::string& extra) {
  return std::string(R"(
device
name NVIDIA H200
memory_total 150754820096
power_limit_mw 700000
cc_major 9
cc_minor 0
gpu_util 95
mem_util 40
power_mw 650000
temperature 60
sm_clock 1980
)") + extra;
}

std::shared_ptr<nvml::Library> open_fake() {
  auto lib = nvml::Library::open(DLPROBE_FAKE_NVML);
  EXPECT_TRUE(lib) << lib.status().message();
  return lib ? *lib : nullptr;
}

TEST(RunWorkload, AttributesGpuMemoryToAGrandchild) {
  const std::string procs = temp_path("procs");
  { std::ofstream(procs) << "7 1073741824\n"; }  // another job's process, present before start
  testing::FakeScript script(
      h200_script("mem_used 1073741824 3221225472\nclock_events 0x0\nprocess_file " + procs));
  auto o = options({"--child", "--steps", "15", "--step-ms", "20", "--gpu-file", procs,
                    "--gpu-bytes", "2147483648"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult r = run_ok(o);
  EXPECT_TRUE(r.gpu.telemetry);
  EXPECT_EQ(r.gpu.attribution, Attribution::process_tree);
  EXPECT_EQ(r.gpu.peak_bytes, 2147483648u);
  EXPECT_EQ(r.gpu.gpus_used, std::vector<unsigned>{0});
  EXPECT_EQ(r.gpu.device_total_bytes, 150754820096u);
  EXPECT_EQ(r.gpu.gpu_name, "NVIDIA H200");
  EXPECT_NEAR(*r.gpu.util_median_pct, 95, 1e-9);
  // The per-GPU figures of the one GPU used.
  ASSERT_EQ(r.gpu.per_gpu.size(), 1u);
  EXPECT_EQ(r.gpu.per_gpu[0].index, 0u);
  EXPECT_EQ(r.gpu.per_gpu[0].name, "NVIDIA H200");
  EXPECT_EQ(r.gpu.per_gpu[0].peak_bytes, 2147483648u);
  EXPECT_EQ(r.gpu.per_gpu[0].total_bytes, 150754820096u);
  EXPECT_NEAR(*r.gpu.per_gpu[0].util_median_pct, 95, 1e-9);
  EXPECT_GT(r.gpu.samples, 3u);
  EXPECT_FALSE(has_finding(r, "gpu_memory_device_wide"));
  EXPECT_FALSE(has_finding(r, "memory_preallocated"));
  std::remove(procs.c_str());
}

// The GPU at 40 % throughout. A start-up that keeps the CPU busy (compiling, autotuning) is not
// the steps: the host CPU medians, and so host-bound, are judged over the measured steps, as the
// GPU's utilisation is. (Bounds leave room for a loaded machine, where a spinning process gets
// less than a core.)
TEST(RunWorkload, HostCpuOverTheMeasuredSteps) {
  testing::FakeScript script(h200_script("gpu_util 40\nmem_used 1073741824\n"));
  auto o = options({"--spin-ms", "1500", "--steps", "30", "--step-ms", "30"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult idle = run_ok(o);
  ASSERT_TRUE(idle.host.busiest_process_median_pct && idle.host.cpu_max_pct);
  EXPECT_LT(*idle.host.busiest_process_median_pct, 10.0);
  // Above the steps' 10 % even where four processes share each core (a spinning start-up got a
  // third of one in a sanitizer build beside parallel builds).
  EXPECT_GT(*idle.host.cpu_max_pct, 15.0);  // the start-up was seen
  EXPECT_FALSE(has_finding(idle, "host_bound"));
  EXPECT_TRUE(has_finding(idle, "gpu_underused"));

  // Steps that keep the CPU busy show in the same figure (a sanitizer build under parallel tests
  // gave the spinning process a quarter of a core).
  o = options({"--steps", "30", "--step-ms", "30", "--busy"});
  o.nvml = open_fake();
  const RunResult busy = run_ok(o);
  ASSERT_TRUE(busy.host.busiest_process_median_pct);
  EXPECT_GT(*busy.host.busiest_process_median_pct,
            std::max(10.0, 2.0 * *idle.host.busiest_process_median_pct));
}

// The seed's form: no step lines, only "Throughput: ..." at its end. Start-up keeps a core busy
// for 3 s with the GPU at 2 % (150 samples: the fake NVML takes the next value at each read), then
// 2 s of steps at 96 %. The steady window is the busy stretch: no host_bound from the start-up,
// and the printed throughput is the headline.
TEST(RunWorkload, SeedScriptSteadyWindowFromTelemetry) {
  std::string util = "gpu_util";
  for (int i = 0; i < 150; ++i) util += " 2";
  testing::FakeScript script(h200_script(util + " 96\nmem_used 1073741824 2147483648\n"));
  auto o =
      options({"--seed", "--spin-ms", "3000", "--steps", "80", "--step-ms", "25", "--batch", "64"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult r = run_ok(o);
  ASSERT_TRUE(r.steps.items_per_s);
  EXPECT_NEAR(*r.steps.items_per_s, 2560.0, 0.01);
  EXPECT_EQ(r.steps.throughput_source, "printed: throughput");
  EXPECT_EQ(r.steps.batch, 64);
  EXPECT_EQ(r.window_source, "steady phase");
  ASSERT_TRUE(r.gpu.figures_window && r.phases.steady) << r.phases.why_none;
  EXPECT_GT(r.gpu.figures_window->start_s, 1.0);  // after the start-up
  ASSERT_TRUE(r.gpu.util_median_pct);
  EXPECT_GE(*r.gpu.util_median_pct, 90.0);
  ASSERT_TRUE(r.host.cpu_max_pct);
  EXPECT_GT(*r.host.cpu_max_pct, 15.0);  // the busy start-up was seen, and left out
  EXPECT_FALSE(has_finding(r, "host_bound"));
  EXPECT_FALSE(has_finding(r, "gpu_underused"));
  EXPECT_FALSE(has_finding(r, "no_steady_phase"));
}

// Nothing busy to see (the GPU at 2 % throughout): no utilisation finding, but the reason.
TEST(RunWorkload, NoSteadyPhaseIsNotEnoughEvidence) {
  testing::FakeScript script(h200_script("gpu_util 2\nmem_used 1073741824 2147483648\n"));
  auto o = options({"--seed", "--spin-ms", "600", "--steps", "10", "--step-ms", "10"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.window_source, "none");
  EXPECT_FALSE(r.phases.steady);
  EXPECT_TRUE(has_finding(r, "no_steady_phase"));
  EXPECT_FALSE(has_finding(r, "host_bound"));
  EXPECT_FALSE(has_finding(r, "gpu_underused"));
}

RunOptions shell(const std::string& text) {
  RunOptions o;
  o.argv = {"/bin/sh", "-c", text};
  o.echo = false;
  o.interval = 20ms;
  return o;
}

TEST(RunWorkload, InvalidPrintedThroughputIsAWarningNotAResult) {
  const RunResult r = run_ok(
      shell("echo 'Throughput: nan samples/sec'; echo 'Throughput: -3 samples/sec'; exit 0"));
  EXPECT_EQ(r.outcome, Outcome::ok);
  EXPECT_FALSE(r.steps.items_per_s);
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_NE(r.warnings[0].find("Throughput: nan"), std::string::npos) << r.warnings[0];
}

TEST(RunWorkload, ProgressRatesNeedTheBatch) {
  const std::string lines =
      "printf 'Epoch 0:  10%%| 10/100 [00:05<00:45,  1.98it/s]\\rEpoch 0:  50%%| 50/100 "
      "[00:17<00:17,  2.89it/s]\\rEpoch 0: 100%%| 100/100 [00:31<00:00,  3.21it/s]\\n'";
  const RunResult without = run_ok(shell(lines));
  EXPECT_FALSE(without.steps.items_per_s);
  ASSERT_EQ(without.warnings.size(), 1u);
  EXPECT_NE(without.warnings[0].find("--batch"), std::string::npos);

  auto o = shell(lines);
  o.batch = 32;
  const RunResult with = run_ok(o);
  ASSERT_TRUE(with.steps.items_per_s);
  // The first update (start-up) is left out: the median of 2.89 and 3.21 steps/s, times 32.
  EXPECT_NEAR(*with.steps.items_per_s, 97.6, 1e-6);
  EXPECT_EQ(with.steps.throughput_source, "printed: tqdm");
}

TEST(RunWorkload, NewGpuProcessOutsideTheTree) {
  // As with `docker run`: the GPU process is not a descendant, but it is new since the start.
  const std::string procs = temp_path("procs_new");
  { std::ofstream(procs) << "7 1073741824\n"; }
  testing::FakeScript script(h200_script("mem_used 1073741824\nprocess_file " + procs));
  auto o = options({"--steps", "20", "--step-ms", "20"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  std::thread container([&] {
    std::this_thread::sleep_for(100ms);
    std::ofstream(procs + ".tmp") << "7 1073741824\n999999 4294967296\n";
    std::rename((procs + ".tmp").c_str(), procs.c_str());
  });
  const RunResult r = run_ok(o);
  container.join();
  EXPECT_EQ(r.gpu.attribution, Attribution::new_processes);
  EXPECT_EQ(r.gpu.peak_bytes, 4294967296u);
  std::remove(procs.c_str());
}

TEST(RunWorkload, DeviceWideFallbackPreallocationAndThrottling) {
  // No process rows at all (a PID namespace hides them): the device's used memory jumps to 130 GB
  // of 140 GiB at once, the clocks report a power cap.
  testing::FakeScript script(
      h200_script("mem_used 1073741824 1073741824 131073741824\nclock_events 0x4\n"));
  auto o = options({"--steps", "15", "--step-ms", "20"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.gpu.attribution, Attribution::device_wide);
  EXPECT_EQ(r.gpu.peak_bytes, 130000000000u);
  EXPECT_EQ(r.gpu.device_used_before_bytes, 1073741824u);
  EXPECT_TRUE(has_finding(r, "gpu_memory_device_wide"));
  EXPECT_TRUE(has_finding(r, "memory_preallocated"));
  for (const auto& f : r.findings) {
    if (f.id == "memory_preallocated") {
      EXPECT_NE(f.evidence.find("within 5 s"), std::string::npos);
    }
  }
  EXPECT_TRUE(has_finding(r, "power_throttling"));
  EXPECT_DOUBLE_EQ(r.gpu.power_throttle.share, 1.0);
  EXPECT_FALSE(r.gpu.power_throttle.gpu);  // one GPU: not named
}

// `count` GPUs, each a `device` section of the fake NVML: an 80 GiB H100 at 90 % unless `extra(i)`
// (more lines) gives its own memory_total or gpu_util.
std::string gpus_script(int count, const std::function<std::string(int)>& extra) {
  std::string s;
  for (int i = 0; i < count; ++i) {
    const std::string own = extra(i);
    s += "device\nname NVIDIA H100\npower_limit_mw 700000\nmem_util 40\npower_mw 650000\n"
         "sm_clock 1980\n" +
         own;
    if (own.find("memory_total") == std::string::npos) s += "memory_total 85899345920\n";
    if (own.find("gpu_util") == std::string::npos) s += "gpu_util 90\n";
  }
  return s;
}

// The workload takes 23 GiB at once on an 80 GiB GPU and on a 24 GiB one: the preallocation (and
// so the near-OOM judgement) is the 24 GiB GPU's, the fullest, not 46 GiB summed against the
// larger GPU's 80.
TEST(RunWorkload, SeveralGpusAreJudgedEachAlone) {
  const std::string procs = temp_path("procs_several");
  { std::ofstream(procs) << ""; }
  testing::FakeScript script(gpus_script(8, [&](int i) {
    std::string s = i == 3 ? "clock_events 0x4\n" : "clock_events 0x0\n";
    if (i == 1) s += "memory_total 25769803776\n";
    if (i <= 1) s += "process_file " + procs + "\n";
    return s + "mem_used 1073741824 26843545600\n";
  }));
  auto o = options({"--child", "--steps", "15", "--step-ms", "20", "--gpu-file", procs,
                    "--gpu-bytes", "24696061952"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.gpu.gpus_used, (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(r.gpu.fullest_gpu, 1u);
  EXPECT_EQ(r.gpu.device_total_bytes, 25769803776u);
  EXPECT_EQ(r.gpu.busiest_gpu_peak_bytes, 24696061952u);
  EXPECT_EQ(r.gpu.early_peak_bytes, 24696061952u);
  EXPECT_TRUE(has_finding(r, "memory_preallocated"));
  for (const auto& f : r.findings) {
    if (f.id == "near_oom" || f.id == "memory_preallocated") {
      EXPECT_NE(f.evidence.find("of 24.0 GiB"), std::string::npos) << f.evidence;
    }
  }
  // GPU 3 is not among the GPUs used: its throttling is not this workload's.
  EXPECT_FALSE(has_finding(r, "power_throttling"));
  std::remove(procs.c_str());
}

TEST(RunWorkload, OneThrottlingGpuOfSeveralIsNamed) {
  const std::string procs = temp_path("procs_throttle");
  { std::ofstream(procs) << ""; }
  testing::FakeScript script(gpus_script(8, [&](int i) {
    return std::string(i == 3 ? "clock_events 0x4\n" : "clock_events 0x0\n") + "process_file " +
           procs + "\nmem_used 1073741824\n";
  }));
  auto o = options({"--child", "--steps", "15", "--step-ms", "20", "--gpu-file", procs,
                    "--gpu-bytes", "1073741824"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.gpu.gpus_used.size(), 8u);
  EXPECT_DOUBLE_EQ(r.gpu.power_throttle.share, 1.0);
  EXPECT_EQ(r.gpu.power_throttle.gpu, 3u);
  EXPECT_TRUE(has_finding(r, "power_throttling"));
  std::remove(procs.c_str());
}

// Another job keeps GPU 0 busy; the workload's GPU 1 idles while it hangs: a hang, not a timeout.
TEST(RunWorkload, AnotherJobsBusyGpuDoesNotHideAHang) {
  const std::string procs = temp_path("procs_hang");
  { std::ofstream(procs) << ""; }
  testing::FakeScript script(gpus_script(2, [&](int i) {
    return i == 0 ? std::string("mem_used 4294967296\n")
                  : "gpu_util 0\nmem_used 1073741824\nprocess_file " + procs + "\n";
  }));
  auto o = options({"--steps", "2", "--hang", "--gpu-file", procs, "--gpu-bytes", "1073741824"});
  o.nvml = open_fake();
  ASSERT_TRUE(o.nvml);
  o.hang_after = 700ms;
  o.timeout = 8s;
  const RunResult r = run_ok(o);
  EXPECT_EQ(r.outcome, Outcome::hang);
  EXPECT_LT(r.wall_s, 5.0);
  std::remove(procs.c_str());
}

}  // namespace
}  // namespace dlprobe::run

namespace dlprobe::run {
namespace {

// Two copies on one GPU: copy 1 takes 120 GB of the 140 GiB at once, as JAX's or TensorFlow's
// default pool does; copy 2 then runs out of memory in JAX's words. Each copy's memory is its
// own processes' only; the summary says which ran and their combined throughput, and the
// preallocation finding names the copy and the switches. (Last in this file: the session makes
// the test process a subreaper.)
TEST(RunSession, CopiesShareTheGpu) {
  const std::string procs = temp_path("procs_copies");
  { std::ofstream(procs) << ""; }
  testing::FakeScript script(h200_script("mem_used 1073741824\nprocess_file " + procs));
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  SessionPlan plan;
  plan.command = {"/bin/sh", "-c",
                  fmt::format("if [ \"$DLPROBE_COPY\" = {{copy}} ] && [ {{copy}} = 1 ]; then exec "
                              "{0} --gpu-file {1} --gpu-bytes 120000000000 --steps 20 "
                              "--step-ms 20; else sleep 0.3; exec {0} --oom-at-batch 1 "
                              "--oom-style jax; fi",
                              DLPROBE_FAKE_WORKLOAD, procs)};
  plan.copies = 2;
  plan.base.echo = false;
  plan.base.interval = 20ms;
  plan.base.kill_grace = 300ms;
  auto session = Session::start(std::move(plan), {});
  unsetenv("DLPROBE_NVML_LIBRARY");
  ASSERT_TRUE(session) << session.status().message();
  ASSERT_TRUE(session->run(nullptr));
  const RunReport& report = session->report();
  EXPECT_EQ(report.copies, 2);
  ASSERT_EQ(report.runs.size(), 2u);
  const RunResult& first = report.runs[0];
  const RunResult& second = report.runs[1];
  EXPECT_EQ(first.params.at("copy"), "1");
  EXPECT_EQ(second.params.at("copy"), "2");
  EXPECT_EQ(first.outcome, Outcome::ok);
  EXPECT_EQ(second.outcome, Outcome::oom);
  EXPECT_EQ(first.gpu.peak_bytes, 120000000000u);
  EXPECT_EQ(second.gpu.peak_bytes.value_or(0), 0u);  // copy 1's memory is not copy 2's
  ASSERT_TRUE(first.steps.items_per_s);
  const diagnosis::Finding* summary = nullptr;
  const diagnosis::Finding* prealloc = nullptr;
  for (const auto& f : report.sweep_findings) {
    if (f.id == "shared_gpu") summary = &f;
    if (f.id == "shared_gpu_preallocation") prealloc = &f;
  }
  ASSERT_TRUE(summary);
  EXPECT_DOUBLE_EQ(summary->numbers.at("copies_ran"), 1.0);
  EXPECT_DOUBLE_EQ(summary->numbers.at("combined_items_per_s"), *first.steps.items_per_s);
  EXPECT_NE(summary->evidence.find("copy 2: oom"), std::string::npos) << summary->evidence;
  ASSERT_TRUE(prealloc);
  EXPECT_EQ(prealloc->severity, Severity::error);
  EXPECT_DOUBLE_EQ(prealloc->numbers.at("copy"), 1.0);
  EXPECT_NE(prealloc->fix.find("XLA_PYTHON_CLIENT_MEM_FRACTION=0.47"), std::string::npos)
      << prealloc->fix;
  EXPECT_NE(prealloc->fix.find("TF_FORCE_GPU_ALLOW_GROWTH=true"), std::string::npos);
  std::remove(procs.c_str());
}

// --with: another command alongside the command, numbered after it, in the same summary.
TEST(RunSession, WithRunsAnotherCommandAlongside) {
  SessionPlan plan;
  plan.command = {DLPROBE_FAKE_WORKLOAD, "--steps", "10", "--step-ms", "10", "--batch", "8"};
  plan.with = {fmt::format("exec {} --steps 10 --step-ms 10 --batch 4", DLPROBE_FAKE_WORKLOAD)};
  plan.base.echo = false;
  plan.base.interval = 20ms;
  auto session = Session::start(std::move(plan), {});
  ASSERT_TRUE(session) << session.status().message();
  ASSERT_TRUE(session->run(nullptr));
  const RunReport& report = session->report();
  EXPECT_EQ(report.copies, 2);
  ASSERT_EQ(report.runs.size(), 2u);
  EXPECT_EQ(report.runs[0].argv[0], DLPROBE_FAKE_WORKLOAD);
  EXPECT_EQ(report.runs[1].argv[0], "/bin/sh");
  EXPECT_EQ(report.runs[1].params.at("copy"), "2");
  ASSERT_TRUE(report.runs[0].steps.items_per_s && report.runs[1].steps.items_per_s);
  ASSERT_FALSE(report.sweep_findings.empty());
  EXPECT_EQ(report.sweep_findings[0].id, "shared_gpu");
  EXPECT_DOUBLE_EQ(report.sweep_findings[0].numbers.at("combined_items_per_s"),
                   *report.runs[0].steps.items_per_s + *report.runs[1].steps.items_per_s);

  SessionPlan refused;
  refused.command = {"train", "--batch", "{batch}"};
  refused.with = {"other"};
  refused.axes = {{"batch", {"8"}}};
  auto s = Session::start(std::move(refused), {});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().message(), "--with: not with --sweep or --max-batch");
}

TEST(RunSession, MemoryLimitThroughTheFrameworksSwitches) {
  testing::FakeScript script(h200_script("mem_used 1073741824\n"));
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  const std::string out = temp_path("memory_limit_env");
  SessionPlan plan;
  plan.command = {"/bin/sh", "-c",
                  "echo $DLPROBE_MEMORY_LIMIT_MIB $XLA_PYTHON_CLIENT_MEM_FRACTION > " + out};
  plan.memory_limit_bytes = 24ull << 30;
  plan.base.echo = false;
  auto session = Session::start(std::move(plan), {});
  unsetenv("DLPROBE_NVML_LIBRARY");
  ASSERT_TRUE(session) << session.status().message();
  ASSERT_TRUE(session->run(nullptr));
  std::ifstream in(out);
  std::string mib, fraction;
  in >> mib >> fraction;
  EXPECT_EQ(mib, "24576");
  // 24 GiB of the fake H200's 150754820096 bytes.
  EXPECT_EQ(fraction, "0.1709");
  std::remove(out.c_str());
}

// The fraction is of the GPU the workload sees: CUDA_VISIBLE_DEVICES=1 (by number or by UUID) is
// the 40 GiB GPU 1 beside an 80 GiB GPU 0.
TEST(RunSession, MemoryLimitOfTheGpuTheWorkloadSees) {
  testing::FakeScript script(
      "device\nname GPU-Zero\nuuid GPU-00000000-0000-0000-0000-000000000000\n"
      "memory_total 85899345920\nmem_used 1073741824\n"
      "device\nname GPU-One\nuuid GPU-11111111-1111-1111-1111-111111111111\n"
      "memory_total 42949672960\nmem_used 1073741824\n");
  for (const char* visible : {"1", "GPU-11111111", "1,0"}) {
    setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
    const std::string out = temp_path("memory_limit_visible");
    SessionPlan plan;
    plan.command = {"/bin/sh", "-c", "echo $XLA_PYTHON_CLIENT_MEM_FRACTION > " + out};
    plan.memory_limit_bytes = 20ull << 30;
    plan.base.echo = false;
    plan.base.env_set["CUDA_VISIBLE_DEVICES"] = visible;
    auto session = Session::start(std::move(plan), {});
    unsetenv("DLPROBE_NVML_LIBRARY");
    ASSERT_TRUE(session) << session.status().message();
    ASSERT_TRUE(session->run(nullptr));
    std::ifstream in(out);
    std::string fraction;
    in >> fraction;
    // 20 of 40 GiB; with both GPUs visible, of the larger one, so the limit holds on each.
    EXPECT_EQ(fraction, std::string(visible) == "1,0" ? "0.2500" : "0.5000") << visible;
    std::remove(out.c_str());
  }
}

}  // namespace
}  // namespace dlprobe::run
