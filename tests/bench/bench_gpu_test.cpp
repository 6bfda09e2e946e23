// The bench runner and a sweep on the GPU (ctest -L gpu): step times from CUDA events without a
// host synchronisation per step, NVML telemetry over the timed windows with the energy counter, an
// out-of-memory on a limited allocator passed over, and every precision's step running.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/protocol.h"
#include "dlprobe/bench/sweep.h"

namespace dlprobe::bench {
namespace {

using device::BackendKind;
using device::Device;
using device::Engine;

engine::StepConfig small(engine::Precision precision, Layout layout, std::int64_t batch) {
  engine::StepConfig c;
  c.model.arch = model::Arch::resnet18;
  c.model.image_size = 64;
  c.model.classes = 100;
  c.batch = batch;
  c.precision = precision;
  c.layout = layout;
  return c;
}

TEST(BenchGpu, EventTimedWindowsCoverTheHostWindow) {
  auto e = Engine::open(Device{DeviceKind::cuda, 0}, BackendKind::cuda);
  ASSERT_TRUE(e.has_value()) << e.status().message();
  BenchOptions o;
  o.step = small(engine::Precision::fp32, Layout::nchw, 16);
  o.protocol = fixed_protocol(3, 0.2, 10, 0.3, 2, 100'000);
  auto r = run_bench(**e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_EQ(r->windows.size(), 2u);
  for (const Window& w : r->windows) {
    EXPECT_GE(w.step_seconds.size(), 10u);
    double sum = 0;
    for (double t : w.step_seconds) {
      EXPECT_GT(t, 0);
      sum += t;
    }
    const double host = static_cast<double>(w.host_end_ns - w.host_begin_ns) / 1e9;
    // The events lie inside the host's window and fill most of it: the GPU was kept busy.
    EXPECT_LE(sum, host);
    EXPECT_GT(sum, 0.5 * host);
    EXPECT_GE(sum, 0.3 - 0.01);
  }
}

// A step replayed as a CUDA graph is one launch: the timed window must still end near its
// seconds (the host queues at most a few steps ahead), and the graph's memory must go with the
// step, so that the next configuration on the same engine starts from nothing.
TEST(BenchGpu, GraphReplayWindowEndsOnTimeAndLeavesNoMemory) {
  auto e = Engine::open(Device{DeviceKind::cuda, 0}, BackendKind::cuda);
  ASSERT_TRUE(e.has_value()) << e.status().message();
  BenchOptions o;
  o.step = small(engine::Precision::fp32, Layout::nchw, 64);
  o.step.mode = engine::StepMode::grads;
  o.step.memory_plan = engine::MemoryPlan::planned;
  o.step.graph = true;
  o.protocol = fixed_protocol(3, 0.0, 1, 0.5, 1, 100'000);
  for (int run = 0; run < 2; ++run) {
    auto r = run_bench(**e, o);
    ASSERT_TRUE(r.has_value()) << r.status().message();
    ASSERT_EQ(r->windows.size(), 1u);
    EXPECT_TRUE(r->graph_replayed);
    const Window& w = r->windows[0];
    const double host = static_cast<double>(w.host_end_ns - w.host_begin_ns) / 1e9;
    double longest = 0;
    for (double t : w.step_seconds) longest = std::max(longest, t);
    // min_seconds, plus the few steps queued when the clock passed it, plus slack for the host.
    EXPECT_LE(host, 0.5 + 5 * longest + 0.25) << w.step_seconds.size() << " steps";
    EXPECT_EQ((*e)->allocator().stats().all.allocated_bytes, 0) << "run " << run;
  }
}

TEST(BenchGpu, EveryPrecisionRuns) {
  Sweep s;
  s.device = Device{DeviceKind::cuda, 0};
  s.backend = BackendKind::cuda;
  s.protocol = fixed_protocol(2, 0.0, 5, 0.0, 1, 1000);
  for (const auto& [p, layout] : {std::pair{engine::Precision::fp32, Layout::nchw},
                                  {engine::Precision::tf32, Layout::nchw},
                                  {engine::Precision::fp16, Layout::nhwc},
                                  {engine::Precision::bf16, Layout::nhwc}}) {
    SweepGroup g;
    g.step = small(p, layout, 0);
    g.batches = {8};
    s.groups.push_back(g);
  }
  const SweepOutcome out = run_sweep(s, {});
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_EQ(out.configurations.size(), 4u);
  for (const auto& c : out.configurations) {
    EXPECT_EQ(c.status, results::RunStatus::ok)
        << results::describe(c.kind, c.settings) << ": " << c.error;
  }
}

TEST(BenchGpu, TelemetryAndEnergyOverTheWindow) {
  auto nvml = nvml::Library::open();
  ASSERT_TRUE(nvml.has_value()) << nvml.status().message();
  TelemetrySource source;
  source.nvml = *nvml;
  source.gpu = 0;  // the GPU machine has one GPU; CUDA and NVML agree on it
  Sweep s;
  s.device = Device{DeviceKind::cuda, 0};
  s.backend = BackendKind::cuda;
  s.protocol = fixed_protocol(3, 0.5, 10, 1.0, 1, 100'000);
  SweepGroup g;
  g.step = small(engine::Precision::bf16, Layout::nhwc, 64);
  g.batches = {64};
  s.groups.push_back(g);
  SweepEnvironment env;
  env.telemetry = &source;
  const SweepOutcome out = run_sweep(s, env);
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_EQ(out.configurations.size(), 1u);
  const auto& c = out.configurations[0];
  ASSERT_EQ(c.telemetry.size(), 1u);
  const auto& t = c.telemetry[0];
  EXPECT_GE(t.samples, 10u);  // 50 ms sampling over at least a second
  EXPECT_GE(t.window_s, 1.0);
  ASSERT_TRUE(t.power_w.has_value());
  EXPECT_GT(t.power_w->median, 50);
  ASSERT_TRUE(t.energy_j.has_value());
  // Energy over the window is about median power x window length.
  EXPECT_NEAR(*t.energy_j / t.window_s, t.power_w->median, 0.5 * t.power_w->median);
  EXPECT_FALSE(t.timeline.empty());
}

TEST(BenchGpu, OutOfMemoryOnALimitedDeviceIsPassedOver) {
  Sweep s;
  s.device = Device{DeviceKind::cuda, 0};
  s.backend = BackendKind::cuda;
  s.protocol = fixed_protocol(1, 0.0, 2, 0.0, 1, 100);
  s.allocation.mode = memory::Mode::limit;
  s.allocation.limit_bytes = 1ull << 30;  // a 1 GiB "device"
  SweepGroup g;
  g.step = small(engine::Precision::fp32, Layout::nchw, 0);
  g.batches = {8, 4096, 8};
  s.groups.push_back(g);
  const SweepOutcome out = run_sweep(s, {});
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_EQ(out.configurations.size(), 3u);
  EXPECT_EQ(out.configurations[0].status, results::RunStatus::ok);
  EXPECT_EQ(out.configurations[1].status, results::RunStatus::oom) << out.configurations[1].error;
  EXPECT_EQ(out.configurations[2].status, results::RunStatus::ok);
}

}  // namespace
}  // namespace dlprobe::bench
