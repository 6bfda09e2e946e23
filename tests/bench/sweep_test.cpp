// Sweeps on the reference backend: expansion order, clean state per configuration, an
// out-of-memory recorded and passed, the auto walk ending at its first, interrupts, and GPU
// telemetry through the fake NVML library.
#include "dlprobe/bench/sweep.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "bench/protocol.h"
#include "common/temp_folder.h"
#include "dlprobe/data/make_dataset.h"
#include "monitor/fake_script.h"

namespace dlprobe::bench {
namespace {

using device::backend_built;
using device::BackendKind;
using device::Device;
using device::Engine;

// 16x16 by default: the smallest image ResNet-18 takes; in inference no batch-norm needs two
// values.
engine::StepConfig tiny(std::int64_t image = 16) {
  engine::StepConfig c;
  c.model.arch = model::Arch::resnet18;
  c.model.image_size = image;
  c.model.classes = 10;
  c.model.width = 16;
  c.mode = engine::StepMode::infer;
  return c;
}

Sweep tiny_sweep(std::vector<std::int64_t> batches, std::int64_t image = 16) {
  Sweep s;
  s.device = Device{DeviceKind::cpu, 0};
  s.backend = BackendKind::reference;
  s.protocol = fixed_protocol(0, 0.0, 2, 0.0, 1, 100);
  SweepGroup g;
  g.step = tiny(image);
  g.batches = std::move(batches);
  s.groups.push_back(g);
  return s;
}

TEST(Expand, ModelsOutermostBatchesInnermost) {
  SweepAxes a;
  a.models = {model::Arch::resnet18, model::Arch::resnet50};
  a.precisions = {engine::Precision::fp32, engine::Precision::bf16};
  a.modes = {engine::StepMode::train};
  a.layouts = {Layout::nchw, Layout::nhwc};
  a.batches = {16, 32};
  a.base.model.image_size = 64;
  a.memory = memory::parse_gpu_memory("prealloc:0.5").value();
  a.graph = false;
  a.streams = 1;
  const Result<Expanded> e = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(e.has_value()) << e.status().message();
  EXPECT_EQ(e->picked, "");  // nothing was left open
  EXPECT_EQ(e->gpu_memory, "prealloc:0.5");
  EXPECT_EQ(e->allocation.mode, memory::Mode::preallocate);
  const std::vector<SweepGroup>& groups = e->groups;
  ASSERT_EQ(groups.size(), 8u);
  EXPECT_EQ(groups[0].step.model.arch, model::Arch::resnet18);
  EXPECT_EQ(groups[0].step.precision, engine::Precision::fp32);
  EXPECT_EQ(groups[0].step.layout, Layout::nchw);
  EXPECT_EQ(groups[1].step.layout, Layout::nhwc);
  EXPECT_EQ(groups[2].step.precision, engine::Precision::bf16);
  EXPECT_EQ(groups[4].step.model.arch, model::Arch::resnet50);
  EXPECT_EQ(groups[7].step.model.image_size, 64);
  EXPECT_EQ(groups[7].batches, (std::vector<std::int64_t>{16, 32}));
  Sweep s;
  s.groups = groups;
  EXPECT_EQ(planned_configurations(s), 16u);
}

SweepAxes fp32_and_fp16_train_and_grads() {
  SweepAxes a;
  a.models = {model::Arch::resnet50};
  a.precisions = {engine::Precision::fp32, engine::Precision::fp16};
  a.modes = {engine::StepMode::train, engine::StepMode::grads};
  a.batches = {256};
  return a;
}

TEST(Expand, OpenChoicesTakeTheFastestPerConfiguration) {
  const Result<Expanded> gpu = expand(fp32_and_fp16_train_and_grads(), DeviceKind::cuda);
  ASSERT_TRUE(gpu.has_value()) << gpu.status().message();
  ASSERT_EQ(gpu->groups.size(), 4u);
  const auto expect = [&](std::size_t i, Layout layout, bool graph, int small_batch_streams) {
    const engine::StepConfig& c = gpu->groups[i].step;
    EXPECT_EQ(c.layout, layout) << i;
    EXPECT_EQ(c.memory_plan, engine::MemoryPlan::planned) << i;
    EXPECT_EQ(c.graph, graph) << i;
    // Two streams without a bound up to batch 128, bounded to 16 calls above.
    const int two = small_batch_streams;
    EXPECT_EQ(gpu->groups[i].step_at(128).streams, two) << i;
    EXPECT_EQ(gpu->groups[i].step_at(128).stream_lag, 0) << i;
    EXPECT_EQ(gpu->groups[i].step_at(256).streams, two) << i;
    EXPECT_EQ(gpu->groups[i].step_at(256).stream_lag, two > 1 ? 16 : 0) << i;
    EXPECT_EQ(gpu->groups[i].step_at(256).batch, 256) << i;
  };
  expect(0, Layout::nchw, true, 1);  // fp32 train
  expect(1, Layout::nchw, true, 1);  // fp32 grads
  expect(2, Layout::nhwc, true, 2);  // fp16 train
  expect(3, Layout::nhwc, true, 2);  // fp16 grads
  EXPECT_EQ(gpu->gpu_memory, "planned");
  EXPECT_EQ(gpu->allocation.mode, memory::Mode::growth);
  EXPECT_EQ(gpu->picked,
            "layout nchw for fp32 and nhwc for fp16, gpu-memory planned, graph on, streams 1 for "
            "fp32 and 2 up to batch 128, 2 with --stream-lag 16 above for fp16");

  SweepAxes one = fp32_and_fp16_train_and_grads();
  one.precisions = {engine::Precision::bf16};
  one.modes = {engine::StepMode::grads};
  EXPECT_EQ(expand(one, DeviceKind::cuda)->picked,
            "layout nhwc, gpu-memory planned, graph on, streams 2 up to batch 128, 2 with "
            "--stream-lag 16 above");
  // A choice given is kept, and the open ones follow it: no graph over grown memory.
  one.memory = memory::parse_gpu_memory("grow").value();
  const Result<Expanded> grown = expand(one, DeviceKind::cuda);
  ASSERT_TRUE(grown.has_value());
  EXPECT_EQ(grown->picked, "layout nhwc, graph off, streams 1");
  EXPECT_FALSE(grown->groups[0].step.graph);
  EXPECT_EQ(grown->groups[0].step_at(256).streams, 1);
  EXPECT_FALSE(grown->groups[0].streams_open);
  // Two streams asked for over grown memory: an error, as a graph is.
  one.streams = 2;
  EXPECT_NE(expand(one, DeviceKind::cuda).status().message().find("planned"), std::string::npos);
  EXPECT_EQ(grown->groups[0].step.memory_plan, engine::MemoryPlan::dynamic);
}

// A stream lag given holds at every batch on two streams; left open beside two streams asked for,
// it is the fastest at each batch; it bounds the second stream, so one stream refuses it.
TEST(Expand, AStreamLagBoundsTheSecondStream) {
  SweepAxes a = fp32_and_fp16_train_and_grads();
  a.precisions = {engine::Precision::fp16};
  a.stream_lag = 4;
  const Result<Expanded> open = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(open.has_value()) << open.status().message();
  for (const std::int64_t batch : {32, 256}) {
    EXPECT_EQ(open->groups[0].step_at(batch).streams, 2) << batch;
    EXPECT_EQ(open->groups[0].step_at(batch).stream_lag, 4) << batch;
  }
  EXPECT_EQ(open->picked,
            "layout nhwc, gpu-memory planned, graph on, streams 2 up to batch 128, 2 above");

  a.streams = 2;
  a.stream_lag.reset();
  const Result<Expanded> two = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(two.has_value()) << two.status().message();
  EXPECT_EQ(two->groups[0].step_at(64).stream_lag, 0);
  EXPECT_EQ(two->groups[0].step_at(512).streams, 2);
  EXPECT_EQ(two->groups[0].step_at(512).stream_lag, 16);
  EXPECT_EQ(two->picked,
            "layout nhwc, gpu-memory planned, graph on, stream-lag 0 up to batch 128, 16 above");

  a.streams = 1;
  a.stream_lag = 16;
  EXPECT_NE(expand(a, DeviceKind::cuda).status().message().find("take two streams"),
            std::string::npos);
  a.stream_lag = 0;  // no bound: nothing to refuse on one stream
  EXPECT_TRUE(expand(a, DeviceKind::cuda).has_value());
  // Where the open streams come to one (strict fp32, grown memory, recomputed outputs), a lag
  // given has no second stream to bound and is dropped, not refused at run time.
  a.streams.reset();
  a.stream_lag = 4;
  a.precisions = {engine::Precision::fp32, engine::Precision::fp16};
  const Result<Expanded> mixed = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(mixed.has_value()) << mixed.status().message();
  EXPECT_EQ(mixed->groups[0].step_at(32).streams, 1);  // fp32 train
  EXPECT_EQ(mixed->groups[0].step_at(32).stream_lag, 0);
  EXPECT_EQ(mixed->groups[2].step_at(32).stream_lag, 4);  // fp16 train
  a.precisions = {engine::Precision::fp16};
  a.memory = memory::parse_gpu_memory("grow").value();
  const Result<Expanded> grown = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(grown.has_value()) << grown.status().message();
  EXPECT_EQ(grown->groups[0].step_at(32).streams, 1);
  EXPECT_EQ(grown->groups[0].step_at(32).stream_lag, 0);
  a.memory.reset();
  a.base.recompute_block_outputs = true;
  const Result<Expanded> recomputed = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(recomputed.has_value()) << recomputed.status().message();
  EXPECT_EQ(recomputed->groups[0].step_at(256).streams, 1);
  EXPECT_EQ(recomputed->groups[0].step_at(256).stream_lag, 0);
  a.base.recompute_block_outputs = false;
  a.streams.reset();
  a.stream_lag = -1;
  EXPECT_NE(
      expand(a, DeviceKind::cuda).status().message().find("count of calls, 0 for no bound; got -1"),
      std::string::npos);
}

// Recomputed block outputs save nothing on two streams (the second keeps its operands to the end
// of the backward pass): open streams take one at every batch, and two asked for are refused.
TEST(Expand, RecomputedBlockOutputsTakeOneStream) {
  SweepAxes a = fp32_and_fp16_train_and_grads();
  a.base.recompute_block_outputs = true;
  const Result<Expanded> gpu = expand(a, DeviceKind::cuda);
  ASSERT_TRUE(gpu.has_value()) << gpu.status().message();
  for (const SweepGroup& g : gpu->groups) {
    EXPECT_EQ(g.step_at(32).streams, 1);
    EXPECT_TRUE(g.step_at(32).recompute_block_outputs);
  }
  EXPECT_NE(gpu->picked.find("streams 1"), std::string::npos) << gpu->picked;
  a.streams = 2;
  EXPECT_NE(expand(a, DeviceKind::cuda).status().message().find("recomputed block outputs"),
            std::string::npos);
}

TEST(Expand, AGraphAskedForNeedsPlannedMemory) {
  SweepAxes a = fp32_and_fp16_train_and_grads();
  a.graph = true;
  // Training replays with either optimizer (the step's counters carry what changes per step).
  EXPECT_TRUE(expand(a, DeviceKind::cuda).has_value());
  a.base.optimizer = engine::OptimizerKind::adamw;
  EXPECT_TRUE(expand(a, DeviceKind::cuda).has_value());
  a.base.optimizer = engine::OptimizerKind::sgd;
  a.modes = {engine::StepMode::grads};
  a.memory = memory::parse_gpu_memory("grow").value();
  EXPECT_NE(expand(a, DeviceKind::cuda).status().message().find("needs the planned memory"),
            std::string::npos);
  // Open memory takes the arena the graph needs, on any device.
  a.memory.reset();
  const Result<Expanded> cpu = expand(a, DeviceKind::cpu);
  ASSERT_TRUE(cpu.has_value()) << cpu.status().message();
  EXPECT_EQ(cpu->gpu_memory, "planned");
  for (const SweepGroup& g : cpu->groups) {
    EXPECT_TRUE(g.step.graph);
    EXPECT_EQ(g.step.memory_plan, engine::MemoryPlan::planned);
  }
}

TEST(AutoBatch, DoublesUpToTheLimit) {
  EXPECT_EQ(auto_batches({16, 256}), (std::vector<std::int64_t>{16, 32, 64, 128, 256}));
  EXPECT_EQ(auto_batches({3, 20}), (std::vector<std::int64_t>{3, 6, 12}));
  EXPECT_TRUE(auto_batches({64, 32}).empty());
  Sweep s = tiny_sweep({});
  s.groups[0].auto_batch = true;
  s.auto_batch = {16, 256};
  EXPECT_EQ(planned_configurations(s), 5u);
}

TEST(RunSweep, EveryConfigurationRecordedAndWritten) {
  const Sweep s = tiny_sweep({2, 4});
  std::vector<std::size_t> written;
  std::vector<SweepProgress> progress;
  SweepCallbacks callbacks;
  callbacks.done = [&](const std::vector<results::Configuration>& c, std::size_t planned) {
    written.push_back(c.size());
    EXPECT_EQ(planned, 2u);
    return Status::ok();
  };
  callbacks.progress = [&](const SweepProgress& p) { progress.push_back(p); };
  const SweepOutcome out = run_sweep(s, {}, callbacks);
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  EXPECT_FALSE(out.interrupted);
  EXPECT_EQ(out.incomplete, 0u);
  ASSERT_EQ(out.configurations.size(), 2u);
  EXPECT_EQ(out.runs.size(), 2u);
  EXPECT_EQ(written, (std::vector<std::size_t>{1, 2}));
  for (const auto& c : out.configurations) {
    EXPECT_EQ(c.status, results::RunStatus::ok);
    EXPECT_EQ(c.settings.backend, "reference");
    EXPECT_EQ(c.samples.step_seconds.size(), 2u);
    ASSERT_TRUE(c.compute.has_value());
    EXPECT_GT(*c.compute->flops_per_item, 0);
    EXPECT_FALSE(c.compute->ceiling_tflops.has_value());  // none given
    EXPECT_TRUE(c.telemetry.empty());                     // none asked for
  }
  EXPECT_EQ(out.configurations[1].settings.batch, 4);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().index, 2u);
  EXPECT_EQ(progress.back().planned, 2u);
  EXPECT_TRUE(progress.back().eta_s.has_value());  // one configuration done: an estimate
  EXPECT_FALSE(progress.front().eta_s.has_value());
  EXPECT_NE(progress.back().label.find("resnet18-w16@16 bs=4"), std::string::npos);
}

TEST(RunSweep, RepeatRunsFromScratchAndGivesTheirSpread) {
  Sweep s = tiny_sweep({2});
  s.runs = 3;
  s.protocol.until_steady = true;
  s.protocol.warmup_seconds = 5.0;
  const SweepOutcome out = run_sweep(s, {});
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_EQ(out.configurations.size(), 1u);
  ASSERT_EQ(out.runs.size(), 1u);
  EXPECT_EQ(out.runs.front().size(), 3u);
  const results::Configuration& c = out.configurations.front();
  EXPECT_EQ(c.status, results::RunStatus::ok);
  EXPECT_EQ(c.samples.step_seconds.size(), 6u);
  EXPECT_EQ(c.samples.run_steps, (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_TRUE(c.samples.window_steps.empty());  // one window per run
  ASSERT_EQ(c.samples.warmup.size(), 3u);
  std::int64_t warmup_steps = 0;
  for (const results::Warmup& w : c.samples.warmup) {
    EXPECT_EQ(w.mode, "steady");
    EXPECT_GE(w.steps, 10);  // the steady test's window at least
    EXPECT_EQ(w.step_seconds.size(), static_cast<std::size_t>(w.steps));
    warmup_steps += w.steps;
  }
  EXPECT_EQ(c.samples.warmup_steps, warmup_steps);
  ASSERT_TRUE(c.run_spread.has_value());
  const stats::RunSpread& spread = *c.run_spread;
  EXPECT_EQ(spread.runs, 3u);
  const std::vector<double> each = results::run_throughputs(c.samples);
  ASSERT_EQ(each.size(), 3u);
  EXPECT_EQ(spread.min, *std::min_element(each.begin(), each.end()));
  EXPECT_EQ(spread.max, *std::max_element(each.begin(), each.end()));
  EXPECT_LE(spread.ci.low, spread.mean);
  EXPECT_GE(spread.ci.high, spread.mean);
}

TEST(RunSweep, CeilingsGiveTheFractionReached) {
  const Sweep s = tiny_sweep({2});
  SweepEnvironment env;
  env.ceilings[engine::Precision::fp32] = Ceiling{"fp32", 0.5};
  const SweepOutcome out = run_sweep(s, env);
  ASSERT_EQ(out.configurations.size(), 1u);
  const auto& k = *out.configurations[0].compute;
  EXPECT_EQ(k.ceiling_dtype, "fp32");
  EXPECT_DOUBLE_EQ(*k.fraction_of_ceiling, *k.achieved_tflops / 0.5);
}

// The out-of-memory tests run 64x64 images: enough activations that batch 32 needs megabytes more
// than batch 2.
constexpr std::int64_t kOomImage = 64;

// The allocated peak of a configuration run alone.
std::int64_t peak(std::int64_t batch) {
  auto e = Engine::open(Device{}, BackendKind::reference);
  EXPECT_TRUE(e.has_value());
  BenchOptions o;
  o.step = tiny(kOomImage);
  o.step.batch = batch;
  o.protocol = fixed_protocol(1, 0.0, 1, 0.0, 1, 10);
  auto r = run_bench(**e, o);
  EXPECT_TRUE(r.has_value());
  return r->memory.all.allocated_bytes_peak;
}

// One preallocated segment on which batch 16 fits and batch 32 does not: a small device.
// Activations take the same bytes for every image of a batch, so the bytes an image adds, measured
// from batches 2 and 4, place the segment without running a large batch. (Preallocation, not a
// limit: a limit counts whole segments, whose rounding dwarfs the activations of these tiny
// batches.)
memory::AllocatorOptions small_device() {
  static const std::int64_t two = peak(2);
  static const std::int64_t per_image = (peak(4) - two) / 2;
  EXPECT_GT(per_image, 64 << 10) << two;
  memory::AllocatorOptions o;
  o.mode = memory::Mode::preallocate;
  o.preallocate_bytes = static_cast<std::uint64_t>((two + 22 * per_image) / 512 * 512);
  return o;
}

TEST(RunSweep, OutOfMemoryIsRecordedAndTheSweepGoesOn) {
  Sweep s = tiny_sweep({64, 2}, kOomImage);
  s.allocation = small_device();
  const SweepOutcome out = run_sweep(s, {});
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_EQ(out.configurations.size(), 2u);
  const auto& oom = out.configurations[0];
  EXPECT_EQ(oom.status, results::RunStatus::oom);
  EXPECT_NE(oom.error.find("cannot allocate"), std::string::npos) << oom.error;
  ASSERT_TRUE(oom.memory.has_value());  // where memory was when it ran out
  EXPECT_TRUE(oom.memory->allocator_stats.is_object());
  EXPECT_FALSE(oom.statistics.has_value());
  // The next configuration starts clean and runs.
  EXPECT_EQ(out.configurations[1].status, results::RunStatus::ok);
  EXPECT_EQ(out.incomplete, 1u);
}

TEST(RunSweep, AutoWalkEndsAtTheFirstOutOfMemory) {
  Sweep s = tiny_sweep({}, kOomImage);
  s.groups[0].auto_batch = true;
  s.auto_batch = {16, 1024};
  s.allocation = small_device();
  std::vector<std::size_t> planned;
  SweepCallbacks callbacks;
  callbacks.done = [&](const std::vector<results::Configuration>&, std::size_t p) {
    planned.push_back(p);
    return Status::ok();
  };
  const SweepOutcome out = run_sweep(s, {}, callbacks);
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_GE(out.configurations.size(), 2u);
  EXPECT_EQ(out.configurations.size(), 2u);  // batch 32 ran out
  for (std::size_t i = 0; i + 1 < out.configurations.size(); ++i) {
    EXPECT_EQ(out.configurations[i].status, results::RunStatus::ok);
    EXPECT_EQ(out.configurations[i].settings.batch, std::int64_t{16} << i);
  }
  EXPECT_EQ(out.configurations.back().status, results::RunStatus::oom);
  EXPECT_EQ(out.incomplete, 0u);  // finding that out-of-memory was the point
  // Seven batches planned (16 ... 1024) until the walk ended.
  EXPECT_EQ(planned.front(), 7u);
  EXPECT_EQ(planned.back(), out.configurations.size());
}

TEST(RunSweep, InterruptStopsAfterTheCurrentConfiguration) {
  const Sweep s = tiny_sweep({2, 4, 8});
  std::atomic<int> stop{0};
  SweepEnvironment env;
  env.interrupt = &stop;
  SweepCallbacks callbacks;
  callbacks.progress = [&](const SweepProgress& p) {
    if (p.index == 2 && p.step.phase == Progress::Phase::timing) stop = 1;
  };
  const SweepOutcome out = run_sweep(s, env, callbacks);
  EXPECT_TRUE(out.interrupted);
  ASSERT_EQ(out.configurations.size(), 2u);
  EXPECT_EQ(out.configurations[0].status, results::RunStatus::ok);
  EXPECT_EQ(out.configurations[1].status, results::RunStatus::interrupted);
  EXPECT_EQ(out.configurations[1].samples.step_seconds.size(), 1u);  // timed before the stop
  EXPECT_NE(out.configurations[1].error.find("interrupted"), std::string::npos);
}

TEST(RunSweep, WriteFailureStopsTheSweep) {
  const Sweep s = tiny_sweep({2, 4});
  SweepCallbacks callbacks;
  callbacks.done = [](const std::vector<results::Configuration>&, std::size_t) {
    return error(Errc::io_error, "disk full");
  };
  const SweepOutcome out = run_sweep(s, {}, callbacks);
  EXPECT_EQ(out.status.message(), "disk full");
  EXPECT_EQ(out.configurations.size(), 1u);
}

TEST(RunSweep, EngineThatCannotStartIsTheSweepsError) {
  Sweep s = tiny_sweep({2});
  s.backend = BackendKind::cuda;
  s.device = Device{DeviceKind::cuda, 0};
  if (backend_built(BackendKind::cuda)) GTEST_SKIP() << "a CUDA build: the gpu tests cover it";
  const SweepOutcome out = run_sweep(s, {});
  EXPECT_FALSE(out.status.is_ok());
  EXPECT_TRUE(out.configurations.empty());
}

TEST(RunSweep, BatchSweepFindings) {
  // Batch 64 runs out of memory on the small device: a finding that no timing can change, named
  // after its curve (without the batch).
  Sweep s = tiny_sweep({2, 64}, kOomImage);
  s.allocation = small_device();
  const SweepOutcome out = run_sweep(s, {});
  ASSERT_EQ(out.configurations.size(), 2u);
  ASSERT_FALSE(out.findings.empty());
  bool oom = false;
  for (const auto& f : out.findings) {
    EXPECT_NE(f.title.find("(resnet18-w16@64 fp32 infer nchw cpu/reference classes=10)"),
              std::string::npos)
        << f.title;
    oom = oom || f.title.starts_with("Out of memory from batch 64");
  }
  EXPECT_TRUE(oom);
}

// An H200 whose clocks dip under a power cap every other reading (the fake holds a list's last
// value once it runs out, so the lists are long enough for the whole test).
std::string throttling_script() {
  std::string script(testing::kH200Script);
  std::string events = "clock_events";
  std::string clocks = "sm_clock";
  for (int i = 0; i < 2000; ++i) {
    events += i % 2 == 0 ? " 0x0" : " 0x4";
    clocks += i % 2 == 0 ? " 1980" : " 1755";
  }
  for (const auto& [key, line] :
       {std::pair<std::string, std::string>{"clock_events ", events}, {"sm_clock ", clocks}}) {
    const auto at = script.find("\n" + key);
    script.replace(at + 1, script.find('\n', at + 1) - at - 1, line);
  }
  // This process holds the GPU too, so that NVML's pids are known to be this namespace's.
  const auto at = script.find("\nprocess 4343 na");
  script.insert(at, "\nprocess " + std::to_string(::getpid()) + " 536870912");
  return script;
}

TEST(RunSweep, TelemetryFromTheFakeNvml) {
  testing::FakeScript script(throttling_script());
  auto nvml = nvml::Library::open(DLPROBE_FAKE_NVML);
  ASSERT_TRUE(nvml.has_value()) << nvml.status().message();
  TelemetrySource source;
  source.nvml = *nvml;
  source.gpu = 0;
  source.interval = std::chrono::milliseconds(10);
  Sweep s = tiny_sweep({2});
  // Long enough for several sampler rounds.
  s.protocol = fixed_protocol(1, 0.0, 1, 0.2, 1, 100'000);
  SweepEnvironment env;
  env.telemetry = &source;
  const SweepOutcome out = run_sweep(s, env);
  ASSERT_EQ(out.configurations.size(), 1u);
  const auto& c = out.configurations[0];
  ASSERT_EQ(c.telemetry.size(), 1u);
  const auto& t = c.telemetry[0];
  EXPECT_GT(t.samples, 2u);
  EXPECT_EQ(t.timeline.size(), t.samples);
  ASSERT_TRUE(t.gpu_util_pct.has_value());
  EXPECT_GE(t.gpu_util_pct->min, 10);
  EXPECT_LE(t.gpu_util_pct->max, 90);
  // The script steps through its energy values; the counter read at the window's edges.
  EXPECT_EQ(t.energy_source, "counter");
  ASSERT_TRUE(t.energy_j.has_value());
  EXPECT_GE(*t.energy_j, 0);
  EXPECT_EQ(t.throttle_reasons, (std::vector<std::string>{"sw_power_cap"}));
  ASSERT_TRUE(t.sm_clock_mhz.has_value());
  EXPECT_EQ(t.sm_clock_mhz->min, 1755);
  EXPECT_EQ(t.sm_clock_mhz->max, 1980);
  // The warnings follow: the cap, the clock moving, and the fake's process 4242 at 77% SM.
  bool clock_events = false;
  bool clock_changed = false;
  bool other = false;
  for (const auto& f : c.findings) {
    clock_events = clock_events || f.id == "clock_events";
    clock_changed = clock_changed || f.id == "clock_changed";
    other = other || (f.id == "other_process" && f.evidence.find("4242") != std::string::npos);
  }
  EXPECT_TRUE(clock_events);
  EXPECT_TRUE(clock_changed);
  EXPECT_TRUE(other);
}

// A small JPEG dataset of `classes` classes.
data::Dataset jpegs(const testing::TempFolder& dir, int classes) {
  data::MakeDatasetOptions m;
  m.images = 12;
  m.classes = classes;
  EXPECT_TRUE(data::make_dataset(dir / "set", m));
  auto listed = data::list_dataset(dir / "set");
  EXPECT_TRUE(listed) << listed.status().message();
  return *listed;
}

TEST(RunSweep, DataTrainsEachConfigurationFromJpegsBesideTheSyntheticBatch) {
  testing::TempFolder dir;
  Sweep s = tiny_sweep({2, 4});
  s.data = JpegInput{jpegs(dir, 3), 2};
  std::vector<std::size_t> written;
  SweepCallbacks callbacks;
  callbacks.done = [&](const std::vector<results::Configuration>& so_far, std::size_t planned) {
    written.push_back(so_far.size());
    EXPECT_EQ(planned, 4u);
    return Status::ok();
  };
  const SweepOutcome out = run_sweep(s, {}, callbacks);
  ASSERT_TRUE(out.status.is_ok()) << out.status.message();
  ASSERT_EQ(out.configurations.size(), 4u);
  EXPECT_EQ(written, (std::vector<std::size_t>{1, 2, 3, 4}));
  for (std::size_t i = 0; i < 4; ++i) {
    const results::Configuration& c = out.configurations[i];
    EXPECT_EQ(c.status, results::RunStatus::ok) << c.error;
    EXPECT_EQ(c.settings.batch, i < 2 ? 2 : 4);
    EXPECT_EQ(c.settings.input, i % 2 == 0 ? "" : "jpeg-cpu");
    const bool has_finding =
        std::any_of(c.findings.begin(), c.findings.end(), [](const results::Finding& f) {
          return f.id == "input_bound" || f.id == "input_keeps_up";
        });
    EXPECT_EQ(has_finding, i % 2 == 1) << i;
  }
  ASSERT_EQ(out.runs[1].size(), 1u);
  const BenchResult& fed = out.runs[1].front();
  ASSERT_TRUE(fed.input);
  EXPECT_EQ(fed.input->decoder, "libjpeg-turbo");
  EXPECT_EQ(fed.input->threads, 2);
  EXPECT_EQ(fed.input->batches, fed.timed_steps());
  EXPECT_GT(fed.input->fetch_seconds, 0);
  EXPECT_NE(results::describe(results::Kind::native, out.configurations[1].settings)
                .find("input=jpeg-cpu"),
            std::string::npos);
}

TEST(RunSweep, DataWithMoreClassesThanTheModelFailsThatConfiguration) {
  testing::TempFolder dir;
  Sweep s = tiny_sweep({2});
  s.data = JpegInput{jpegs(dir, 11), 1};  // the tiny model has 10 classes
  const SweepOutcome out = run_sweep(s, {});
  ASSERT_EQ(out.configurations.size(), 2u);
  EXPECT_EQ(out.configurations[0].status, results::RunStatus::ok);
  EXPECT_EQ(out.configurations[1].status, results::RunStatus::failed);
  EXPECT_NE(out.configurations[1].error.find("11 classes, more than the model's 10"),
            std::string::npos)
      << out.configurations[1].error;
}

}  // namespace
}  // namespace dlprobe::bench
