// Expected values are worked out by hand (the arithmetic is in the comments) or, for the normal
// approximation of Mann–Whitney U, by a separate 25-line Python script written from the textbook
// formulas (ranks with averaged ties, variance n1 n2 / 12 ((n + 1) - sum(t^3 - t) / (n (n - 1))),
// continuity correction 0.5, p = erfc(z / sqrt 2)), not from this code.
#include "dlprobe/stats/statistics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

namespace dlprobe::stats {
namespace {

TEST(Percentile, LinearInterpolationLikeNumpy) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 2.5);  // h = 1.5
  EXPECT_DOUBLE_EQ(percentile(v, 0.9), 3.7);  // h = 2.7: 3 + 0.7 (4 - 3)
  EXPECT_DOUBLE_EQ(percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 1.0), 4);
  // Unsorted input, h = 4 × 0.4 = 1.6 on 15, 20, 35, 40, 50: 20 + 0.6 × 15 = 29.
  const std::vector<double> w = {50, 15, 40, 20, 35};
  EXPECT_DOUBLE_EQ(percentile(w, 0.4), 29);
  EXPECT_DOUBLE_EQ(median(w), 35);
  const std::vector<double> one = {7};
  EXPECT_DOUBLE_EQ(percentile(one, 0.99), 7);
}

TEST(Spread, MadStddevCv) {
  // median 2; |x - 2| = 1 1 0 0 2 4 7, whose median is 1.
  const std::vector<double> v = {1, 1, 2, 2, 4, 6, 9};
  EXPECT_DOUBLE_EQ(mad(v), 1);
  // mean 5, squared deviations sum to 32, sample variance 32 / 7.
  const std::vector<double> w = {2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(mean(w), 5);
  EXPECT_NEAR(stddev(w), std::sqrt(32.0 / 7.0), 1e-12);
  EXPECT_NEAR(coefficient_of_variation(w), std::sqrt(32.0 / 7.0) / 5, 1e-12);
  const std::vector<double> single = {3};
  EXPECT_EQ(coefficient_of_variation(single), 0);
}

TEST(Outliers, ModifiedZScore) {
  // median 10, MAD 0.1, so the scale is 0.14826: 50 scores 270, 10.2 scores 1.35.
  const std::vector<double> v = {10, 10.1, 9.9, 10, 10.2, 9.8, 10, 50};
  EXPECT_EQ(outliers(v), (std::vector<std::size_t>{7}));
  // MAD 0: mean absolute deviation 1/6, scale 1.2533 / 6 = 0.2089; 2 scores 4.79 > 3.5.
  const std::vector<double> ties = {1, 1, 1, 1, 1, 2};
  EXPECT_EQ(outliers(ties), (std::vector<std::size_t>{5}));
  EXPECT_TRUE(outliers(ties, 5.0).empty());
  const std::vector<double> same = {1, 1, 1, 1};
  EXPECT_TRUE(outliers(same).empty());
}

TEST(Summarize, ThroughputIsTotalOverTotalNotMeanOfRates) {
  const std::vector<double> t = {0.1, 0.2, 0.3};
  const std::vector<double> n = {10, 10, 10};
  auto s = summarize(t, n);
  ASSERT_TRUE(s.has_value()) << s.status().message();
  // 30 items in 0.6 s; the mean of the rates (100, 50, 33.3) would be 61.1.
  EXPECT_DOUBLE_EQ(s->throughput, 50);
  EXPECT_DOUBLE_EQ(s->total_items, 30);
  EXPECT_NEAR(s->total_seconds, 0.6, 1e-15);
  EXPECT_DOUBLE_EQ(s->median_s, 0.2);
  EXPECT_NEAR(s->p90_s, 0.28, 1e-15);   // h = 1.8
  EXPECT_NEAR(s->p99_s, 0.298, 1e-15);  // h = 1.98
  EXPECT_DOUBLE_EQ(s->min_s, 0.1);
  EXPECT_DOUBLE_EQ(s->max_s, 0.3);
  EXPECT_NEAR(s->mad_s, 0.1, 1e-15);
  EXPECT_NEAR(s->cv, 0.5, 1e-12);  // sd 0.1, mean 0.2
  EXPECT_TRUE(s->throughput_ci.contains(s->throughput));
  // Resamples lie between all-slow (33.3/s) and all-fast (100/s).
  EXPECT_GE(s->throughput_ci.low, 100.0 / 3 - 1e-9);
  EXPECT_LE(s->throughput_ci.high, 100 + 1e-9);
  EXPECT_EQ(s->bootstrap_resamples, 2000);
  EXPECT_DOUBLE_EQ(s->ci_level, 0.95);
}

TEST(Summarize, RefusesBadInput) {
  const std::vector<double> empty;
  EXPECT_FALSE(summarize(empty, empty).has_value());
  const std::vector<double> t = {0.1, 0.2};
  const std::vector<double> one = {1};
  EXPECT_EQ(summarize(t, one).status().message(), "throughput: 2 step times but 1 item counts");
  const std::vector<double> neg = {0.1, -0.2};
  const std::vector<double> n = {1, 1};
  EXPECT_EQ(summarize(neg, n).status().message(),
            "throughput: step 1 took -0.2 s; step times must be positive");
  EXPECT_FALSE(summarize(t, n, {.resamples = 0}).has_value());
  EXPECT_FALSE(summarize(t, n, {.level = 1.0}).has_value());
}

TEST(Bootstrap, DeterministicForASeedAndExactForConstantSteps) {
  std::vector<double> t;
  std::vector<double> n;
  for (int i = 0; i < 50; ++i) {
    t.push_back(0.1 + 0.001 * (i % 7));
    n.push_back(64);
  }
  auto a = throughput_ci(t, n, {.seed = 1});
  auto b = throughput_ci(t, n, {.seed = 1});
  auto c = throughput_ci(t, n, {.seed = 2});
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->low, b->low);
  EXPECT_EQ(a->high, b->high);
  EXPECT_NE(a->low, c->low);
  EXPECT_LT(a->low, a->high);
  // Wider level, wider interval.
  auto wide = throughput_ci(t, n, {.seed = 1, .level = 0.99});
  EXPECT_LE(wide->low, a->low);
  EXPECT_GE(wide->high, a->high);

  const std::vector<double> same(10, 0.5);
  const std::vector<double> items(10, 8);
  auto exact = throughput_ci(same, items);
  EXPECT_DOUBLE_EQ(exact->low, 16);
  EXPECT_DOUBLE_EQ(exact->high, 16);
}

// Past kMaxBootstrapBlocks steps, the bootstrap resamples blocks of consecutive steps: a run of
// 5,000 steps gives the interval that its 1,000 blocks of 5 steps give as steps of their own.
TEST(Bootstrap, ResamplesBlocksOfConsecutiveStepsPastTheLimit) {
  constexpr std::size_t kSteps = 5 * kMaxBootstrapBlocks;
  std::vector<double> t;
  std::vector<double> n;
  std::vector<double> slower;
  for (std::size_t i = 0; i < kSteps; ++i) {
    // A clock that drifts: consecutive steps are alike, distant ones are not.
    t.push_back(0.1 + 0.01 * static_cast<double>(i / 250 % 4) + 0.001 * static_cast<double>(i % 7));
    n.push_back(64);
    slower.push_back(t.back() * 1.01);
  }
  std::vector<double> block_t;
  std::vector<double> block_n;
  std::vector<double> block_slower;
  for (std::size_t b = 0; b < kMaxBootstrapBlocks; ++b) {
    double sum_t = 0;
    double sum_slower = 0;
    for (std::size_t i = 5 * b; i < 5 * b + 5; ++i) {
      sum_t += t[i];
      sum_slower += slower[i];
    }
    block_t.push_back(sum_t);
    block_n.push_back(5 * 64);
    block_slower.push_back(sum_slower);
  }
  auto by_step = throughput_ci(t, n);
  auto by_block = throughput_ci(block_t, block_n);
  ASSERT_TRUE(by_step && by_block);
  EXPECT_EQ(by_step->low, by_block->low);
  EXPECT_EQ(by_step->high, by_block->high);

  auto ratio = throughput_ratio(t, n, slower, n);
  auto block_ratio = throughput_ratio(block_t, block_n, block_slower, block_n);
  ASSERT_TRUE(ratio && block_ratio);
  EXPECT_EQ(ratio->ci.low, block_ratio->ci.low);
  EXPECT_EQ(ratio->ci.high, block_ratio->ci.high);
  EXPECT_TRUE(ratio->ci.contains(ratio->ratio));
}

TEST(Ratio, OfThroughputs) {
  const std::vector<double> base(20, 0.1);
  const std::vector<double> fast(20, 0.05);
  const std::vector<double> items(20, 10);
  auto r = throughput_ratio(base, items, fast, items);
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->ratio, 2);
  EXPECT_DOUBLE_EQ(r->ci.low, 2);
  EXPECT_DOUBLE_EQ(r->ci.high, 2);

  std::vector<double> noisy;
  for (int i = 0; i < 20; ++i) noisy.push_back(0.1 + 0.01 * (i % 3));
  auto q = throughput_ratio(base, items, noisy, items);
  ASSERT_TRUE(q.has_value());
  // 200 items in 2.19 s against 200 in 2.0 s.
  EXPECT_NEAR(q->ratio, 2.0 / 2.19, 1e-12);
  EXPECT_TRUE(q->ci.contains(q->ratio));
  EXPECT_LT(q->ci.high, 1);
  EXPECT_FALSE(throughput_ratio({}, {}, noisy, items).has_value());
}

TEST(MannWhitney, ExactSmallSamples) {
  // Completely separated: 1 of C(6, 3) = 20 orderings has U = 0; two-sided 2/20.
  auto r = mann_whitney_u(std::vector<double>{1, 2, 3}, std::vector<double>{4, 5, 6});
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->exact);
  EXPECT_EQ(r->u_a, 0);
  EXPECT_EQ(r->u_b, 9);
  EXPECT_DOUBLE_EQ(r->p_value, 0.1);
  // 4 vs 4: U = 1 (only 5 > 4); P(U <= 1) = (1 + 1) / 70; two-sided 4/70.
  r = mann_whitney_u(std::vector<double>{1, 2, 3, 5}, std::vector<double>{4, 6, 7, 8});
  EXPECT_EQ(r->u_a, 1);
  EXPECT_NEAR(r->p_value, 4.0 / 70, 1e-15);
  // 3 vs 4: the counts of U = 0, 1, 2 are 1, 1, 2 (Gaussian binomial [7 choose 3]); U = 2.
  r = mann_whitney_u(std::vector<double>{1, 2, 5}, std::vector<double>{3, 4, 6, 7});
  EXPECT_EQ(r->u_a, 2);
  EXPECT_NEAR(r->p_value, 8.0 / 35, 1e-15);
  // Identical distributions interleaved: p is 1 at the centre.
  r = mann_whitney_u(std::vector<double>{1, 4}, std::vector<double>{2, 3});
  EXPECT_EQ(r->u_a, 2);
  EXPECT_DOUBLE_EQ(r->p_value, 1);
}

TEST(MannWhitney, ExactAgainstALargeSample) {
  // One value against n: U is the count of the n below it, each count equally likely, so
  // P(U <= u) = (u + 1) / (n + 1). n is a million steps, as a results file may hold.
  const std::size_t n = 1'000'000;
  std::vector<double> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<double>(i);
  auto r = mann_whitney_u(std::vector<double>{1000.5}, b);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->exact);
  EXPECT_EQ(r->u_a, 1001);
  EXPECT_NEAR(r->p_value, 2.0 * 1002 / (n + 1), 1e-15);
  // Three values against 2,000, the smaller U past n, where the orderings that would need more
  // than n below one value drop out: against the count of 0 <= x <= y <= z <= n with
  // x + y + z <= U (the counts below each of the three, in order).
  const std::size_t small = 2000;
  r = mann_whitney_u(std::vector<double>{100.5, 1000.5, 1700.5},
                     std::span<const double>(b).first(small));
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->exact);
  EXPECT_EQ(r->u_a, 101 + 1001 + 1701);
  const auto u = static_cast<std::size_t>(std::min(r->u_a, r->u_b));
  ASSERT_GT(u, small);
  double triples = 0;
  for (std::size_t x = 0; 3 * x <= u; ++x) {
    for (std::size_t y = x; x + 2 * y <= u && y <= small; ++y) {
      triples += static_cast<double>(std::min(u - x - y, small) - y + 1);
    }
  }
  const double all = static_cast<double>(small + 1) * (small + 2) * (small + 3) / 6;
  EXPECT_NEAR(r->p_value, 2 * triples / all, 1e-13);
}

TEST(MannWhitney, NormalApproximationWithTies) {
  const std::vector<double> a = {1, 2, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<double> b = {2, 5, 10, 11, 12, 13, 14, 15, 16, 17};
  auto r = mann_whitney_u(a, b);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->exact);
  EXPECT_DOUBLE_EQ(r->u_a, 12.5);
  EXPECT_NEAR(r->z, 2.8022093709233373, 1e-12);
  EXPECT_NEAR(r->p_value, 0.005075392315273926, 1e-12);
  // Symmetric in its arguments.
  auto s = mann_whitney_u(b, a);
  EXPECT_DOUBLE_EQ(s->u_a, 87.5);
  EXPECT_NEAR(s->p_value, r->p_value, 1e-15);
}

TEST(MannWhitney, NormalApproximationLargeSamples) {
  const std::vector<double> a = {0.101, 0.103, 0.099, 0.104, 0.1,
                                 0.102, 0.098, 0.105, 0.097, 0.106};
  const std::vector<double> b = {0.1015, 0.1035, 0.1045, 0.1055, 0.1065,
                                 0.1075, 0.1085, 0.1095, 0.1105, 0.1115};
  auto r = mann_whitney_u(a, b);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->exact);  // 10 each is past the exact limit
  EXPECT_DOUBLE_EQ(r->u_a, 11);
  EXPECT_NEAR(r->p_value, 0.0036105143123296014, 1e-12);
}

TEST(MannWhitney, AllEqualAndErrors) {
  auto r = mann_whitney_u(std::vector<double>(10, 1.0), std::vector<double>(12, 1.0));
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->p_value, 1);
  EXPECT_FALSE(mann_whitney_u(std::vector<double>{}, std::vector<double>{1}).has_value());
}

}  // namespace
}  // namespace dlprobe::stats
