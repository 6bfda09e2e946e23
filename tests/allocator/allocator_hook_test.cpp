// The allocation hook (events with the state after them) and limit-mode overhead updates.
#include <gtest/gtest.h>

#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "test_util.h"

namespace dlprobe::memory {
namespace {

using namespace testing;

TEST(AllocatorHook, ReportsEveryEventWithTheStateAfterIt) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  std::vector<AllocationEvent> events;
  std::vector<std::string> owners;
  al.set_hook([&](const AllocationEvent& e) {
    events.push_back(e);
    owners.emplace_back(e.owner);
  });
  void* w = must_allocate(al, 1000, Category::weights, "fc");
  void* x = must_allocate(al, 3 * MiB, Category::activations, "layer1.0.conv1");
  must_free(al, x);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0].allocation);
  EXPECT_EQ(events[0].category, Category::weights);
  EXPECT_EQ(owners[0], "fc");
  EXPECT_EQ(events[0].bytes, 1024u);
  EXPECT_EQ(events[0].requested_bytes, 1000u);
  EXPECT_EQ(events[0].allocated_bytes, 1024);
  EXPECT_EQ(events[0].requested_total_bytes, 1000);
  EXPECT_EQ(events[0].reserved_bytes, static_cast<std::int64_t>(kSmallSegmentSize));
  EXPECT_EQ(events[1].allocated_by_category[static_cast<std::size_t>(Category::activations)],
            static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(events[1].allocated_bytes, static_cast<std::int64_t>(1024 + 3 * MiB));
  // The free reports the block already merged back: the whole 20 MiB segment is one free block.
  EXPECT_FALSE(events[2].allocation);
  EXPECT_EQ(owners[2], "layer1.0.conv1");
  EXPECT_EQ(events[2].allocated_bytes, 1024);
  EXPECT_EQ(events[2].largest_free_block_bytes, static_cast<std::int64_t>(kMediumSegmentSize));
  EXPECT_EQ(events[2].largest_free_block_bytes, al.stats().largest_free_block_bytes);

  al.set_hook({});
  must_free(al, w);
  EXPECT_EQ(events.size(), 3u);
}

TEST(AllocatorHook, FailedRequestsAreNotEvents) {
  auto a = make_fake_allocator({.capacity_bytes = 4 * MiB});
  int events = 0;
  a->set_hook([&](const AllocationEvent&) { ++events; });
  EXPECT_FALSE(a->allocate(8 * MiB, Category::activations).has_value());
  EXPECT_EQ(events, 0);
}

TEST(AllocatorOverhead, ANewMeasurementMovesTheCap) {
  AllocatorOptions o;
  o.mode = Mode::limit;
  o.limit_bytes = 64 * MiB;
  o.overhead_bytes = 8 * MiB;
  auto a = make_fake_allocator({}, o);
  auto& al = *a.allocator;
  EXPECT_EQ(al.reserve_cap(), 56 * MiB);
  void* p = must_allocate(al, 30 * MiB);
  ASSERT_TRUE(al.set_overhead_bytes(20 * MiB).is_ok());
  EXPECT_EQ(al.reserve_cap(), 44 * MiB);
  EXPECT_EQ(al.options().overhead_bytes, 20 * MiB);
  // 30 MiB are reserved; an overhead that would leave less is refused and changes nothing.
  const Status refused = al.set_overhead_bytes(40 * MiB);
  EXPECT_EQ(refused.code(), Errc::out_of_memory);
  EXPECT_NE(refused.message().find("already reserved"), std::string::npos) << refused.message();
  EXPECT_EQ(al.reserve_cap(), 44 * MiB);
  EXPECT_EQ(al.set_overhead_bytes(64 * MiB).code(), Errc::out_of_memory);
  // With the cap at 44 MiB, 16 MiB more do not fit.
  EXPECT_FALSE(al.allocate(16 * MiB, Category::activations).has_value());
  must_free(al, p);
}

TEST(AllocatorOverhead, OnlyInLimitMode) {
  auto a = make_fake_allocator();
  EXPECT_EQ(a->set_overhead_bytes(1 * MiB).code(), Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe::memory
