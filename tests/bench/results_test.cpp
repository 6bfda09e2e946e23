// A bench measurement in the results schema: statistics, windows, compute figures, telemetry over
// the timed windows, and every warning rule, each on values worked out by hand.
#include "dlprobe/bench/results.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "dlprobe/bench/host_cpu.h"

namespace dlprobe::bench {
namespace {

using device::BackendKind;
using device::Device;

engine::StepConfig step(std::int64_t batch) {
  engine::StepConfig c;
  c.model.arch = model::Arch::resnet50;
  c.batch = batch;
  c.precision = engine::Precision::bf16;
  c.layout = Layout::nhwc;
  return c;
}

BenchResult run_of(std::vector<std::vector<double>> windows) {
  BenchResult r;
  r.warmup_steps = 5;
  std::int64_t t = 0;
  for (auto& w : windows) {
    Window win;
    win.step_seconds = std::move(w);
    win.host_begin_ns = t;
    t += 1'000'000'000;
    win.host_end_ns = t;
    r.windows.push_back(std::move(win));
  }
  return r;
}

std::vector<double> steady(std::size_t n, double seconds) {
  // Alternating +-0.1%: a CV far below the noise threshold, no outliers.
  std::vector<double> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(seconds * (i % 2 == 0 ? 1.001 : 0.999));
  return v;
}

const results::Finding* find(const results::Configuration& c, std::string_view id) {
  for (const auto& f : c.findings) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

Measured measured(const BenchResult& r, std::int64_t batch = 64) {
  Measured m;
  m.step = step(batch);
  m.device = Device{DeviceKind::cuda, 0};
  m.backend = BackendKind::cuda;
  m.runs = {&r};
  return m;
}

TEST(ToConfiguration, SettingsStatisticsAndWindows) {
  // Two windows of 20 steps: 0.1 s and 0.2 s per step with batch 64.
  const BenchResult r = run_of({std::vector<double>(20, 0.1), std::vector<double>(20, 0.2)});
  Measured m = measured(r);
  m.flops_per_item = 24.6e9;
  m.ceiling = Ceiling{"bf16", 800.0};
  const results::Configuration c = to_configuration(m);
  EXPECT_EQ(c.kind, results::Kind::native);
  EXPECT_EQ(c.settings.model, "resnet50");
  EXPECT_EQ(c.settings.batch, 64);
  EXPECT_EQ(c.settings.precision, "bf16");
  EXPECT_EQ(c.settings.mode, "train");
  EXPECT_EQ(c.settings.layout, "nhwc");
  EXPECT_EQ(c.settings.device, "cuda:0");
  EXPECT_EQ(c.settings.optimizer, "sgd");
  EXPECT_EQ(c.settings.image_size, 224);
  EXPECT_EQ(c.settings.classes, 1000);
  EXPECT_EQ(c.settings.backend, "cuda");
  EXPECT_EQ(c.status, results::RunStatus::ok);
  EXPECT_EQ(c.samples.warmup_steps, 5);
  EXPECT_EQ(c.samples.step_seconds.size(), 40u);
  EXPECT_EQ(c.samples.window_steps, (std::vector<std::int64_t>{20, 20}));
  ASSERT_TRUE(c.statistics.has_value());
  // 40 x 64 images over 20 x 0.1 + 20 x 0.2 = 6 s: 426.67 img/s (not the mean of 640 and 320).
  EXPECT_NEAR(c.statistics->throughput, 40 * 64 / 6.0, 1e-9);
  const std::vector<double> windows = results::window_throughputs(c.samples);
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_DOUBLE_EQ(windows[0], 640.0);
  EXPECT_DOUBLE_EQ(windows[1], 320.0);
  ASSERT_TRUE(c.compute.has_value());
  EXPECT_DOUBLE_EQ(*c.compute->achieved_tflops, 24.6e9 * 40 * 64 / 6.0 / 1e12);
  EXPECT_EQ(c.compute->ceiling_dtype, "bf16");
  EXPECT_DOUBLE_EQ(*c.compute->fraction_of_ceiling, *c.compute->achieved_tflops / 800.0);
  // The windows disagree by 2x.
  const results::Finding* f = find(c, "windows_disagree");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->evidence.find("640.0, 320.0"), std::string::npos);
}

TEST(ToConfiguration, OneWindowWritesNoWindowList) {
  const BenchResult r = run_of({steady(30, 0.05)});
  const results::Configuration c = to_configuration(measured(r));
  EXPECT_TRUE(c.samples.window_steps.empty());
  EXPECT_TRUE(c.findings.empty());
  EXPECT_FALSE(c.compute.has_value());
  EXPECT_FALSE(c.memory.has_value());
}

TEST(ToConfiguration, OutOfMemoryKeepsTheAllocatorsView) {
  Measured m;
  m.step = step(4096);
  m.device = Device{DeviceKind::cuda, 0};
  m.backend = BackendKind::cuda;
  m.status = results::RunStatus::oom;
  m.error = "cannot allocate 12 GiB";
  memory::MemoryStats stats;
  stats.all.allocated_bytes_peak = 123;
  m.memory = stats;
  const results::Configuration c = to_configuration(m);
  EXPECT_EQ(c.status, results::RunStatus::oom);
  EXPECT_EQ(c.error, "cannot allocate 12 GiB");
  EXPECT_FALSE(c.statistics.has_value());
  ASSERT_TRUE(c.memory.has_value());
  EXPECT_EQ(c.memory->source, "allocator");
  EXPECT_EQ(c.memory->allocator_stats["allocated_bytes.all.peak"], 123);
}

// A planned run's arena at its fullest goes into memory.arena as memory.analysis writes it; a run
// without one writes no key.
TEST(ToConfiguration, PlannedArenaContents) {
  BenchResult r = run_of({steady(10, 0.1)});
  Measured m = measured(r);
  m.memory = memory::MemoryStats{};
  EXPECT_TRUE(to_configuration(m).memory->arena.is_null());
  memory::ArenaMoment a;
  a.call = 7;
  a.call_name = "layer1.0.conv1.backward_data";
  a.phase = memory::Phase::backward;
  a.live[static_cast<std::size_t>(memory::Category::activations)] = 3000;
  a.live[static_cast<std::size_t>(memory::Category::temporaries)] = 500;
  a.gradient_bytes = 200;
  a.free_bytes = 596;
  r.arena_fullest = a;
  const results::Configuration c = to_configuration(m);
  ASSERT_TRUE(c.memory.has_value());
  const nlohmann::json& j = c.memory->arena;
  EXPECT_EQ(j["call_name"], "layer1.0.conv1.backward_data");
  EXPECT_EQ(j["phase"], "backward");
  EXPECT_EQ(j["block_bytes"], 4096);
  EXPECT_EQ(j["live_by_category"]["activations"], 3000);
  EXPECT_EQ(j["live_gradient_bytes"], 200);
  EXPECT_EQ(j["free_bytes"], 596);
  EXPECT_FALSE(j.contains("allocated_bytes"));  // the plan alone does not know it
}

TEST(ToConfiguration, InferenceHasNoOptimizer) {
  const BenchResult r = run_of({steady(30, 0.01)});
  Measured m = measured(r, 1);
  m.step.mode = engine::StepMode::infer;
  const results::Configuration c = to_configuration(m);
  EXPECT_EQ(c.settings.mode, "infer");
  EXPECT_EQ(c.settings.optimizer, "none");
  // The per-step times are the latencies of a batch.
  EXPECT_NEAR(c.statistics->median_s, 0.01, 1e-4);
}

TEST(Findings, FewStepsAndSlowFirstStep) {
  std::vector<double> t = steady(8, 0.1);
  t.front() = 0.2;  // twice the median, far outside the others
  const BenchResult r = run_of({t});
  const results::Configuration c = to_configuration(measured(r));
  EXPECT_NE(find(c, "few_steps"), nullptr);
  const results::Finding* slow = find(c, "slow_first_step");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ(slow->severity, Severity::warning);
  EXPECT_NE(slow->evidence.find("200.000 ms"), std::string::npos);
  EXPECT_NE(slow->evidence.find("2.00x"), std::string::npos);
  EXPECT_NE(slow->fix.find("--warmup"), std::string::npos);
}

TEST(Findings, WarmupStoppedByItsBound) {
  BenchResult r = run_of({steady(20, 0.1)});
  r.until_steady = true;
  r.warmup_steps = 3;
  r.warmup_seconds = 0.9;
  r.warmup_step_seconds = {0.4, 0.3, 0.2};
  r.warmup_steady = false;
  const results::Configuration c = to_configuration(measured(r));
  ASSERT_EQ(c.samples.warmup.size(), 1u);
  EXPECT_EQ(c.samples.warmup[0].mode, "steady");
  EXPECT_EQ(c.samples.warmup[0].step_seconds, r.warmup_step_seconds);
  const results::Finding* f = find(c, "warmup_not_steady");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->evidence, "warm-up of 3 steps in 0.9 s, its last step 200.000 ms");
  // Settled, or a fixed warm-up the user asked for: nothing to say.
  r.warmup_steady = true;
  EXPECT_EQ(find(to_configuration(measured(r)), "warmup_not_steady"), nullptr);
  r.warmup_steady = false;
  r.until_steady = false;
  EXPECT_EQ(find(to_configuration(measured(r)), "warmup_not_steady"), nullptr);
}

TEST(ToConfiguration, RunsFromScratchGiveTheirSpread) {
  const BenchResult a = run_of({steady(10, 0.1)});   // 640 img/s at batch 64
  const BenchResult b = run_of({steady(10, 0.11)});  // 581.8
  Measured m = measured(a);
  m.runs = {&a, &b};
  const results::Configuration c = to_configuration(m);
  EXPECT_EQ(c.samples.run_steps, (std::vector<std::int64_t>{10, 10}));
  EXPECT_TRUE(c.samples.window_steps.empty());
  EXPECT_EQ(c.samples.warmup.size(), 2u);
  ASSERT_TRUE(c.run_spread.has_value());
  EXPECT_EQ(c.runs_in, results::RunsIn::engines);
  EXPECT_EQ(c.run_spread->runs, 2u);
  EXPECT_NEAR(c.run_spread->min, 64 / 0.11, 0.5);
  EXPECT_NEAR(c.run_spread->max, 640, 0.5);
  // One run: no spread to state.
  EXPECT_FALSE(to_configuration(measured(a)).run_spread.has_value());
}

TEST(Findings, FirstStepSlightlySlowIsNotAWarning) {
  std::vector<double> t = steady(30, 0.1);
  t.front() = 0.105;  // an outlier against +-0.1%, but only 5% slow
  const BenchResult r = run_of({t});
  EXPECT_EQ(find(to_configuration(measured(r)), "slow_first_step"), nullptr);
}

TEST(Findings, NoisyStepsAboveFivePercent) {
  std::vector<double> t;
  for (int i = 0; i < 30; ++i) t.push_back(i % 2 == 0 ? 0.09 : 0.11);  // CV 10.2%
  const BenchResult r = run_of({t});
  const results::Configuration c = to_configuration(measured(r));
  const results::Finding* f = find(c, "noisy_steps");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->evidence.find("CV 10.2%"), std::string::npos);
  std::vector<double> calm;
  for (int i = 0; i < 30; ++i) calm.push_back(i % 2 == 0 ? 0.098 : 0.102);  // CV 2%
  EXPECT_EQ(find(to_configuration(measured(run_of({calm}))), "noisy_steps"), nullptr);
}

TEST(Findings, NoisyStepsOnTheCpuSayWhatHelpsThere) {
  std::vector<double> t;
  for (int i = 0; i < 30; ++i) t.push_back(i % 2 == 0 ? 0.09 : 0.11);
  const BenchResult r = run_of({t});
  Measured m = measured(r);
  m.device = Device{};
  m.backend = BackendKind::onednn;
  const results::Configuration c = to_configuration(m);
  const results::Finding* f = find(c, "noisy_steps");
  ASSERT_NE(f, nullptr);
  // A CPU has no GPU clocks to pin.
  EXPECT_EQ(f->fix.find("nvidia-smi"), std::string::npos) << f->fix;
  EXPECT_EQ(f->fix.find("GPU"), std::string::npos) << f->fix;
  EXPECT_NE(f->fix.find("OMP_PROC_BIND"), std::string::npos) << f->fix;
}

// Two windows of 1 s each; other processes took the CPU seconds given in each.
results::Configuration contended(double first, double second) {
  BenchResult r = run_of({steady(10, 0.1), steady(10, 0.1)});
  r.windows[0].other_cpu_seconds = first;
  r.windows[1].other_cpu_seconds = second;
  Measured m = measured(r);
  m.device = Device{};
  m.backend = BackendKind::onednn;
  return to_configuration(m);
}

TEST(Findings, CpuContentionWhenOtherProcessesTookTheCpus) {
  const int cpus = online_cpus();
  // Other processes on half the cores (on 2 CPUs: one process on a full core).
  const double half = 0.5 * cpus;
  const results::Configuration busy = contended(half, half);
  EXPECT_EQ(busy.samples.window_other_cpu_seconds, (std::vector<double>{half, half}));
  EXPECT_EQ(busy.samples.host_cpus, cpus);
  ASSERT_TRUE(results::other_cpu_share(busy.samples).has_value());
  EXPECT_NEAR(*results::other_cpu_share(busy.samples), 0.5, 1e-9);
  const results::Finding* f = find(busy, "cpu_contention");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, Severity::warning);
  EXPECT_NE(
      f->evidence.find(fmt::format("50% of the machine's CPU time ({:.1f} of {} CPUs", half, cpus)),
      std::string::npos)
      << f->evidence;
  // A quiet machine: the daemons' few ticks are no contention.
  EXPECT_EQ(find(contended(0.001, 0.0), "cpu_contention"), nullptr);
  // Not read: nothing recorded, nothing said.
  const results::Configuration unread = to_configuration(measured(run_of({steady(10, 0.1)})));
  EXPECT_TRUE(unread.samples.window_other_cpu_seconds.empty());
  EXPECT_FALSE(results::other_cpu_share(unread.samples).has_value());
}

TEST(HostCpu, ParsesProcStatAndProcPidStat) {
  EXPECT_EQ(parse_proc_stat_busy(
                "cpu  100 20 30 5000 40 5 5 10 0 0\ncpu0 50 10 15 2500 20 2 2 5 0 0\n", 100.0),
            1.7);
  EXPECT_EQ(parse_proc_stat_busy("intr 1 2 3\n", 100.0), std::nullopt);
  EXPECT_EQ(parse_proc_stat_busy("cpu  1 2\n", 100.0), std::nullopt);
  // A command name with a space and a parenthesis: fields count from the last ')'.
  const std::string stat =
      "4242 (a (b) c) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 8 0 1000 0 0";
  EXPECT_EQ(parse_proc_pid_cpu(stat, 100.0), 3.0);
  EXPECT_EQ(parse_proc_pid_cpu("4242 (x) R 1 2", 100.0), std::nullopt);
  EXPECT_EQ(other_cpu_seconds({10.0, 1.0}, {12.5, 1.5}), 2.0);
  EXPECT_EQ(other_cpu_seconds({10.0, 1.0}, {10.0, 1.01}), 0.0);
  const std::optional<CpuTimes> now = read_cpu_times();
  ASSERT_TRUE(now.has_value());
  EXPECT_GE(now->all_busy_seconds, now->own_seconds);
}

TEST(Findings, WindowsWithinTwoPercentAgree) {
  const BenchResult r = run_of({steady(20, 0.100), steady(20, 0.101)});  // 1% apart
  EXPECT_EQ(find(to_configuration(measured(r)), "windows_disagree"), nullptr);
}

results::Telemetry telemetry(double util, double clock_min, double clock_max) {
  results::Telemetry t;
  t.samples = 20;
  t.gpu_util_pct = results::Range{20, util, util, util};
  t.sm_clock_mhz = results::Range{20, clock_min, clock_max, clock_max};
  return t;
}

TEST(Findings, TelemetryRules) {
  const BenchResult r = run_of({steady(30, 0.05)});
  Measured m = measured(r);
  m.telemetry = telemetry(99, 1980, 1980);
  EXPECT_TRUE(to_configuration(m).findings.empty());

  m.telemetry = telemetry(55, 1755, 1980);  // 12% clock spread, half idle
  m.telemetry->throttle_reasons = {"sw_power_cap"};
  const results::Configuration c = to_configuration(m);
  ASSERT_NE(find(c, "clock_events"), nullptr);
  EXPECT_EQ(find(c, "clock_events")->evidence, "sw_power_cap");
  ASSERT_NE(find(c, "clock_changed"), nullptr);
  EXPECT_NE(find(c, "clock_changed")->evidence.find("1755 to 1980 MHz"), std::string::npos);
  ASSERT_NE(find(c, "low_gpu_util"), nullptr);
  EXPECT_EQ(find(c, "low_gpu_util")->severity, Severity::info);

  m.telemetry = telemetry(99, 1900, 1980);  // 4% spread: below the 5% threshold
  EXPECT_EQ(find(to_configuration(m), "clock_changed"), nullptr);
}

TEST(Findings, OtherProcesses) {
  const BenchResult r = run_of({steady(30, 0.05)});
  Measured m = measured(r);
  m.others = {{4242, 1ull << 30, 77}, {4343, std::nullopt, 0}};
  const results::Configuration c = to_configuration(m);
  std::vector<const results::Finding*> found;
  for (const auto& f : c.findings) {
    if (f.id == "other_process") found.push_back(&f);
  }
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0]->severity, Severity::warning);  // it computed during the window
  EXPECT_NE(found[0]->evidence.find("pid 4242, 1.00 GiB of GPU memory, up to 77% SM"),
            std::string::npos);
  EXPECT_EQ(found[1]->severity, Severity::info);  // it only held memory
}

monitor::Tick tick(std::int64_t ns, unsigned gpu, unsigned util, double power_w, unsigned clock,
                   std::uint64_t reasons) {
  monitor::Tick t;
  t.timestamp_ns = ns;
  monitor::GpuReading r;
  r.gpu = gpu;
  r.sample.timestamp_ns = ns;
  r.sample.gpu_util_pct = util;
  r.sample.power_w = power_w;
  r.sample.sm_clock_mhz = clock;
  r.sample.clock_event_reasons = reasons;
  r.processes = {{4242, 1ull << 30, 12, 3}, {99, 1ull << 20, 50, 0}};
  t.gpus.push_back(r);
  return t;
}

TEST(TelemetryOver, RangesTimelineAndCounterEnergy) {
  WindowTelemetry a;
  a.begin_ns = 1'000'000'000;
  a.end_ns = 2'000'000'000;
  a.counter_energy_j = 300;
  a.ticks = {tick(1'100'000'000, 0, 90, 300, 1980, nvml::kClockEventGpuIdle),
             tick(1'600'000'000, 0, 100, 320, 1950, 0)};
  WindowTelemetry b;
  b.begin_ns = 2'100'000'000;
  b.end_ns = 3'100'000'000;
  b.counter_energy_j = 310;
  b.ticks = {tick(2'500'000'000, 0, 95, 310, 1900,
                  nvml::kClockEventSwPowerCap | nvml::kClockEventGpuIdle)};
  auto t = telemetry_over({a, b}, 0);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->gpu, 0);
  EXPECT_EQ(t->samples, 3u);
  EXPECT_DOUBLE_EQ(t->window_s, 2.0);
  EXPECT_EQ(t->gpu_util_pct->median, 95);
  EXPECT_EQ(t->power_w->min, 300);
  EXPECT_EQ(t->power_w->max, 320);
  EXPECT_EQ(t->sm_clock_mhz->min, 1900);
  EXPECT_DOUBLE_EQ(*t->energy_j, 610);
  EXPECT_EQ(t->energy_source, "counter");
  // Idle is not a throttle reason; the power cap is.
  EXPECT_EQ(t->throttle_reasons, (std::vector<std::string>{"sw_power_cap"}));
  ASSERT_EQ(t->timeline.size(), 3u);
  EXPECT_NEAR(t->timeline[0].t_s, 0.1, 1e-12);
  EXPECT_NEAR(t->timeline[2].t_s, 1.5, 1e-12);
  EXPECT_EQ(*t->timeline[1].power_w, 320);
}

TEST(TelemetryOver, PowerIntegralWithoutTheCounter) {
  WindowTelemetry a;
  a.begin_ns = 0;
  a.end_ns = 1'000'000'000;
  // 200 W then 400 W half a second apart: a trapezoid of 150 J.
  a.ticks = {tick(0, 0, 90, 200, 1980, 0), tick(500'000'000, 0, 90, 400, 1980, 0)};
  auto t = telemetry_over({a}, 0);
  ASSERT_TRUE(t.has_value());
  EXPECT_NEAR(*t->energy_j, 150, 1e-9);
  EXPECT_EQ(t->energy_source, "power_integral");
  EXPECT_FALSE(telemetry_over({a}, 1).has_value());  // nothing from GPU 1
  EXPECT_FALSE(telemetry_over({}, 0).has_value());
}

TEST(OtherProcesses, LeavesThisProcessOutAndKeepsTheMost) {
  WindowTelemetry a;
  a.ticks = {tick(0, 0, 90, 200, 1980, 0), tick(1, 0, 90, 200, 1980, 0)};
  a.ticks[1].gpus[0].processes[0].sm_util_pct = 40;
  const auto others = other_processes({a}, 0, 99);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].pid, 4242u);
  EXPECT_EQ(*others[0].max_sm_util_pct, 40u);
  EXPECT_EQ(*others[0].used_bytes, 1ull << 30);
  // This process absent from NVML's list: its pids are another namespace's, nothing is reported.
  EXPECT_TRUE(other_processes({a}, 0, 7).empty());
}

TEST(CeilingDtype, OnePerPrecision) {
  EXPECT_EQ(*ceiling_dtype(engine::Precision::fp32), "fp32");
  EXPECT_EQ(*ceiling_dtype(engine::Precision::tf32), "tf32");
  EXPECT_EQ(*ceiling_dtype(engine::Precision::fp16), "fp16");
  EXPECT_EQ(*ceiling_dtype(engine::Precision::bf16), "bf16");
  EXPECT_FALSE(ceiling_dtype(engine::Precision::fp64).has_value());
}

// A configuration of `batch` images at `throughput` img/s, for the input findings.
results::Configuration measured(std::int64_t batch, double throughput) {
  results::Configuration c;
  c.settings.batch = batch;
  c.statistics.emplace();
  c.statistics->throughput = throughput;
  return c;
}

// Feeding facts over 100 batches: `ready_ms` and `upload_ms` a batch.
InputFacts fed_by(std::string input, double ready_ms, double upload_ms) {
  InputFacts f;
  f.input = std::move(input);
  f.decoder = f.input == "jpeg-gpu" ? "nvJPEG" : "libjpeg-turbo";
  f.threads = 16;
  f.batches = 100;
  f.fetch_seconds = ready_ms / 10;
  f.upload_seconds = upload_ms / 10;
  return f;
}

// bs256: 7,315 img/s synthetic is a 35.0 ms step.
TEST(InputFinding, NamesWhatBindsTheStep) {
  const results::Configuration synthetic = measured(256, 7315);

  // Within 5 %: keeps up.
  EXPECT_EQ(input_finding(synthetic, measured(256, 7100), fed_by("jpeg-cpu", 20, 1)).id,
            "input_keeps_up");

  // The H200's host path before its batches went up through page-locked staging (6de12c1):
  // batches ready after 27.9 ms, the step at 56.4 ms, the copy of the fp32 batch from pageable
  // memory after the step before about 19 ms: the copy binds, not the decoding.
  const results::Finding copy =
      input_finding(synthetic, measured(256, 4474), fed_by("jpeg-cpu", 27.9, 19));
  EXPECT_EQ(copy.id, "input_bound");
  EXPECT_NE(copy.message.find("by the copy to the device"), std::string::npos) << copy.message;
  EXPECT_NE(copy.fix.find("pin_memory"), std::string::npos);
  EXPECT_NE(copy.evidence.find("handing it to the step 19.0 ms"), std::string::npos)
      << copy.evidence;

  // The GPU path (bb02a38): ready after 27.9 ms, a 40.6 ms step, a copy of 0.1 ms: the step
  // slows beside the decoding.
  const results::Finding shared =
      input_finding(synthetic, measured(256, 6300), fed_by("jpeg-gpu", 27.9, 0.1));
  EXPECT_NE(shared.message.find("decoding's share of the GPU"), std::string::npos)
      << shared.message;
  EXPECT_NE(shared.fix.find("--data-decode cpu"), std::string::npos);
  EXPECT_NE(shared.fix.find("--device cuda:N --decode cpu"), std::string::npos) << shared.fix;

  EXPECT_EQ(shared.fix.find("CUDA_DEVICE_MAX_CONNECTIONS"), std::string::npos) << shared.fix;

  // The user's environment asked for 8 hardware queues: that comes first in the GPU path's fixes
  // (the H200's GPU path at 89 to 93 % with 8, 98.6 % with 32), and not in the host path's.
  for (const double ready_ms : {27.9, 60.0}) {
    InputFacts few = fed_by("jpeg-gpu", ready_ms, 0.1);
    few.cuda_queues = 8;
    const results::Finding queued = input_finding(synthetic, measured(256, 6300), few);
    EXPECT_EQ(queued.fix.find("unset CUDA_DEVICE_MAX_CONNECTIONS or set it to 32 (it is 8 here"),
              0U)
        << queued.fix;
  }
  InputFacts host = fed_by("jpeg-cpu", 60, 0.1);
  host.cuda_queues = 8;
  EXPECT_EQ(input_finding(synthetic, measured(256, 4474), host).fix.find("CUDA_DEVICE"),
            std::string::npos);

  // Batches that come later than the step needs (60 ms against a 56 ms step): the decoding
  // binds, whatever the copy took, and the fix is the decoding's.
  for (const char* input : {"jpeg-cpu", "jpeg-gpu"}) {
    const results::Finding slow =
        input_finding(synthetic, measured(256, 4474), fed_by(input, 60, 19));
    EXPECT_EQ(slow.message.find("by the copy"), std::string::npos) << input;
    EXPECT_EQ(slow.message.find("share of the GPU"), std::string::npos) << input;
    EXPECT_NE(slow.fix.find("--data-threads"), std::string::npos) << input;
  }
}

}  // namespace
}  // namespace dlprobe::bench
