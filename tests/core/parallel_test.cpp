// parallel_for: every index once, in contiguous ranges, on several threads when the range is
// long enough and on the calling thread when it is not.
#include "dlprobe/core/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace dlprobe {
namespace {

TEST(ParallelFor, CoversEveryIndexOnceInContiguousRanges) {
  constexpr std::int64_t n = 1'000'003;
  std::vector<std::atomic<int>> hits(n);
  std::mutex mutex;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::set<std::thread::id> threads;
  parallel_for(n, 1000, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) ++hits[static_cast<std::size_t>(i)];
    const std::lock_guard lock(mutex);
    ranges.emplace_back(begin, end);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](const auto& h) { return h == 1; }));
  std::sort(ranges.begin(), ranges.end());
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().first, 0);
  EXPECT_EQ(ranges.back().second, n);
  for (std::size_t r = 1; r < ranges.size(); ++r) {
    EXPECT_EQ(ranges[r].first, ranges[r - 1].second);
    EXPECT_GE(ranges[r].second - ranges[r].first, 1000);
  }
  EXPECT_EQ(ranges.size(), threads.size());
  // As many threads as this process may use (its affinity mask, which a container narrows).
  EXPECT_EQ(ranges.size(),
            std::min<std::size_t>(static_cast<std::size_t>(usable_cores()), n / 1000));
}

TEST(ParallelFor, ShortRangeRunsOnTheCallingThread) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::thread::id where;
  parallel_for(1999, 1000, [&](std::int64_t begin, std::int64_t end) {
    ranges.emplace_back(begin, end);
    where = std::this_thread::get_id();
  });
  ASSERT_EQ(ranges.size(), 1U);
  EXPECT_EQ(ranges[0], (std::pair<std::int64_t, std::int64_t>{0, 1999}));
  EXPECT_EQ(where, std::this_thread::get_id());
  int calls = 0;
  parallel_for(0, 1000, [&](std::int64_t, std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace dlprobe
