// bench --repeat-process: the processes' results files merged into one, each process a run, on
// measurements made up here (the command itself runs in tests/cli/bench_cli_test.cpp).
#include "dlprobe/bench/processes.h"

#include <gtest/gtest.h>

#include "dlprobe/bench/results.h"

namespace dlprobe::bench {
namespace {

// A process's results: one configuration at batch 64 on the CPU, `runs` runs from scratch of
// `steps` steps of `seconds` each.
results::Document process(double seconds, std::size_t steps = 10, std::size_t runs = 1) {
  std::vector<BenchResult> results(runs);
  Measured m;
  m.step.model.arch = model::Arch::resnet18;
  m.step.batch = 64;
  m.device = device::Device{DeviceKind::cpu, 0};
  m.backend = device::BackendKind::reference;
  for (BenchResult& r : results) {
    r.warmup_steps = 2;
    Window w;
    for (std::size_t i = 0; i < steps; ++i) w.step_seconds.push_back(seconds);
    r.windows.push_back(std::move(w));
    m.runs.push_back(&r);
  }
  results::Document d;
  d.context.command_line = {"dlprobe", "bench", "--json", "/tmp/x/process.json"};
  d.configurations.push_back(to_configuration(m));
  return d;
}

TEST(MergeProcesses, EachProcessIsARunWithTheSpreadBetweenThem) {
  const std::vector<ProcessRun> runs = {{process(0.1), ""},          // 640 img/s
                                        {process(0.11, 10, 2), ""},  // 581.8, two runs
                                        {process(0.105, 20), ""}};   // 609.5
  const results::Document d = merge_processes(runs);
  ASSERT_EQ(d.configurations.size(), 1u);
  const results::Configuration& c = d.configurations.front();
  EXPECT_EQ(c.status, results::RunStatus::ok);
  // A process's own runs from scratch are one run of the merged file.
  EXPECT_EQ(c.samples.run_steps, (std::vector<std::int64_t>{10, 20, 20}));
  EXPECT_EQ(c.samples.step_seconds.size(), 50u);
  EXPECT_EQ(c.samples.warmup.size(), 4u);
  EXPECT_EQ(c.samples.warmup_steps, 8);
  EXPECT_EQ(c.runs_in, results::RunsIn::processes);
  ASSERT_TRUE(c.run_spread.has_value());
  EXPECT_EQ(c.run_spread->runs, 3u);
  EXPECT_NEAR(c.run_spread->min, 64 / 0.11, 1e-6);
  EXPECT_NEAR(c.run_spread->max, 640, 1e-6);
  ASSERT_TRUE(c.statistics.has_value());
  EXPECT_NEAR(c.statistics->throughput, 50 * 64 / (10 * 0.1 + 20 * 0.11 + 20 * 0.105), 1e-6);
  EXPECT_TRUE(d.findings.empty());
  const std::string text = processes_text(d, runs);
  EXPECT_NE(text.find("3 of 3 ended well"), std::string::npos) << text;
  EXPECT_NE(text.find("640.00, 581.82, 609.52 img/s; between processes 95% t interval"),
            std::string::npos)
      << text;
}

TEST(MergeProcesses, AFailedProcessIsSaidAndTheOthersKept) {
  const std::vector<ProcessRun> runs = {
      {process(0.1), ""}, {std::nullopt, "signal 11 (SIGSEGV)"}, {process(0.11), ""}};
  const results::Document d = merge_processes(runs);
  ASSERT_EQ(d.configurations.size(), 1u);
  EXPECT_EQ(d.configurations.front().samples.run_steps, (std::vector<std::int64_t>{10, 10}));
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_EQ(d.findings.front().id, "process_failed");
  EXPECT_EQ(d.findings.front().message,
            "process 2 of 3 failed (signal 11 (SIGSEGV)) and wrote no results; the others' are "
            "kept");
  EXPECT_EQ(d.findings.front().evidence, "signal 11 (SIGSEGV)");
  const std::string text = processes_text(d, runs);
  EXPECT_NE(text.find("2 of 3 ended well"), std::string::npos) << text;
  EXPECT_NE(text.find("process 2 of 3 failed (signal 11 (SIGSEGV))"), std::string::npos) << text;
  // A process that ended badly but wrote its results (a configuration that did not finish) keeps
  // them.
  const results::Document kept = merge_processes({{process(0.1), ""}, {process(0.11), "exit 1"}});
  EXPECT_EQ(kept.configurations.front().samples.run_steps, (std::vector<std::int64_t>{10, 10}));
  ASSERT_EQ(kept.findings.size(), 1u);
  EXPECT_EQ(kept.findings.front().message,
            "process 2 of 2 ended with exit 1; what it measured is kept with the others");
}

// A process that stopped before its first configuration left a results file of none: the others'
// configurations are merged all the same.
TEST(MergeProcesses, AProcessThatWroteNoConfigurationDropsNoOther) {
  results::Document none = process(0.1);
  none.configurations.clear();
  const results::Document d =
      merge_processes({{none, "signal 9 (SIGKILL)"}, {process(0.1), ""}, {process(0.11), ""}});
  ASSERT_EQ(d.configurations.size(), 1u);
  EXPECT_EQ(d.configurations.front().samples.run_steps, (std::vector<std::int64_t>{10, 10}));
}

TEST(MergeProcesses, OneProcessMeasuredGivesNoSpread) {
  const results::Document d = merge_processes({{process(0.1), ""}, {std::nullopt, "exit 2"}});
  ASSERT_EQ(d.configurations.size(), 1u);
  const results::Configuration& c = d.configurations.front();
  EXPECT_TRUE(c.samples.run_steps.empty());
  EXPECT_FALSE(c.run_spread.has_value());
  EXPECT_FALSE(c.runs_in.has_value());
  EXPECT_TRUE(merge_processes({{std::nullopt, "exit 2"}}).configurations.empty());
}

// A process gets the command without what the parent alone writes, in either form of a flag, and
// its own results file; a value that merely starts like a flag is kept.
TEST(ProcessArguments, LeaveOutWhatTheParentWrites) {
  const std::vector<std::string> own = {
      "dlprobe", "bench",          "--repeat-process", "3",           "--json=a.json", "--csv",
      "a.csv",   "--history",      "h.sqlite",         "-q",          "--overwrite",   "--batch",
      "8",       "--jsonl-like=1", "--md=a.md",        "--no-history"};
  EXPECT_EQ(
      process_arguments(own, "/tmp/p/process-1.json"),
      (std::vector<std::string>{"dlprobe", "bench", "--batch", "8", "--jsonl-like=1", "--json",
                                "/tmp/p/process-1.json", "--quiet", "--no-history"}));
}

}  // namespace
}  // namespace dlprobe::bench
