// The static arena planner: layouts are valid, reach the lower bound where it is reachable, and
// bad input is refused.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "dlprobe/allocator/arena_plan.h"

namespace dlprobe::memory {
namespace {

constexpr std::uint64_t KiB = 1024;

ArenaPlan must_plan(const std::vector<Lifetime>& buffers) {
  Result<ArenaPlan> plan = plan_arena(buffers);
  EXPECT_TRUE(plan.has_value()) << plan.status().message();
  if (!plan) return {};
  const Status valid = check_arena_plan(buffers, *plan);
  EXPECT_TRUE(valid.is_ok()) << valid.message();
  return std::move(plan).value();
}

TEST(ArenaPlanner, EmptyAndZeroSizedBuffersTakeNoSpace) {
  EXPECT_EQ(must_plan({}).arena_bytes, 0u);
  const ArenaPlan p = must_plan({{0, 0, 3}, {0, 1, 1}});
  EXPECT_EQ(p.arena_bytes, 0u);
  EXPECT_EQ(p.peak_live_bytes, 0u);
}

TEST(ArenaPlanner, BuffersThatNeverMeetShareTheirBytes) {
  // A chain: each buffer dies before the next is born.
  const ArenaPlan p = must_plan({{100 * KiB, 0, 1}, {300 * KiB, 2, 3}, {200 * KiB, 4, 5}});
  EXPECT_EQ(p.arena_bytes, 300 * KiB);
  EXPECT_EQ(p.offsets, (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(p.peak_live_bytes, 300 * KiB);
  EXPECT_EQ(p.peak_step, 2u);
}

TEST(ArenaPlanner, BuffersLiveTogetherAreStacked) {
  // Sharing step 2 counts: lifetimes include both ends.
  const ArenaPlan p = must_plan({{64 * KiB, 0, 2}, {32 * KiB, 2, 4}, {16 * KiB, 1, 3}});
  EXPECT_EQ(p.arena_bytes, 112 * KiB);
  EXPECT_EQ(p.peak_live_bytes, 112 * KiB);
}

TEST(ArenaPlanner, SmallBuffersFillTheHoleALargeOneLeaves) {
  // A large buffer early, two that live together later: they fit where it was, best fit puts the
  // later medium one into the gap between two long-lived small ones.
  const std::vector<Lifetime> buffers = {
      {1024 * KiB, 0, 1}, {512 * KiB, 2, 3}, {512 * KiB, 2, 3}, {256 * KiB, 0, 5}};
  const ArenaPlan p = must_plan(buffers);
  EXPECT_EQ(p.peak_live_bytes, 1280 * KiB);
  EXPECT_EQ(p.arena_bytes, 1280 * KiB);
}

TEST(ArenaPlanner, SizesAndOffsetsFollowTheAlignment) {
  const std::vector<Lifetime> buffers = {{1, 0, 0}, {513, 0, 0}, {1000, 0, 0}};
  const ArenaPlan p = must_plan(buffers);
  for (std::uint64_t offset : p.offsets) EXPECT_EQ(offset % kBlockRound, 0u);
  EXPECT_EQ(p.arena_bytes, 512u + 1024u + 1024u);
  const Result<ArenaPlan> coarse = plan_arena(buffers, 4096);
  ASSERT_TRUE(coarse.has_value());
  EXPECT_EQ(coarse->arena_bytes, 3u * 4096u);
  EXPECT_TRUE(check_arena_plan(buffers, *coarse, 4096).is_ok());
}

TEST(ArenaPlanner, RandomLifetimesGiveValidLayoutsAboveTheBound) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<Lifetime> buffers;
    const int n = 1 + static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      const std::size_t first = rng() % 300;
      buffers.push_back({1 + rng() % (4 * 1024 * 1024), first, first + rng() % 40});
    }
    const ArenaPlan p = must_plan(buffers);
    EXPECT_GE(p.arena_bytes, p.peak_live_bytes);
    // Greedy best fit on random intervals stays well within twice the bound.
    EXPECT_LE(p.arena_bytes, 2 * p.peak_live_bytes) << "round " << round;
  }
}

TEST(ArenaPlanner, CheckFindsOverlapsAndStrays) {
  const std::vector<Lifetime> buffers = {{1024, 0, 2}, {1024, 1, 3}};
  ArenaPlan p = must_plan(buffers);
  ArenaPlan overlapping = p;
  overlapping.offsets = {0, 512};
  overlapping.arena_bytes = 2048;
  const Status s = check_arena_plan(buffers, overlapping);
  EXPECT_EQ(s.code(), Errc::internal);
  EXPECT_NE(s.message().find("live together"), std::string::npos) << s.message();
  ArenaPlan outside = p;
  outside.arena_bytes = 1024;
  EXPECT_EQ(check_arena_plan(buffers, outside).code(), Errc::internal);
  ArenaPlan misaligned = p;
  misaligned.offsets[1] += 8;
  misaligned.arena_bytes += 8;
  EXPECT_EQ(check_arena_plan(buffers, misaligned).code(), Errc::internal);
  ArenaPlan short_plan = p;
  short_plan.offsets.pop_back();
  EXPECT_EQ(check_arena_plan(buffers, short_plan).code(), Errc::internal);
  // The same offsets are fine when the lifetimes do not meet.
  const std::vector<Lifetime> apart = {{1024, 0, 1}, {1024, 2, 3}};
  EXPECT_TRUE(check_arena_plan(apart, ArenaPlan{{0, 0}, 1024, 1024, 0}).is_ok());
}

TEST(ArenaPlanner, RefusesBadInput) {
  EXPECT_EQ(plan_arena(std::vector<Lifetime>{{16, 3, 2}}).status().code(), Errc::invalid_argument);
  EXPECT_EQ(plan_arena(std::vector<Lifetime>{{16, 0, 0}}, 384).status().code(),
            Errc::invalid_argument);
  EXPECT_EQ(plan_arena(std::vector<Lifetime>{{kMaxRequestBytes + 1, 0, 0}}).status().code(),
            Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe::memory
