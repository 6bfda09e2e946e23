// The steady-window detector on synthetic telemetry series.
#include <gtest/gtest.h>

#include "dlprobe/run/runner.h"

namespace dlprobe::run {
namespace {

// A GPU utilisation series sampled every `dt` seconds from t = 0.
std::vector<PhaseSample> gpu_series(const std::vector<double>& util, double dt = 0.1) {
  std::vector<PhaseSample> out;
  for (std::size_t i = 0; i < util.size(); ++i) {
    out.push_back({static_cast<double>(i) * dt, util[i], 95.0});
  }
  return out;
}

std::vector<double> repeat(double v, std::size_t n) {
  return std::vector<double>(n, v);
}

std::vector<double> join(std::initializer_list<std::vector<double>> parts) {
  std::vector<double> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(Phases, LongStartupThenBusyStretch) {
  // 7 s of start-up and autotuning at 2 %, then 3 s of timed steps at 91-100 %, then the script
  // prints its throughput and exits: the steady window is the busy stretch only.
  std::vector<double> busy;
  for (int i = 0; i < 30; ++i) busy.push_back(91.0 + (i * 7) % 10);
  const auto series = gpu_series(join({repeat(2.0, 70), busy, repeat(0.0, 5)}));
  const Phases p = find_phases(series, 10.05);
  EXPECT_EQ(p.series, "gpu_util");
  ASSERT_TRUE(p.steady.has_value()) << p.why_none;
  EXPECT_DOUBLE_EQ(p.steady->start_s, 7.0);
  EXPECT_DOUBLE_EQ(p.steady->end_s, 9.9);
  ASSERT_TRUE(p.level_pct.has_value());
  EXPECT_GE(*p.level_pct, 91.0);
  ASSERT_TRUE(p.startup_end_s.has_value());
  EXPECT_DOUBLE_EQ(*p.startup_end_s, 7.0);
}

TEST(Phases, ALoneSpikeDoesNotSetTheLevel) {
  // An autotuning burst of one sample at 100 % in start-up, then a steady 40 %.
  auto util = join({repeat(1.0, 20), {100.0}, repeat(1.0, 20), repeat(40.0, 15)});
  const Phases p = find_phases(gpu_series(util), std::nullopt);
  ASSERT_TRUE(p.steady.has_value()) << p.why_none;
  EXPECT_NEAR(p.steady->start_s, 4.1, 1e-9);
  EXPECT_NEAR(*p.level_pct, 40.0, 1e-9);
  ASSERT_TRUE(p.startup_end_s.has_value());
  EXPECT_NEAR(*p.startup_end_s, 2.0, 1e-9);  // the spike is the first activity
}

TEST(Phases, WindowEndsAtTheThroughputLine) {
  // Timed steps (2 s), the throughput line, then a longer evaluation pass at the same load: the
  // window must not run past the line.
  const auto series = gpu_series(join({repeat(3.0, 10), repeat(95.0, 20), repeat(96.0, 40)}));
  const Phases p = find_phases(series, 2.95);
  ASSERT_TRUE(p.steady.has_value()) << p.why_none;
  EXPECT_NEAR(p.steady->start_s, 1.0, 1e-9);
  EXPECT_NEAR(p.steady->end_s, 2.9, 1e-9);
}

TEST(Phases, ShortDipsDoNotSplitTheWindowLongOnesDo) {
  const auto one = gpu_series(join({repeat(90.0, 10), repeat(0.0, 2), repeat(90.0, 10)}));
  const Phases a = find_phases(one, std::nullopt);
  ASSERT_TRUE(a.steady.has_value());
  EXPECT_NEAR(a.steady->start_s, 0.0, 1e-9);
  EXPECT_NEAR(a.steady->end_s, 2.1, 1e-9);

  const auto two = gpu_series(join({repeat(90.0, 10), repeat(0.0, 3), repeat(90.0, 12)}));
  const Phases b = find_phases(two, std::nullopt);
  ASSERT_TRUE(b.steady.has_value());
  EXPECT_NEAR(b.steady->start_s, 1.3, 1e-9);  // the longer second stretch
  EXPECT_NEAR(b.steady->end_s, 2.4, 1e-9);
}

TEST(Phases, NoSteadyPhaseWhenIdleOrTooShort) {
  const Phases idle = find_phases(gpu_series(repeat(2.0, 50)), std::nullopt);
  EXPECT_FALSE(idle.steady.has_value());
  EXPECT_NE(idle.why_none.find("never above 5%"), std::string::npos) << idle.why_none;

  // Busy only after the throughput line: nothing before it to measure.
  const Phases late = find_phases(gpu_series(join({repeat(2.0, 20), repeat(95.0, 20)})), 1.5);
  EXPECT_FALSE(late.steady.has_value());

  // Two busy samples: fewer than the three a window needs.
  const Phases brief = find_phases(
      gpu_series(join({repeat(2.0, 20), repeat(95.0, 2), repeat(2.0, 20)})), std::nullopt);
  EXPECT_FALSE(brief.steady.has_value());

  const Phases none = find_phases({}, std::nullopt);
  EXPECT_FALSE(none.steady.has_value());
  EXPECT_EQ(none.series, "");
}

TEST(Phases, WorkloadCpuWithoutGpuFigures) {
  std::vector<PhaseSample> s;
  for (int i = 0; i < 30; ++i) s.push_back({i * 0.1, std::nullopt, i < 10 ? 20.0 : 380.0});
  const Phases p = find_phases(s, std::nullopt);
  EXPECT_EQ(p.series, "cpu");
  ASSERT_TRUE(p.steady.has_value());
  EXPECT_NEAR(p.steady->start_s, 1.0, 1e-9);
}

}  // namespace
}  // namespace dlprobe::run

namespace dlprobe::run {
namespace {

// The report says which seconds its figures describe and how they were found.
TEST(Phases, ReportSaysWhichWindow) {
  RunReport report;
  RunResult r;
  r.outcome = Outcome::ok;
  r.window_source = "steady phase";
  r.phases.series = "gpu_util";
  r.phases.level_pct = 97;
  r.phases.startup_end_s = 7.0;
  r.phases.steady = TimeWindow{7.0, 9.9};
  r.gpu.figures_window = r.phases.steady;
  r.gpu.util_median_pct = 96;
  report.runs.push_back(r);
  EXPECT_NE(report_table(report).find("steady window 7.0-9.9 s (found in the GPU utilisation "
                                      "telemetry; median GPU utilisation 96%)"),
            std::string::npos)
      << report_table(report);
  const std::string json = report_json(report);
  EXPECT_NE(json.find("\"source\": \"steady phase\""), std::string::npos);
  EXPECT_NE(json.find("\"steady_end_s\": 9.9"), std::string::npos);
  EXPECT_NE(json.find("\"startup_end_s\": 7.0"), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::run
