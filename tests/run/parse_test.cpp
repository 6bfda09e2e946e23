// The pure parts of `dlprobe run`: /proc stat lines, tree membership, the line protocol, the
// throughput regex, framework OOM messages and step statistics.
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "dlprobe/run/process_tree.h"
#include "dlprobe/run/runner.h"
#include "dlprobe/run/workload_output.h"

namespace dlprobe::run {
namespace {

TEST(ProcStat, ParsesCommWithSpacesAndParentheses) {
  auto s = parse_proc_stat(
      "4242 (python3 (w) x) S 4000 4242 4000 0 -1 4194560 100 0 0 0 250 30 7 3 20 0 9 0 "
      "123456 1000000 2000 18446744073709551615");
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->pid, 4242);
  EXPECT_EQ(s->comm, "python3 (w) x");
  EXPECT_EQ(s->state, 'S');
  EXPECT_EQ(s->ppid, 4000);
  EXPECT_EQ(s->pgid, 4242);
  EXPECT_EQ(s->utime, 250u);
  EXPECT_EQ(s->stime, 30u);
  EXPECT_EQ(s->cutime, 7u);
  EXPECT_EQ(s->cstime, 3u);
  EXPECT_EQ(s->starttime, 123456u);
}

TEST(ProcStat, RefusesTruncatedLines) {
  EXPECT_FALSE(parse_proc_stat("12 (x) S 1 12"));
  EXPECT_FALSE(parse_proc_stat("garbage"));
  EXPECT_FALSE(parse_proc_stat("x (y) S 1 1 1 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 5"));
}

ProcStat proc(int pid, int ppid, int pgid) {
  ProcStat p;
  p.pid = pid;
  p.ppid = ppid;
  p.pgid = pgid;
  return p;
}

TEST(TreePids, DescendantsAndGroupMembers) {
  // 10 -> 11 -> 12; 13 re-parented to init but still in group 10; 20 unrelated.
  const std::vector<ProcStat> all{proc(1, 0, 1),    proc(10, 5, 10), proc(11, 10, 10),
                                  proc(12, 11, 12), proc(13, 1, 10), proc(20, 1, 20)};
  EXPECT_EQ(tree_pids(all, {10}, 10), (std::vector<int>{10, 11, 12, 13}));
  EXPECT_EQ(tree_pids(all, {10}, 0), (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(tree_pids(all, {99}, 0), std::vector<int>{});
}

TEST(TreeTracker, SeesOwnProcessCpu) {
  TreeTracker tracker({static_cast<int>(getpid())}, 0, {});
  const auto first = tracker.poll();
  EXPECT_FALSE(first.cpu_pct.has_value());
  ASSERT_EQ(first.pids, std::vector<int>{static_cast<int>(getpid())});
  EXPECT_GT(first.rss_bytes, 0u);
  // Burn 150 ms of this process's CPU time (not wall time: the machine may be busy), then the
  // tracker's figure must match CPU time over wall time within two clock ticks.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  };
  const double cpu0 = cpu_now();
  const auto wall0 = std::chrono::steady_clock::now();
  volatile double x = 0;
  while (cpu_now() - cpu0 < 0.15) x = x + 1.0;
  const auto second = tracker.poll();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  ASSERT_TRUE(second.cpu_pct.has_value());
  const double expected = 100.0 * (cpu_now() - cpu0) / wall;
  const double tick_pct = 100.0 * 2.0 / static_cast<double>(sysconf(_SC_CLK_TCK)) / wall;
  EXPECT_NEAR(*second.cpu_pct, expected, tick_pct + 5.0);
  EXPECT_GT(*second.cpu_pct, 0.0);
}

// A fake /proc: each process's stat line with its ppid, own and reaped children's ticks.
void write_stat(const std::filesystem::path& root, int pid, int ppid, std::uint64_t own,
                std::uint64_t children) {
  std::filesystem::create_directories(root / std::to_string(pid));
  // Fields 3 to 22 of proc(5): state, ppid, pgrp, 4-13 unused here, utime, stime, cutime,
  // cstime, 18-21 unused, starttime.
  std::ofstream(root / std::to_string(pid) / "stat")
      << pid << " (w) S " << ppid << " " << ppid << " 0 0 0 0 0 0 0 0 0 " << own << " 0 "
      << children << " 0 0 0 0 0 " << 1000 + pid << "\n";
}

// A child seen at 50 ticks runs 30 more and is reaped: its parent's cutime grows by all 80, of
// which only the 30 are new. Counting the whole growth again (as top would not) gave a 2-core
// machine's tree 569 % when a busy child ended.
TEST(TreeTracker, AReapedChildsTicksCountOnce) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("dlprobe_fake_proc_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  write_stat(root, 10, 1, 100, 0);
  write_stat(root, 11, 10, 50, 0);
  // And a child (`timeout`, 1 tick) whose own busy child (60 ticks) ends; the child then ends and
  // is reaped by 10 within the same interval: 10's cutime grows by 1 + 2 + 60 + 15.
  write_stat(root, 13, 10, 1, 0);
  write_stat(root, 14, 13, 60, 0);
  TreeTracker tracker({10}, 0, {}, root.string());
  const TreeReading first = tracker.poll();
  EXPECT_EQ(first.pids, (std::vector<int>{10, 11, 13, 14}));
  std::filesystem::remove_all(root / "11");
  std::filesystem::remove_all(root / "13");
  std::filesystem::remove_all(root / "14");
  write_stat(root, 10, 1, 110, 80 + 78);
  // A grandchild that started and ended between the polls, reaped by a child born after the
  // first poll: its 20 ticks count through that child's cutime.
  write_stat(root, 12, 10, 5, 20);
  const TreeReading second = tracker.poll();
  std::filesystem::remove_all(root);
  ASSERT_TRUE(second.cpu_pct && second.busiest_cpu_pct);
  const double seconds = static_cast<double>(second.timestamp_ns - first.timestamp_ns) / 1e9;
  const double per_tick = 100.0 / static_cast<double>(sysconf(_SC_CLK_TCK)) / seconds;
  // 10 of the parent's own, 30 of the reaped child's, 2 + 15 of the reaped pair's, 5 + 20 of the
  // new child's.
  EXPECT_NEAR(*second.cpu_pct, 82 * per_tick, 1e-6 * per_tick);
  EXPECT_NEAR(*second.busiest_cpu_pct, 57 * per_tick, 1e-6 * per_tick);
}

TEST(Protocol, StepLine) {
  auto r = parse_protocol_line(
      R"({"dlprobe": {"step": 12, "step_time_s": 0.041, "batch": 256, "data_time_s": 0.002,)"
      R"( "framework_peak_bytes": 1073741824, "precision": "bf16", "channels_last": true}})");
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_TRUE(r->has_value());
  const ProtocolRecord& p = **r;
  EXPECT_EQ(p.step, 12);
  EXPECT_DOUBLE_EQ(*p.step_time_s, 0.041);
  EXPECT_DOUBLE_EQ(*p.data_time_s, 0.002);
  EXPECT_EQ(p.batch, 256);
  EXPECT_EQ(p.framework_peak_bytes, 1073741824u);
  EXPECT_EQ(p.precision, "bf16");
  EXPECT_EQ(p.channels_last, true);
  EXPECT_FALSE(p.end);
}

TEST(Protocol, RateAliasesEndMarkerPrefixAndUnknownKeys) {
  auto r = parse_protocol_line(R"(INFO:root: {"dlprobe": {"images_per_s": 6100, "new_key": 1}})");
  ASSERT_TRUE(r && r->has_value());
  EXPECT_DOUBLE_EQ(*(*r)->items_per_s, 6100);
  auto end = parse_protocol_line(R"({"dlprobe": {"end": true}})");
  ASSERT_TRUE(end && end->has_value());
  EXPECT_TRUE((*end)->end);
  auto oom = parse_protocol_line(R"({"dlprobe": {"oom": true, "message": "CUDA OOM"}})");
  ASSERT_TRUE(oom && oom->has_value());
  EXPECT_EQ((*oom)->oom, true);
}

TEST(Protocol, OtherLinesAreNotProtocol) {
  auto r = parse_protocol_line("Epoch 1/10 loss 0.3 {\"other\": 1}");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_value());
}

TEST(Protocol, MalformedLinesAreErrors) {
  EXPECT_FALSE(parse_protocol_line(R"({"dlprobe": {"step": 1)"));
  EXPECT_FALSE(parse_protocol_line(R"({"dlprobe": 5})"));
  EXPECT_FALSE(parse_protocol_line(R"({"dlprobe": {"step": "one"}})"));
  EXPECT_FALSE(parse_protocol_line(R"({"dlprobe": {"step_time_s": -1}})"));
  EXPECT_FALSE(parse_protocol_line(R"({"dlprobe": {"batch": 0}})"));
  EXPECT_FALSE(parse_protocol_line(R"({"dlprobe": {"end": "yes"}})"));
}

TEST(ThroughputRegex, NamedGroups) {
  auto re = ThroughputRegex::compile(R"(step (?<step>\d+).* (?<ips>[0-9.]+) img/s)");
  ASSERT_TRUE(re) << re.status().message();
  auto m = re->match("step 7 | loss 0.1 | 1234.5 img/s");
  ASSERT_TRUE(m);
  EXPECT_DOUBLE_EQ(*m->items_per_s, 1234.5);
  EXPECT_EQ(m->step, 7);
  EXPECT_FALSE(re->match("epoch done"));

  auto py = ThroughputRegex::compile(R"(time (?P<step_s>[0-9.]+)s \((?:avg)\))");
  ASSERT_TRUE(py) << py.status().message();
  auto t = py->match("iter 3 time 0.25s (avg)");
  ASSERT_TRUE(t);
  EXPECT_DOUBLE_EQ(*t->step_time_s, 0.25);
  EXPECT_FALSE(t->items_per_s);
}

TEST(ThroughputRegex, PlainGroupAndClassesWithParentheses) {
  auto re = ThroughputRegex::compile(R"([(]x[)] ([0-9.]+) samples/sec)");
  ASSERT_TRUE(re) << re.status().message();
  auto m = re->match("(x) 99.5 samples/sec");
  ASSERT_TRUE(m);
  EXPECT_DOUBLE_EQ(*m->items_per_s, 99.5);
}

TEST(ThroughputRegex, BadPatterns) {
  EXPECT_FALSE(ThroughputRegex::compile("no group here"));
  EXPECT_FALSE(ThroughputRegex::compile("(?<speed>[0-9]+)"));
  EXPECT_FALSE(ThroughputRegex::compile("([0-9]+"));
  EXPECT_FALSE(ThroughputRegex::compile("(?<ips[0-9]+)"));
}

TEST(Oom, FrameworkMessages) {
  struct Sample {
    const char* line;
    Framework framework;
  };
  const Sample samples[] = {
      {"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 79.15 GiB of which 1.2 GiB is free.",
       Framework::pytorch},
      {"RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
       "capacity)",
       Framework::pytorch},
      {"OutOfMemoryError: CUDA error: out of memory", Framework::pytorch},
      {"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
       "tensor with shape[256,64,112,112] and type float on "
       "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:Conv2D]",
       Framework::tensorflow},
      {"  (0) Resource exhausted: OOM when allocating tensor with shape[512,2048,7,7]",
       Framework::tensorflow},
      {"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
       "allocate 25769803776 bytes.",
       Framework::jax},
      {"2024-01-01 12:00:00.000000: W external/xla/xla/service/gpu/... RESOURCE_EXHAUSTED: Out "
       "of memory allocating 123 bytes",
       Framework::jax},
      {"RuntimeError: CUDA error: out of memory", Framework::unknown},
  };
  for (const auto& s : samples) {
    auto m = detect_oom(s.line);
    ASSERT_TRUE(m) << s.line;
    EXPECT_EQ(m->framework, s.framework) << s.line;
  }
}

TEST(Oom, OrdinaryLinesAreNot) {
  EXPECT_FALSE(detect_oom("Epoch 1: loss 0.5, 1200 img/s"));
  EXPECT_FALSE(detect_oom("RuntimeError: Expected all tensors to be on the same device"));
  EXPECT_FALSE(detect_oom("jaxlib.xla_extension.XlaRuntimeError: INVALID_ARGUMENT: bad shape"));
  EXPECT_FALSE(detect_oom("memory use 12 GiB of 80"));
}

TEST(ErrorLines, TracebackEndings) {
  EXPECT_TRUE(looks_like_error("RuntimeError: CUDA error: an illegal memory access"));
  EXPECT_TRUE(looks_like_error("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: x"));
  EXPECT_TRUE(looks_like_error("ValueError"));
  EXPECT_TRUE(looks_like_error("F0412 12:00:00.000 1234 cuda_dnn.cc:100] Check failed"));
  EXPECT_TRUE(looks_like_error("terminate called after throwing an instance of 'c10::Error'"));
  EXPECT_FALSE(looks_like_error("step 3: no Error here"));
  EXPECT_FALSE(looks_like_error("Errors: 0"));
}

// libstdc++'s std::regex recurses once per character matched: a line of a few ten thousand
// characters (a progress bar without '\r', a dumped tensor) overflowed the stack.
TEST(WorkloadOutput, HugeLinesAreMatchedWithoutRecursion) {
  const std::string word(1 << 20, 'a');
  EXPECT_FALSE(looks_like_error(word));
  EXPECT_TRUE(looks_like_error(word + "Error: boom"));
  EXPECT_FALSE(looks_like_error(word + "Error" + word));

  auto re = ThroughputRegex::compile("(?<ips>[0-9.]+) img/s");
  ASSERT_TRUE(re) << re.status().message();
  const std::string digits(1 << 20, '7');
  EXPECT_FALSE(re->match(digits));
  auto m = re->match(word + " 12.5 img/s");
  ASSERT_TRUE(m);
  EXPECT_DOUBLE_EQ(*m->items_per_s, 12.5);
}

std::vector<StepRecord> timed_steps(int n, double step_s, std::int64_t batch) {
  std::vector<StepRecord> out;
  for (int i = 0; i < n; ++i) {
    StepRecord r;
    r.step = i;
    r.step_time_s = i < 2 ? 10 * step_s : step_s;  // slow first steps, as compilation makes them
    r.data_time_s = step_s / 10;
    r.batch = batch;
    r.arrival_s = i;
    out.push_back(r);
  }
  return out;
}

TEST(StepStats, DropsWarmupAndComputesThroughput) {
  const auto s = summarize_steps(timed_steps(12, 0.05, 100), {}, 2, std::nullopt);
  EXPECT_EQ(s.steps_seen, 12);
  EXPECT_EQ(s.warmup_dropped, 2);
  EXPECT_EQ(s.steps_measured, 10);
  EXPECT_DOUBLE_EQ(*s.items, 1000);
  EXPECT_NEAR(*s.elapsed_s, 0.5, 1e-12);
  EXPECT_NEAR(*s.items_per_s, 2000, 1e-9);
  EXPECT_NEAR(*s.step_median_s, 0.05, 1e-12);
  EXPECT_NEAR(*s.step_p90_s, 0.05, 1e-12);
  EXPECT_NEAR(*s.data_wait_share, 0.1, 1e-12);
  EXPECT_EQ(s.throughput_source, "steps");
}

// A step printed as 0 s (a coarse clock) keeps the throughput from the total time, but no per-step
// samples: the results file refuses a step of no time, which would make the run unreadable.
TEST(StepStats, AStepOfNoTimeLeavesNoSamples) {
  auto steps = timed_steps(12, 0.05, 100);
  EXPECT_EQ(summarize_steps(steps, {}, 2, std::nullopt).step_seconds.size(), 10u);
  steps[5].step_time_s = 0.0;
  const auto s = summarize_steps(steps, {}, 2, std::nullopt);
  EXPECT_TRUE(s.step_seconds.empty());
  EXPECT_NEAR(*s.items_per_s, 1000 / 0.45, 1e-9);
}

TEST(StepStats, WarmupFlagsOverrideTheCount) {
  auto steps = timed_steps(6, 0.1, 10);
  steps[0].warmup = true;
  for (std::size_t i = 1; i < steps.size(); ++i) steps[i].warmup = false;
  const auto s = summarize_steps(steps, {}, 5, std::nullopt);
  EXPECT_EQ(s.warmup_dropped, 1);
  EXPECT_EQ(s.steps_measured, 5);
}

TEST(StepStats, ArrivalTimesWithoutStepTimes) {
  std::vector<StepRecord> steps;
  for (int i = 0; i < 5; ++i) {
    StepRecord r;
    r.step = i;
    r.arrival_s = 0.5 * i;
    steps.push_back(r);
  }
  // One warm-up step (arrival 0), four measured steps ending at 2.0 s, batch 8 from --batch.
  const auto s = summarize_steps(steps, {}, 1, 8);
  EXPECT_NEAR(*s.elapsed_s, 2.0, 1e-12);
  EXPECT_NEAR(*s.items_per_s, 16.0, 1e-12);
  EXPECT_FALSE(s.step_median_s);
  // The measured window runs from the last warm-up line to the last measured line.
  EXPECT_NEAR(*s.measured_start_s, 0.0, 1e-12);
  EXPECT_NEAR(*s.measured_end_s, 2.0, 1e-12);
}

// A warm-up step between measured ones (after an evaluation): the measured steps' time is their
// own intervals, not the time since that step, and the window starts before the first of them.
TEST(StepStats, AWarmupStepMidRunLeavesOutItsOwnIntervalAlone) {
  std::vector<StepRecord> steps;
  for (int i = 0; i < 10; ++i) {
    StepRecord r;
    r.step = i;
    r.batch = 10;
    r.arrival_s = 0.2 * (i + 1);
    r.warmup = i == 0 || i == 6;
    steps.push_back(r);
  }
  const auto s = summarize_steps(steps, {}, 0, std::nullopt);
  EXPECT_EQ(s.steps_measured, 8);
  EXPECT_DOUBLE_EQ(*s.items, 80);
  EXPECT_NEAR(*s.elapsed_s, 1.6, 1e-12);
  EXPECT_NEAR(*s.items_per_s, 50, 1e-9);
  EXPECT_NEAR(*s.measured_start_s, 0.2, 1e-12);
  EXPECT_NEAR(*s.measured_end_s, 2.0, 1e-12);
  // The first line measured: no line before it to time it from, so no throughput from arrivals.
  steps[0].warmup = false;
  EXPECT_FALSE(summarize_steps(steps, {}, 0, std::nullopt).items_per_s);
}

TEST(StepStats, MeasuredWindowWithoutWarmupStartsOneStepBeforeTheFirstLine) {
  std::vector<StepRecord> steps;
  for (int i = 0; i < 3; ++i) {
    StepRecord r;
    r.step = i;
    r.step_time_s = 0.25;
    r.arrival_s = 10.0 + 0.25 * i;
    steps.push_back(r);
  }
  const auto s = summarize_steps(steps, {}, 0, 4);
  EXPECT_NEAR(*s.measured_start_s, 9.75, 1e-12);
  EXPECT_NEAR(*s.measured_end_s, 10.5, 1e-12);
}

// Steps shorter than the sampling period: the window grows evenly to the nearest samples, not to
// the whole run (whose start-up would then give the figures).
TEST(StepStats, AShortWindowWidensToItsNearestSamples) {
  const std::vector<double> samples = {0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5};
  // 0.5625..0.625 holds no sample; the nearest three are 0.5, 0.75 and 0.25 (0.3125 before it).
  const TimeWindow w = widen_to_samples({0.5625, 0.625}, samples, 3);
  EXPECT_DOUBLE_EQ(w.start_s, 0.25);
  EXPECT_DOUBLE_EQ(w.end_s, 0.9375);
  EXPECT_EQ(std::count_if(samples.begin(), samples.end(), [&](double t) { return w.holds(t); }), 3);
  // A window that holds enough already stays as it is.
  const TimeWindow wide = widen_to_samples({0.25, 0.75}, samples, 3);
  EXPECT_DOUBLE_EQ(wide.start_s, 0.25);
  EXPECT_DOUBLE_EQ(wide.end_s, 0.75);
  // Fewer samples than asked for: all of them.
  const TimeWindow all = widen_to_samples({5.0, 5.1}, {1.0, 9.0}, 3);
  EXPECT_TRUE(all.holds(1.0) && all.holds(9.0));
  // No samples: unchanged.
  const TimeWindow none = widen_to_samples({1.0, 2.0}, {}, 3);
  EXPECT_DOUBLE_EQ(none.start_s, 1.0);
  EXPECT_DOUBLE_EQ(none.end_s, 2.0);
}

TEST(StepStats, PercentilesInterpolate) {
  std::vector<StepRecord> steps;
  for (int i = 1; i <= 10; ++i) {
    StepRecord r;
    r.step_time_s = i;
    steps.push_back(r);
  }
  const auto s = summarize_steps(steps, {}, 0, 1);
  EXPECT_DOUBLE_EQ(*s.step_median_s, 5.5);
  EXPECT_DOUBLE_EQ(*s.step_p90_s, 9.1);
  EXPECT_DOUBLE_EQ(*s.step_min_s, 1);
  EXPECT_DOUBLE_EQ(*s.step_max_s, 10);
}

TEST(StepStats, ReportedRatesWhenNoSteps) {
  const auto s = summarize_steps({}, {100, 300, 200}, 5, std::nullopt);
  EXPECT_DOUBLE_EQ(*s.items_per_s, 200);
  EXPECT_EQ(s.throughput_source, "reported rate");
  const auto none = summarize_steps({}, {}, 5, std::nullopt);
  EXPECT_FALSE(none.items_per_s);
}

TEST(StepStats, NoThroughputWithoutBatch) {
  const auto s = summarize_steps(timed_steps(8, 0.1, 1), {}, 2, std::nullopt);
  EXPECT_TRUE(s.items_per_s);
  auto steps = timed_steps(8, 0.1, 1);
  for (auto& r : steps) r.batch.reset();
  const auto t = summarize_steps(steps, {}, 2, std::nullopt);
  EXPECT_FALSE(t.items_per_s);
  EXPECT_TRUE(t.step_median_s);
}

}  // namespace
}  // namespace dlprobe::run
