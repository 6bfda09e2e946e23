// The warm-up's steady-state test on synthetic step times (falling, flat, noisy, one slow first
// step), the unsettled start of a window, and the t interval between runs against textbook values.
#include "dlprobe/stats/steady_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dlprobe::stats {
namespace {

// The first step that the rule calls steady, or the series' size if none.
std::size_t first_steady(const std::vector<double>& series, const SteadyRule& rule = {}) {
  for (std::size_t n = 1; n <= series.size(); ++n) {
    if (steady_state(std::span(series).first(n), rule).steady) return n;
  }
  return series.size();
}

TEST(SteadyState, TooFewStepsAreNotSteady) {
  const std::vector<double> flat(9, 0.1);
  EXPECT_FALSE(steady_state(flat).steady);
  const std::vector<double> ten(10, 0.1);
  EXPECT_TRUE(steady_state(ten).steady);
}

TEST(SteadyState, FallingStepsKeepWarming) {
  // 100 ms plus a transient of 200 ms that shrinks by a fifth every step.
  std::vector<double> series;
  for (int i = 0; i < 60; ++i) series.push_back(0.1 * (1 + 2 * std::pow(0.8, i)));
  const SteadyVerdict early = steady_state(std::span(series).first(12));
  EXPECT_FALSE(early.steady);
  EXPECT_GT(early.fall, 0.02);
  EXPECT_LT(early.p_value, 0.05);
  // The halves never overlap (p = 2 / 252), so the fall decides: the older half's median (step
  // n - 8) over the newer's (step n - 3) is 1 + 2 x 0.8^(n - 8) x (1 - 0.8^5) / (1 + ...), under
  // 1.02 once 1.344 x 0.8^(n - 8) < 0.02, from n = 27.
  EXPECT_EQ(first_steady(series), 27u);
}

TEST(SteadyState, FlatStepsAreSteadyAtOnce) {
  const std::vector<double> flat(20, 0.149);
  EXPECT_EQ(first_steady(flat), 10u);
}

TEST(SteadyState, NoiseIsNotATrend) {
  // 5 % noise around a flat 149 ms, over many seeds: the rule must settle within a few steps of
  // its window every time, not wait for noise to line up.
  for (std::uint64_t seed = 1; seed <= 50; ++seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0.149, 0.149 * 0.05);
    std::vector<double> series;
    for (int i = 0; i < 40; ++i) series.push_back(noise(rng));
    EXPECT_LE(first_steady(series), 20u) << "seed " << seed;
  }
}

TEST(SteadyState, OneSlowFirstStepIsNotATrend) {
  // The CPU evaluate that reported 15.0 img/s: the first step 2,080 ms, then about 149 ms.
  std::vector<double> series = {2.080};
  for (int i = 0; i < 20; ++i) series.push_back(0.149 + 0.001 * (i % 3));
  EXPECT_EQ(first_steady(series), 10u);
  // While the slow step is the newest, nothing is steady.
  std::vector<double> late(12, 0.149);
  late.push_back(2.080);
  EXPECT_TRUE(steady_state(late).slow_last);
  EXPECT_FALSE(steady_state(late).steady);
}

TEST(SteadyState, SmallDriftIsNotWorthWaitingFor) {
  // 0.1 % faster per step: significant (the halves never overlap) but under the 2 % of fall.
  std::vector<double> series;
  for (int i = 0; i < 10; ++i) series.push_back(0.1 * (1 - 0.001 * i));
  const SteadyVerdict v = steady_state(series);
  EXPECT_LT(v.p_value, 0.05);
  EXPECT_LT(v.fall, 0.02);
  EXPECT_TRUE(v.steady);
}

TEST(UnsettledPrefix, LeadingStepsAboveTheBound) {
  EXPECT_EQ(unsettled_prefix(std::vector<double>{}, 1.5), 0u);
  EXPECT_EQ(unsettled_prefix(std::vector<double>{0.1, 0.1, 0.1}, 1.5), 0u);
  // Median 0.1; 0.3 and 0.2 lead above 0.15; a later slow step is noise, not warm-up.
  EXPECT_EQ(unsettled_prefix(std::vector<double>{0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.9}, 1.5), 2u);
  EXPECT_EQ(unsettled_prefix(std::vector<double>{0.15, 0.1, 0.1}, 1.5), 0u);
}

TEST(StudentT, QuantilesOfTheTable) {
  // Two-sided 95 % points (any statistics table).
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.7062, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.3027, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.7764, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 29), 2.0452, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 1e6), 1.9600, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.95, 10), 1.8125, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.025, 4), -2.7764, 1e-4);
  EXPECT_EQ(student_t_quantile(0.5, 3), 0);
}

TEST(RunSpread, TIntervalOverRunMeans) {
  // The H200's three calls: 7,152, 7,216 and 7,250 img/s. Mean 7,206; deviations -54, 10, 44;
  // s = sqrt((2916 + 100 + 1936) / 2) = sqrt(2476) = 49.759; half = 4.3027 x 49.759 / sqrt 3.
  const std::vector<double> runs = {7152, 7216, 7250};
  auto s = run_spread(runs);
  ASSERT_TRUE(s.has_value()) << s.status().message();
  EXPECT_EQ(s->runs, 3u);
  EXPECT_DOUBLE_EQ(s->mean, 7206);
  EXPECT_EQ(s->min, 7152);
  EXPECT_EQ(s->max, 7250);
  const double half = 4.302653 * std::sqrt(2476.0) / std::sqrt(3.0);
  EXPECT_NEAR(s->ci.low, 7206 - half, 0.01);
  EXPECT_NEAR(s->ci.high, 7206 + half, 0.01);
  EXPECT_EQ(s->level, 0.95);
}

TEST(RunSpread, RefusesTooFewRunsAndBadValues) {
  EXPECT_FALSE(run_spread(std::vector<double>{1.0}).has_value());
  EXPECT_FALSE(run_spread(std::vector<double>{1.0, NAN}).has_value());
  EXPECT_FALSE(run_spread(std::vector<double>{1.0, 0.0}).has_value());
  EXPECT_FALSE(run_spread(std::vector<double>{1.0, 2.0}, 1.0).has_value());
}

}  // namespace
}  // namespace dlprobe::stats
