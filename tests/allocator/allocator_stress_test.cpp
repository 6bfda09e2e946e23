// Random allocations and frees against a simple model of what should be live, on a device small
// enough that out-of-memory, cache release and fragmentation all happen.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "test_util.h"

namespace dlprobe::memory {
namespace {

using namespace testing;

struct Live {
  std::uint64_t requested;
  Category category;
  std::string owner;
};

// Every invariant that the layout and the counters must keep, checked from the outside.
void check_invariants(const CachingAllocator& al, const FakeMemorySource& fake,
                      const std::map<std::uint64_t, Live>& model) {
  const auto segments = al.segments();
  const auto s = al.stats();
  std::uint64_t reserved = 0;
  std::uint64_t largest_free = 0;
  std::array<std::int64_t, kCategoryCount> allocated{};
  std::array<std::int64_t, kCategoryCount> requested{};
  std::size_t live_blocks = 0;
  std::uint64_t previous_end = 0;
  for (const auto& seg : segments) {
    ASSERT_GE(seg.address, previous_end) << "segments overlap";
    previous_end = seg.address + seg.size;
    reserved += seg.size;
    std::uint64_t cursor = seg.address;
    bool previous_free = false;
    for (const auto& b : seg.blocks) {
      ASSERT_EQ(b.address, cursor) << "blocks must tile their segment";
      ASSERT_EQ(b.address % kBlockRound, 0U);
      cursor += b.size;
      if (!b.allocated) {
        ASSERT_FALSE(previous_free) << "two free neighbours were not coalesced";
        largest_free = std::max(largest_free, b.size);
        previous_free = true;
        continue;
      }
      previous_free = false;
      ++live_blocks;
      auto it = model.find(b.address);
      ASSERT_NE(it, model.end()) << "a live block the caller never got";
      ASSERT_EQ(b.requested_bytes, it->second.requested);
      ASSERT_GE(b.size, b.requested_bytes);
      ASSERT_EQ(b.category, it->second.category);
      ASSERT_EQ(b.owner, it->second.owner);
      allocated[static_cast<std::size_t>(b.category)] += static_cast<std::int64_t>(b.size);
      requested[static_cast<std::size_t>(b.category)] +=
          static_cast<std::int64_t>(b.requested_bytes);
    }
    ASSERT_EQ(cursor, seg.address + seg.size);
  }
  ASSERT_EQ(live_blocks, model.size());
  ASSERT_EQ(static_cast<std::uint64_t>(s.reserved_bytes), reserved);
  if (const auto cap = al.reserve_cap()) {
    ASSERT_LE(reserved, *cap);
  }
  ASSERT_EQ(fake.live_bytes(), reserved) << "every segment the source handed out is accounted";
  ASSERT_EQ(s.largest_free_block_bytes, static_cast<std::int64_t>(largest_free));
  std::int64_t all_allocated = 0;
  for (Category c : kAllCategories) {
    const auto i = static_cast<std::size_t>(c);
    ASSERT_EQ(s[c].allocated_bytes, allocated[i]) << category_name(c);
    ASSERT_EQ(s[c].requested_bytes, requested[i]) << category_name(c);
    ASSERT_GE(s[c].allocated_bytes_peak, s[c].allocated_bytes);
    all_allocated += allocated[i];
  }
  ASSERT_EQ(s.all.allocated_bytes, all_allocated);
  ASSERT_EQ(s.cached_free_bytes, s.reserved_bytes - all_allocated);
  ASSERT_EQ(s.all.live_count, static_cast<std::int64_t>(model.size()));
}

void run_stress(AllocatorOptions options, std::uint32_t seed) {
  auto a = make_fake_allocator({.capacity_bytes = 256 * MiB}, options);
  ASSERT_NE(a.allocator, nullptr);
  auto& al = *a.allocator;
  std::mt19937 rng(seed);
  std::map<std::uint64_t, Live> model;
  std::int64_t ooms = 0;
  // Sizes from bytes to tens of MiB, log-uniform, so both pools and every segment class are used.
  std::uniform_real_distribution<double> log_size(0.0, 25.0);
  for (int step = 0; step < 6000; ++step) {
    const bool allocate = model.empty() || rng() % 100 < 55;
    if (allocate) {
      const auto bytes = static_cast<std::uint64_t>(std::exp2(log_size(rng)));
      const auto category = kAllCategories[rng() % kCategoryCount];
      std::string owner = rng() % 4 == 0 ? "" : "layer" + std::to_string(rng() % 50);
      auto r = al.allocate(bytes, category, owner);
      if (!r) {
        ASSERT_EQ(r.status().code(), Errc::out_of_memory) << r.status().message();
        ++ooms;
      } else {
        const std::uint64_t address = addr(r.value());
        // No live block may overlap another.
        auto next = model.lower_bound(address);
        if (next != model.end()) {
          ASSERT_GE(next->first, address + bytes);
        }
        if (next != model.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second.requested, address);
        }
        model.emplace(address, Live{bytes, category, std::move(owner)});
      }
    } else {
      auto victim = model.begin();
      std::advance(victim, static_cast<long>(rng() % model.size()));
      ASSERT_TRUE(al.deallocate(reinterpret_cast<void*>(victim->first)).is_ok());
      model.erase(victim);
    }
    if (step % 97 == 0) {
      ASSERT_NO_FATAL_FAILURE(check_invariants(al, *a.fake, model));
    }
    if (step % 1500 == 1499) {
      ASSERT_TRUE(al.empty_cache().is_ok());
    }
  }
  ASSERT_NO_FATAL_FAILURE(check_invariants(al, *a.fake, model));
  EXPECT_GT(ooms, 0) << "the device was meant to fill up";
  EXPECT_EQ(al.stats().oom_count, ooms);
  for (const auto& [address, live] : model) {
    ASSERT_TRUE(al.deallocate(reinterpret_cast<void*>(address)).is_ok());
  }
  ASSERT_TRUE(al.empty_cache().is_ok());
  EXPECT_EQ(a.fake->live_bytes(), options.mode == Mode::preallocate ? 192 * MiB : 0U);
  const auto s = al.stats();
  EXPECT_EQ(s.all.allocated_bytes, 0);
  EXPECT_EQ(s.all.requested_bytes, 0);
  EXPECT_EQ(s.all.allocation_count, s.all.free_count);
}

TEST(AllocatorStress, GrowthModeAgainstAModel) {
  for (std::uint32_t seed : {1U, 2U, 3U}) {
    SCOPED_TRACE(seed);
    run_stress({}, seed);
  }
}

TEST(AllocatorStress, LimitModeAgainstAModel) {
  run_stress({.mode = Mode::limit, .limit_bytes = 200 * MiB, .overhead_bytes = 40 * MiB}, 4);
}

TEST(AllocatorStress, PreallocateModeAgainstAModel) {
  run_stress({.mode = Mode::preallocate, .preallocate_bytes = 192 * MiB}, 5);
}

}  // namespace
}  // namespace dlprobe::memory
