// The bench runner on the reference backend: warm-up and window protocol, timing marks, repeats,
// interrupts, hooks; the warm-up until steady on synthetic step times and on the CPU backend; and
// the figures it derives (FLOPs per image) against hand-counted values.
#include "dlprobe/bench/runner.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "bench/protocol.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::bench {
namespace {

// ResNet-18 at 32x32 with 10 classes: small enough for the reference loops, large enough to pass
// the shape checks (layer4 sees 1x1 feature maps).
engine::StepConfig tiny_step(std::int64_t batch = 2,
                             engine::StepMode mode = engine::StepMode::train) {
  engine::StepConfig c;
  c.model.arch = model::Arch::resnet18;
  c.model.image_size = 32;
  c.model.classes = 10;
  c.model.width = 16;
  c.batch = batch;
  c.mode = mode;
  return c;
}

std::unique_ptr<device::Engine> reference_engine() {
  auto e = device::Engine::open(device::Device{DeviceKind::cpu, 0}, device::BackendKind::reference);
  EXPECT_TRUE(e.has_value()) << e.status().message();
  return std::move(e).value();
}

TEST(Flops, ResNet18MatchesTheHandCount) {
  // Multiply-adds at 224x224, layer by layer (output pixels x output channels x input channels x
  // kernel area):
  //   conv1 7x7/2 3->64 at 112x112                          118,013,952
  //   layer1 four 3x3 64->64 at 56x56          4 x 115,605,504 = 462,422,016
  //   layer2..4 each: 3x3/2 first conv 57,802,752, 1x1/2 downsample 6,422,528, three 3x3 convs
  //   3 x 115,605,504 = 411,041,792 per stage                1,233,125,376
  //   fc 512 -> 1000                                             512,000
  // total 1,814,073,344 multiply-adds: the "1.8 GMACs" of the literature.
  model::ModelConfig m;
  m.arch = model::Arch::resnet18;
  const double forward = 2.0 * 1'814'073'344.0;
  auto infer = flops_per_image(m, engine::StepMode::infer);
  ASSERT_TRUE(infer.has_value());
  EXPECT_DOUBLE_EQ(*infer, forward);
  // Backward: weight gradients of every layer plus input gradients of all but conv1.
  auto train = flops_per_image(m, engine::StepMode::train);
  ASSERT_TRUE(train.has_value());
  EXPECT_DOUBLE_EQ(*train, 3 * forward - 2.0 * 118'013'952.0);
  EXPECT_DOUBLE_EQ(*flops_per_image(m, engine::StepMode::grads), *train);
}

TEST(Flops, ResNet50IsTheUsualFourGigaMacs) {
  model::ModelConfig m;
  m.arch = model::Arch::resnet50;
  auto infer = flops_per_image(m, engine::StepMode::infer);
  ASSERT_TRUE(infer.has_value());
  // 4,089,184,256 multiply-adds over convolutions and fc (torchvision's "4.09 GFLOPS").
  EXPECT_DOUBLE_EQ(*infer, 2.0 * 4'089'184'256.0);
  // Twice the side: every feature map has four times the pixels, so the convolutions cost four
  // times as much; fc (2048 -> 1000 after pooling) stays.
  m.image_size = 448;
  auto large = flops_per_image(m, engine::StepMode::infer);
  ASSERT_TRUE(large.has_value());
  EXPECT_DOUBLE_EQ(*large, 2.0 * (4 * (4'089'184'256.0 - 2'048'000.0) + 2'048'000.0));
}

TEST(Flops, ImpossibleModelIsAnError) {
  model::ModelConfig m;
  m.image_size = 0;
  EXPECT_FALSE(flops_per_image(m, engine::StepMode::train).has_value());
}

TEST(Protocol, RefusesFieldsOutOfRange) {
  EXPECT_TRUE(check_protocol({}).is_ok());
  Protocol p;
  p.min_steps = 0;
  EXPECT_NE(check_protocol(p).message().find("timed steps"), std::string::npos);
  p = {};
  p.warmup_steps = -1;
  EXPECT_NE(check_protocol(p).message().find("warm-up steps"), std::string::npos);
  p = {};
  p.min_seconds = -1;
  EXPECT_FALSE(check_protocol(p).is_ok());
  p = {};
  p.warmup_seconds = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(check_protocol(p).is_ok());
  p = {};
  p.repeat = 0;
  EXPECT_NE(check_protocol(p).message().find("repeat"), std::string::npos);
  p = {};
  p.max_steps = 3;
  EXPECT_FALSE(check_protocol(p).is_ok());
  p = {};
  p.warmup_max_steps = 4;  // below the 5 warm-up steps
  EXPECT_NE(check_protocol(p).message().find("at most 4 warm-up steps"), std::string::npos);
  p = {};
  p.max_restarts = -1;
  EXPECT_NE(check_protocol(p).message().find("restarts"), std::string::npos);
  p = {};
  p.steady.window = 3;
  EXPECT_NE(check_protocol(p).message().find("steady-state rule"), std::string::npos);
  p = {};
  p.steady.slow_step = 1.0;
  EXPECT_FALSE(check_protocol(p).is_ok());
  p = {};
  p.steady.alpha = 1.0;
  EXPECT_FALSE(check_protocol(p).is_ok());
}

// A step function that returns `times` in turn, then the last one for ever.
std::function<Result<double>()> replay(std::vector<double> times) {
  return [times = std::move(times), i = std::size_t{0}]() mutable -> Result<double> {
    const double t = times[std::min(i, times.size() - 1)];
    ++i;
    return t;
  };
}

Protocol until_steady(double seconds = 60, std::int64_t max_steps = 10'000) {
  Protocol p;
  p.until_steady = true;
  p.warmup_steps = 0;
  p.warmup_seconds = seconds;
  p.warmup_max_steps = max_steps;
  return p;
}

TEST(Warmup, OneSlowFirstStepSettlesAfterTheWindow) {
  // resnet18 at 64x64, batch 8 on two cores: 2,080 ms for the step that creates the primitives,
  // then about 149 ms.
  std::vector<double> times = {2.080};
  for (int i = 0; i < 30; ++i) times.push_back(0.149 + 0.002 * (i % 3));
  auto w = warm_up(until_steady(), replay(times), nullptr);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_TRUE(w->steady);
  EXPECT_EQ(w->step_seconds.size(), 10u);
  EXPECT_DOUBLE_EQ(w->step_seconds.front(), 2.080);
  EXPECT_NEAR(w->seconds, std::accumulate(w->step_seconds.begin(), w->step_seconds.end(), 0.0),
              1e-12);
}

TEST(Warmup, FallingTimesWarmLonger) {
  // 100 ms plus a transient that shrinks by a fifth each step: steady from step 27 (the stats
  // test works it out).
  std::vector<double> times;
  for (int i = 0; i < 60; ++i) times.push_back(0.1 * (1 + 2 * std::pow(0.8, i)));
  auto w = warm_up(until_steady(), replay(times), nullptr);
  ASSERT_TRUE(w.has_value());
  EXPECT_TRUE(w->steady);
  EXPECT_EQ(w->step_seconds.size(), 27u);
}

TEST(Warmup, BoundedByTimeAndSteps) {
  // Never steady: 5 % faster every step.
  std::vector<double> times;
  for (int i = 0; i < 1000; ++i) times.push_back(std::pow(0.95, i));
  auto by_time = warm_up(until_steady(3.0), replay(times), nullptr);
  ASSERT_TRUE(by_time.has_value());
  EXPECT_FALSE(by_time->steady);
  EXPECT_GE(by_time->seconds, 3.0);
  EXPECT_LT(by_time->seconds - by_time->step_seconds.back(), 3.0);  // the step that crossed it
  auto by_steps = warm_up(until_steady(1e9, 15), replay(times), nullptr);
  ASSERT_TRUE(by_steps.has_value());
  EXPECT_FALSE(by_steps->steady);
  EXPECT_EQ(by_steps->step_seconds.size(), 15u);
}

TEST(Warmup, FixedStepsOverrideTheTest) {
  Protocol p;
  p.warmup_steps = 3;
  p.warmup_seconds = 0;
  std::vector<double> times = {2.080, 1.5, 1.0, 0.5, 0.149};
  auto w = warm_up(p, replay(times), nullptr);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->step_seconds, (std::vector<double>{2.080, 1.5, 1.0}));
  EXPECT_FALSE(w->steady);
  // Until steady, warmup_steps is a floor.
  p = until_steady();
  p.warmup_steps = 12;
  auto floor = warm_up(p, replay({0.1}), nullptr);
  ASSERT_TRUE(floor.has_value());
  EXPECT_EQ(floor->step_seconds.size(), 12u);
}

TEST(Warmup, InterruptAndErrorsEndIt) {
  std::atomic<int> stop{1};
  auto w = warm_up(until_steady(), replay({0.1}), &stop);
  ASSERT_TRUE(w.has_value());
  EXPECT_TRUE(w->interrupted);
  EXPECT_TRUE(w->step_seconds.empty());
  auto failing = warm_up(
      until_steady(), [] { return Result<double>(invalid_argument("boom")); }, nullptr);
  ASSERT_FALSE(failing.has_value());
  EXPECT_EQ(failing.status().message(), "boom");
}

TEST(Runner, CpuWindowStartsSteady) {
  // The CPU backend (oneDNN where built) creates its primitives in the first step: warmed until
  // steady, the first timed step is within 1.5x the window's median.
  // One OpenMP thread: on a runner whose cores run other tests too, oneDNN's spinning threads make
  // step times swing by several times, which is the machine, not the warm-up.
  setenv("OMP_NUM_THREADS", "1", 1);
  const device::BackendKind kind = device::backend_built(device::BackendKind::onednn)
                                       ? device::BackendKind::onednn
                                       : device::BackendKind::reference;
  auto e = device::Engine::open(device::Device{DeviceKind::cpu, 0}, kind);
  ASSERT_TRUE(e.has_value()) << e.status().message();
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::infer);
  o.step.model.image_size = 16;
  o.protocol = until_steady(20.0);
  o.protocol.min_steps = 10;
  o.protocol.min_seconds = 0;
  // A loaded machine makes a step slow now and then, wherever it falls; restarts (each a window)
  // take the window past such a step at its start.
  o.protocol.max_restarts = 10;
  auto r = run_bench(**e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_GE(r->warmup_steps, 10);
  EXPECT_TRUE(r->until_steady);
  EXPECT_EQ(r->warmup_step_seconds.size(), static_cast<std::size_t>(r->warmup_steps));
  ASSERT_EQ(r->windows.size(), 1u);
  const std::vector<double>& t = r->windows.front().step_seconds;
  EXPECT_LE(t.front(), 1.5 * stats::median(t))
      << "first " << t.front() << " s, median " << stats::median(t) << " s, after "
      << r->warmup_steps << " warm-up steps and " << r->restarts << " restarts";
}

TEST(Runner, WindowsOfAtLeastNStepsWithTimesFromMarks) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::infer);
  o.protocol = fixed_protocol(1, 0.0, 3, 0.0, 2, 100);
  std::vector<std::string> events;
  Hooks hooks;
  hooks.window_begin = [&](int w) { events.push_back("begin " + std::to_string(w)); };
  hooks.window_end = [&](int w) { events.push_back("end " + std::to_string(w)); };
  std::vector<Progress> progress;
  hooks.progress = [&](const Progress& p) { progress.push_back(p); };
  auto r = run_bench(*e, o, hooks);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_FALSE(r->interrupted);
  EXPECT_EQ(r->warmup_steps, 1);
  ASSERT_EQ(r->windows.size(), 2u);
  EXPECT_EQ(events, (std::vector<std::string>{"begin 0", "end 0", "begin 1", "end 1"}));
  for (const Window& w : r->windows) {
    ASSERT_EQ(w.step_seconds.size(), 3u);
    double sum = 0;
    for (double t : w.step_seconds) {
      EXPECT_GT(t, 0);
      sum += t;
    }
    // The marks sit inside the window's host edges.
    EXPECT_LE(sum, static_cast<double>(w.host_end_ns - w.host_begin_ns) / 1e9);
  }
  EXPECT_EQ(r->timed_steps(), 6);
  EXPECT_EQ(r->step_seconds().size(), 6u);
  const std::vector<double> all = r->step_seconds();
  EXPECT_NEAR(r->timed_seconds(), std::accumulate(all.begin(), all.end(), 0.0), 1e-12);
  // Progress: planning first, then warm-up, then timing with a running estimate.
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.front().phase, Progress::Phase::planning);
  EXPECT_EQ(progress.back().phase, Progress::Phase::timing);
  EXPECT_EQ(progress.back().window, 1);
  EXPECT_EQ(progress.back().steps, 3);
  EXPECT_GT(progress.back().images_per_s, 0);
  // The allocator's peak covers the timed steps: weights and the forward's values.
  EXPECT_GT(r->memory[memory::Category::weights].allocated_bytes_peak, 0);
  EXPECT_GT(r->memory[memory::Category::temporaries].allocated_bytes_peak, 0);
}

TEST(Runner, WindowLastsAtLeastTheMinimumTime) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::infer);
  o.protocol = fixed_protocol(1, 0.0, 1, 0.0, 1, 100);
  auto one = run_bench(*e, o);
  ASSERT_TRUE(one.has_value()) << one.status().message();
  // Long enough for about three steps (this machine's, sanitizers and all): time, not the one
  // step asked for, decides.
  const double min_seconds = 2.5 * one->timed_seconds();
  o.protocol = fixed_protocol(0, 0.0, 1, min_seconds, 1, 100'000);
  auto r = run_bench(*e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_EQ(r->windows.size(), 1u);
  EXPECT_EQ(r->warmup_steps, 0);
  // The host decides when to stop; the marks cannot end before it has queued the last step.
  EXPECT_GE(r->timed_seconds(), min_seconds - 1e-3);
  EXPECT_GE(r->timed_steps(), 2);
}

TEST(Runner, WarmupRunsAtLeastItsTime) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::infer);
  o.protocol = fixed_protocol(1, 0.2, 1, 0.0, 1, 100);
  auto r = run_bench(*e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_GE(r->warmup_seconds, 0.2);
  EXPECT_GE(r->warmup_steps, 1);
}

TEST(Runner, InterruptKeepsTheStepsTimedSoFar) {
  auto e = reference_engine();
  std::atomic<int> stop{0};
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::infer);
  o.protocol = fixed_protocol(1, 0.0, 1000, 0.0, 3, 100'000);
  o.interrupt = &stop;
  Hooks hooks;
  hooks.progress = [&](const Progress& p) {
    if (p.phase == Progress::Phase::timing && p.steps == 2) stop = 1;
  };
  auto r = run_bench(*e, o, hooks);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_TRUE(r->interrupted);
  ASSERT_EQ(r->windows.size(), 1u);  // the second and third windows never started
  EXPECT_EQ(r->windows.front().step_seconds.size(), 2u);
}

TEST(Runner, InterruptBeforeTimingGivesNoWindow) {
  auto e = reference_engine();
  std::atomic<int> stop{1};
  BenchOptions o;
  o.step = tiny_step();
  o.interrupt = &stop;
  auto r = run_bench(*e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_TRUE(r->interrupted);
  EXPECT_TRUE(r->windows.empty());
  EXPECT_EQ(r->warmup_steps, 0);
}

TEST(Runner, EachConfigurationStartsClean) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step(2);
  o.protocol = fixed_protocol(0, 0.0, 1, 0.0, 1, 10);
  auto big = run_bench(*e, o);
  ASSERT_TRUE(big.has_value());
  o.step = tiny_step(2, engine::StepMode::infer);
  auto small = run_bench(*e, o);
  ASSERT_TRUE(small.has_value());
  // Inference holds no gradients or optimizer state, and none are left from the training step.
  EXPECT_EQ(small->memory[memory::Category::gradients].allocated_bytes_peak, 0);
  EXPECT_EQ(small->memory[memory::Category::optimizer_state].allocated_bytes_peak, 0);
  EXPECT_LT(small->memory.all.allocated_bytes_peak, big->memory.all.allocated_bytes_peak);
  // The step's memory went back to the allocator, and its cache to the source.
  EXPECT_EQ(e->allocator().stats().all.allocated_bytes, 0);
  ASSERT_TRUE(e->allocator().empty_cache().is_ok());
  EXPECT_EQ(e->allocator().stats().reserved_bytes, 0);
}

// A planned step's arena is one block to the allocator: the runner says what it holds at its
// fullest (bench_cli_test checks the text that prints it).
TEST(Runner, PlannedArenaSaysWhatItHolds) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::grads);
  o.protocol = fixed_protocol(0, 0.0, 1, 0.0, 1, 10);
  auto grown = run_bench(*e, o);
  ASSERT_TRUE(grown.has_value()) << grown.status().message();
  EXPECT_FALSE(grown->arena_fullest.has_value());
  o.step.memory_plan = engine::MemoryPlan::planned;
  auto r = run_bench(*e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_TRUE(r->arena_fullest.has_value());
  const memory::ArenaMoment& a = *r->arena_fullest;
  EXPECT_EQ(a.block_bytes(), r->memory[memory::Category::arena].allocated_bytes_peak);
  EXPECT_GT(a[memory::Category::activations], 0);
  EXPECT_GT(a.gradient_bytes, 0);
  EXPECT_FALSE(a.call_name.empty());
}

TEST(Runner, ErrorsAreOneLine) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step();
  o.weights = "/nonexistent/weights.safetensors";
  auto r = run_bench(*e, o);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  o.weights.clear();
  o.step.precision = engine::Precision::fp64;  // on an fp32 engine
  EXPECT_FALSE(run_bench(*e, o).has_value());
  o.step = tiny_step();
  o.profile_steps = -1;
  EXPECT_FALSE(run_bench(*e, o).has_value());
}

TEST(Runner, ProfileGivesATimePerCall) {
  auto e = reference_engine();
  BenchOptions o;
  o.step = tiny_step(2, engine::StepMode::infer);
  o.protocol = fixed_protocol(0, 0.0, 1, 0.0, 1, 10);
  o.profile_steps = 1;
  auto r = run_bench(*e, o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_FALSE(r->profile.empty());
  double sum = 0;
  for (const results::CallTime& t : r->profile) sum += t.ms;
  EXPECT_GT(sum, 0);
}

}  // namespace
}  // namespace dlprobe::bench
