#include <gtest/gtest.h>

#include <functional>

#include "dlprobe/run/runner.h"

namespace dlprobe::run {
namespace {

TEST(Sweep, ParsesAxes) {
  auto a = parse_sweep("batch=16, 32,64");
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_EQ(a->key, "batch");
  EXPECT_EQ(a->values, (std::vector<std::string>{"16", "32", "64"}));
  EXPECT_FALSE(parse_sweep("batch"));
  EXPECT_FALSE(parse_sweep("=1,2"));
  EXPECT_FALSE(parse_sweep("batch="));
  EXPECT_FALSE(parse_sweep("ba-tch=1"));
  EXPECT_FALSE(parse_sweep("batch=1,,2"));
}

TEST(Sweep, CartesianProductFirstAxisSlowest) {
  const auto points = sweep_points({{"amp", {"fp16", "bf16"}}, {"batch", {"8", "16", "32"}}});
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0].at("amp"), "fp16");
  EXPECT_EQ(points[0].at("batch"), "8");
  EXPECT_EQ(points[2].at("batch"), "32");
  EXPECT_EQ(points[3].at("amp"), "bf16");
  EXPECT_EQ(sweep_points({}).size(), 1u);
}

TEST(Sweep, SubstitutesOnlyKnownKeys) {
  const std::vector<std::string> argv{"python3",         "train.py",        "--batch={batch}",
                                      "{batch}x{batch}", "print({'a': 1})", "{other}"};
  const auto out = substitute(argv, {{"batch", "64"}});
  EXPECT_EQ(out, (std::vector<std::string>{"python3", "train.py", "--batch=64", "64x64",
                                           "print({'a': 1})", "{other}"}));
  EXPECT_TRUE(mentions(argv, "batch"));
  EXPECT_FALSE(mentions(argv, "amp"));
}

// Runs the search against "batches up to `max_ok` run".
std::pair<std::optional<std::int64_t>, std::vector<std::int64_t>> search(MaxBatchSearch s,
                                                                         std::int64_t max_ok) {
  std::vector<std::int64_t> tried;
  while (auto b = s.next()) {
    tried.push_back(*b);
    s.report(*b, *b <= max_ok);
  }
  return {s.largest_ok(), tried};
}

TEST(MaxBatch, DoublesThenBisects) {
  auto [best, tried] = search(MaxBatchSearch(16, 1 << 20, 1, 30), 200);
  EXPECT_EQ(best, 200);
  EXPECT_EQ(tried[0], 16);
  EXPECT_EQ(tried[1], 32);
  EXPECT_EQ(tried[4], 256);  // first failure
  EXPECT_EQ(tried[5], 192);  // then bisection between 128 and 256
  EXPECT_LE(tried.size(), 5u + 8u);
}

TEST(MaxBatch, Granularity) {
  MaxBatchSearch s(8, 4096, 8, 30);
  auto [best, tried] = search(s, 300);
  EXPECT_EQ(best, 296);
  for (auto b : tried) EXPECT_EQ(b % 8, 0) << b;
}

TEST(MaxBatch, BoundedRunsAndConvergence) {
  MaxBatchSearch s(1, 1 << 30, 1, 6);
  while (auto b = s.next()) s.report(*b, *b <= 1000);
  EXPECT_EQ(s.runs(), 6);
  EXPECT_FALSE(s.converged());
  EXPECT_EQ(s.largest_ok(), 32);

  MaxBatchSearch done(16, 1 << 20, 1, 40);
  while (auto b = done.next()) done.report(*b, *b <= 100);
  EXPECT_TRUE(done.converged());
  EXPECT_EQ(done.largest_ok(), 100);
  EXPECT_EQ(done.smallest_failed(), 101);
}

TEST(MaxBatch, StartFailsOrLimitReached) {
  auto [none, tried] = search(MaxBatchSearch(64, 1024, 1, 10), 10);
  EXPECT_FALSE(none);
  EXPECT_EQ(tried, std::vector<std::int64_t>{64});
  MaxBatchSearch capped(64, 300, 1, 10);
  auto [best, t2] = search(capped, 1 << 20);
  EXPECT_EQ(best, 300);
  EXPECT_EQ(t2.back(), 300);
}

}  // namespace
}  // namespace dlprobe::run
