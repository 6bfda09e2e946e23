// The largest-batch search: the exact batches it probes, from a guess in both directions, with a
// granularity, a budget, bounds, and a test that is not monotone.
#include "dlprobe/core/batch_search.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace dlprobe {
namespace {

struct Searched {
  std::vector<std::int64_t> probes;
  BatchSearch search;
};

Searched run(const BatchSearchOptions& o, const std::function<bool(std::int64_t)>& passes) {
  Searched s{{}, BatchSearch(o)};
  while (auto b = s.search.next()) {
    s.probes.push_back(*b);
    s.search.report(*b, passes(*b));
  }
  return s;
}

auto up_to(std::int64_t threshold) {
  return [threshold](std::int64_t b) { return b <= threshold; };
}

using Batches = std::vector<std::int64_t>;

TEST(BatchSearch, DoublesTheBatchThenBisects) {
  BatchSearchOptions o;
  o.guess = 16;
  o.first_step = 16;
  o.upper = 1 << 20;
  const Searched s = run(o, up_to(200));
  EXPECT_EQ(s.probes, (Batches{16, 32, 64, 128, 256, 192, 224, 208, 200, 204, 202, 201}));
  EXPECT_EQ(s.search.largest_passed(), 200);
  EXPECT_EQ(s.search.smallest_failed(), 201);
  EXPECT_TRUE(s.search.converged());
  EXPECT_EQ(s.search.probes(), 12);
}

TEST(BatchSearch, AGoodGuessCostsTwoProbesFromEitherSide) {
  BatchSearchOptions o;
  o.guess = 700;
  EXPECT_EQ(run(o, up_to(700)).probes, (Batches{700, 701}));
  o.guess = 701;
  EXPECT_EQ(run(o, up_to(700)).probes, (Batches{701, 700}));
}

TEST(BatchSearch, WalksDownFromAGuessThatFails) {
  BatchSearchOptions o;
  o.guess = 20;
  const Searched s = run(o, up_to(5));
  // 20 - 1, 19 - 2, 17 - 4, 13 - 8 brackets [5, 13]; then bisection.
  EXPECT_EQ(s.probes, (Batches{20, 19, 17, 13, 5, 9, 7, 6}));
  EXPECT_EQ(s.search.largest_passed(), 5);
  EXPECT_TRUE(s.search.converged());
}

TEST(BatchSearch, WalksUpByGrowingStepsFromAGuessThatPasses) {
  BatchSearchOptions o;
  o.guess = 10;
  const Searched s = run(o, up_to(30));
  EXPECT_EQ(s.probes, (Batches{10, 11, 13, 17, 25, 41, 33, 29, 31, 30}));
  EXPECT_EQ(s.search.largest_passed(), 30);
}

TEST(BatchSearch, BisectsToTheGranularity) {
  BatchSearchOptions o;
  o.guess = 8;
  o.first_step = 8;
  o.upper = 4096;
  o.granularity = 8;
  const Searched s = run(o, up_to(300));
  EXPECT_EQ(s.probes, (Batches{8, 16, 32, 64, 128, 256, 512, 384, 320, 288, 304, 296}));
  EXPECT_EQ(s.search.largest_passed(), 296);
  EXPECT_EQ(s.search.smallest_failed(), 304);
  EXPECT_TRUE(s.search.converged());
}

TEST(BatchSearch, EveryProbeIsAMultipleOfTheGranularity) {
  BatchSearchOptions o;
  o.guess = 16;
  o.lower = 16;
  o.first_step = 16;
  o.upper = 100;
  o.granularity = 3;
  // The bounds become 18 and 99, the walk's steps 18, 36, 72.
  const Searched all = run(o, [](std::int64_t) { return true; });
  EXPECT_EQ(all.probes, (Batches{18, 36, 72, 99}));
  EXPECT_EQ(all.search.largest_passed(), 99);
  const Searched s = run(o, up_to(50));
  EXPECT_EQ(s.probes, (Batches{18, 36, 72, 54, 45, 48, 51}));
  EXPECT_EQ(s.search.largest_passed(), 48);
  EXPECT_TRUE(s.search.converged());
}

TEST(BatchSearch, KeepsItsPromiseWhenTheTestIsNotMonotone) {
  // 6 and 7 fail but 8 passes: the walk steps over them, and the answer is a batch that passed
  // whose next batch failed.
  auto odd = [](std::int64_t b) { return b <= 5 || b == 8; };
  BatchSearchOptions o;
  o.guess = 1;
  const Searched s = run(o, odd);
  EXPECT_EQ(s.probes, (Batches{1, 2, 4, 8, 16, 12, 10, 9}));
  EXPECT_EQ(s.search.largest_passed(), 8);
  EXPECT_EQ(s.search.smallest_failed(), 9);
  EXPECT_TRUE(s.search.converged());
}

TEST(BatchSearch, StopsAtTheBudget) {
  BatchSearchOptions o;
  o.guess = 1;
  o.first_step = 1;
  o.upper = 1 << 30;
  o.max_probes = 6;
  const Searched s = run(o, up_to(1000));
  EXPECT_EQ(s.probes, (Batches{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(s.search.probes(), 6);
  EXPECT_EQ(s.search.largest_passed(), 32);
  EXPECT_FALSE(s.search.converged());
}

TEST(BatchSearch, EndsAtTheBounds) {
  BatchSearchOptions o;
  o.guess = 64;
  o.lower = 64;
  o.first_step = 64;
  o.upper = 300;
  // The lower bound failed: nothing passed, and nothing below it is tried.
  const Searched none = run(o, up_to(10));
  EXPECT_EQ(none.probes, (Batches{64}));
  EXPECT_FALSE(none.search.largest_passed());
  EXPECT_FALSE(none.search.converged());
  // Everything passes: the walk ends on the upper bound, which is the exact answer.
  const Searched all = run(o, up_to(1 << 20));
  EXPECT_EQ(all.probes, (Batches{64, 128, 256, 300}));
  EXPECT_EQ(all.search.largest_passed(), 300);
  EXPECT_TRUE(all.search.converged());
  // Batch 1 fails with the default lower bound: the walk goes down to it and stops there.
  BatchSearchOptions from4;
  from4.guess = 4;
  const Searched nothing = run(from4, up_to(0));
  EXPECT_EQ(nothing.probes, (Batches{4, 3, 1}));
  EXPECT_FALSE(nothing.search.largest_passed());
}

TEST(BatchSearch, MovesTheGuessIntoTheBounds) {
  BatchSearchOptions o;
  o.guess = -3;
  o.upper = 50;
  EXPECT_EQ(run(o, up_to(1)).probes, (Batches{1, 2}));
  o.guess = 99;
  EXPECT_EQ(run(o, up_to(50)).probes, (Batches{50}));
}

TEST(BatchSearch, FindsTheBoundaryFromAnyGuess) {
  for (std::int64_t threshold = 0; threshold <= 52; ++threshold) {
    for (std::int64_t guess = 1; guess <= 50; ++guess) {
      BatchSearchOptions o;
      o.guess = guess;
      o.upper = 50;
      const Searched s = run(o, up_to(threshold));
      const std::int64_t want = std::min<std::int64_t>(threshold, 50);
      ASSERT_EQ(s.search.largest_passed().value_or(0), want)
          << "threshold " << threshold << " guess " << guess;
      EXPECT_LE(s.probes.size(), 16u);
    }
  }
}

TEST(BatchSearch, NoOverflowNearTheTopOfTheRange) {
  BatchSearchOptions o;
  o.guess = 1;
  o.upper = INT64_MAX;
  o.max_probes = 200;
  const Searched s = run(o, [](std::int64_t) { return true; });
  EXPECT_EQ(s.search.largest_passed(), INT64_MAX);
  EXPECT_TRUE(s.search.converged());
  for (std::size_t i = 1; i < s.probes.size(); ++i) EXPECT_GT(s.probes[i], s.probes[i - 1]);
}

}  // namespace
}  // namespace dlprobe
