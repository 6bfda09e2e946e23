// The caching policy: size classes, pools, best fit, splitting, coalescing, reuse and empty_cache.
#include <gtest/gtest.h>

#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "test_util.h"

namespace dlprobe::memory {
namespace {

using namespace testing;

const BlockInfo* block_at(const std::vector<SegmentInfo>& segments, std::uint64_t address) {
  for (const auto& s : segments) {
    for (const auto& b : s.blocks) {
      if (b.address == address) return &b;
    }
  }
  return nullptr;
}

TEST(AllocatorPolicy, RoundsRequestsTo512Bytes) {
  auto a = make_fake_allocator();
  void* one = must_allocate(*a.allocator, 1);
  void* odd = must_allocate(*a.allocator, 513);
  const auto segments = a->segments();
  ASSERT_NE(block_at(segments, addr(one)), nullptr);
  EXPECT_EQ(block_at(segments, addr(one))->size, 512U);
  EXPECT_EQ(block_at(segments, addr(odd))->size, 1024U);
  EXPECT_EQ(block_at(segments, addr(odd))->requested_bytes, 513U);
  EXPECT_EQ(addr(odd) - addr(one), 512U);
  must_free(*a.allocator, one);
  must_free(*a.allocator, odd);
}

TEST(AllocatorPolicy, SegmentSizeFollowsTheSizeClass) {
  auto a = make_fake_allocator();
  void* small = must_allocate(*a.allocator, kSmallRequestMax);       // small pool: 2 MiB segment
  void* medium = must_allocate(*a.allocator, kSmallRequestMax + 1);  // large pool: 20 MiB
  void* large = must_allocate(*a.allocator, 30 * MiB + 1);           // own 32 MiB segment
  const auto segments = a->segments();
  ASSERT_EQ(segments.size(), 3U);
  std::vector<std::pair<std::uint64_t, bool>> got;
  for (const auto& s : segments) got.emplace_back(s.size, s.small_pool);
  EXPECT_EQ(got, (std::vector<std::pair<std::uint64_t, bool>>{
                     {kSmallSegmentSize, true}, {kMediumSegmentSize, false}, {32 * MiB, false}}));
  EXPECT_EQ(a.fake->live_bytes(), 2 * MiB + 20 * MiB + 32 * MiB);
  EXPECT_EQ(a->stats().reserved_bytes, static_cast<std::int64_t>(54 * MiB));
  for (void* p : {small, medium, large}) must_free(*a.allocator, p);
}

TEST(AllocatorPolicy, SmallAndLargePoolsDoNotShareSegments) {
  auto a = make_fake_allocator();
  void* large = must_allocate(*a.allocator, 3 * MiB);  // 20 MiB segment, 17 MiB left free
  void* small = must_allocate(*a.allocator, 4 * KiB);  // must not come from those 17 MiB
  EXPECT_EQ(a->segments().size(), 2U);
  EXPECT_EQ(a.fake->allocate_calls(), 2);
  must_free(*a.allocator, large);
  must_free(*a.allocator, small);
}

TEST(AllocatorPolicy, BestFitTakesTheSmallestFreeBlockThatFits) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* b4k = must_allocate(al, 4 * KiB);
  void* sep1 = must_allocate(al, 512);
  void* b8k = must_allocate(al, 8 * KiB);
  void* sep2 = must_allocate(al, 512);
  void* b2k = must_allocate(al, 2 * KiB);
  void* sep3 = must_allocate(al, 512);
  void* twin = must_allocate(al, 2 * KiB);  // a second free 2 KiB, at a higher address
  void* sep4 = must_allocate(al, 512);
  for (void* p : {b4k, b8k, b2k, twin}) must_free(al, p);
  // Free now: 4 KiB, 8 KiB, 2 KiB, 2 KiB and the segment's large tail.
  void* got3k = must_allocate(al, 3 * KiB);
  EXPECT_EQ(addr(got3k), addr(b4k)) << "3 KiB fits 4 KiB best, not 8 KiB or the tail";
  void* got2k = must_allocate(al, 2 * KiB);
  EXPECT_EQ(addr(got2k), addr(b2k)) << "of two equal blocks, the lower address";
  void* got5k = must_allocate(al, 5 * KiB);
  EXPECT_EQ(addr(got5k), addr(b8k));
  EXPECT_EQ(a.fake->allocate_calls(), 1);
  for (void* p : {sep1, sep2, sep3, sep4, got3k, got2k, got5k}) must_free(al, p);
}

TEST(AllocatorPolicy, SplitsSmallBlocksAndLeavesTheRestFree) {
  auto a = make_fake_allocator();
  void* p = must_allocate(*a.allocator, 1 * KiB);
  const auto segments = a->segments();
  ASSERT_EQ(segments.size(), 1U);
  ASSERT_EQ(segments[0].blocks.size(), 2U);
  EXPECT_TRUE(segments[0].blocks[0].allocated);
  EXPECT_EQ(segments[0].blocks[0].size, 1 * KiB);
  EXPECT_FALSE(segments[0].blocks[1].allocated);
  EXPECT_EQ(segments[0].blocks[1].size, kSmallSegmentSize - 1 * KiB);
  must_free(*a.allocator, p);
}

TEST(AllocatorPolicy, LargePoolKeepsARemainderOfAtMost1MiBWithTheBlock) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* x = must_allocate(al, 3 * MiB);   // 20 MiB segment: 3 MiB + 17 MiB split off
  void* y = must_allocate(al, 17 * MiB);  // takes the rest exactly
  EXPECT_EQ(a->segments().at(0).blocks.size(), 2U);
  must_free(al, x);
  // 2.5 MiB into the free 3 MiB block: 0.5 MiB would be left, too small for the large pool.
  void* z = must_allocate(al, 5 * MiB / 2);
  EXPECT_EQ(addr(z), addr(x));
  const auto segments = a->segments();
  ASSERT_EQ(segments[0].blocks.size(), 2U);
  EXPECT_EQ(segments[0].blocks[0].size, 3 * MiB);
  const auto s = a->stats();
  EXPECT_EQ(s.all.waste_bytes(), static_cast<std::int64_t>(MiB / 2));
  // Whereas 1.5 MiB leaves 1.5 MiB, which is worth a block of its own.
  must_free(al, z);
  void* w = must_allocate(al, 3 * MiB / 2);
  EXPECT_EQ(a->segments()[0].blocks.size(), 3U);
  must_free(al, w);
  must_free(al, y);
}

TEST(AllocatorPolicy, CoalescesFreeNeighboursInEitherOrder) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* p1 = must_allocate(al, 4 * KiB);
  void* p2 = must_allocate(al, 4 * KiB);
  void* p3 = must_allocate(al, 4 * KiB);
  EXPECT_EQ(a->segments()[0].blocks.size(), 4U);
  must_free(al, p1);
  must_free(al, p3);  // merges with the free tail
  EXPECT_EQ(a->segments()[0].blocks.size(), 3U);
  must_free(al, p2);  // merges with both sides
  const auto segments = a->segments();
  ASSERT_EQ(segments[0].blocks.size(), 1U);
  EXPECT_EQ(segments[0].blocks[0].size, kSmallSegmentSize);
  EXPECT_EQ(a->stats().largest_free_block_bytes, static_cast<std::int64_t>(kSmallSegmentSize));
}

TEST(AllocatorPolicy, DoesNotCoalesceAcrossSegmentsThatTouch) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* first = must_allocate(al, kSmallRequestMax);
  void* second = must_allocate(al, kSmallRequestMax);  // fills the first segment
  void* third = must_allocate(al, kSmallRequestMax);   // a second segment, right after the first
  const auto before = a->segments();
  ASSERT_EQ(before.size(), 2U);
  ASSERT_EQ(before[0].address + before[0].size, before[1].address);
  for (void* p : {first, second, third}) must_free(al, p);
  const auto after = a->segments();
  ASSERT_EQ(after.size(), 2U);
  EXPECT_EQ(after[0].blocks.size(), 1U);
  EXPECT_EQ(after[1].blocks.size(), 1U);
  EXPECT_EQ(a->stats().largest_free_block_bytes, static_cast<std::int64_t>(kSmallSegmentSize));
}

TEST(AllocatorPolicy, ReusesCachedBlocksWithoutAskingTheSource) {
  auto a = make_fake_allocator();
  for (int i = 0; i < 1000; ++i) {
    void* small = must_allocate(*a.allocator, 12 * KiB);
    void* large = must_allocate(*a.allocator, 64 * MiB);
    must_free(*a.allocator, large);
    must_free(*a.allocator, small);
  }
  EXPECT_EQ(a.fake->allocate_calls(), 2);
  EXPECT_EQ(a.fake->free_calls(), 0);
  const auto s = a->stats();
  EXPECT_EQ(s.segment_allocations, 2);
  EXPECT_EQ(s.all.allocation_count, 2000);
}

TEST(AllocatorPolicy, EmptyCacheReturnsOnlySegmentsWithoutLiveBlocks) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* keep = must_allocate(al, 1 * KiB);
  std::vector<void*> drop;
  for (std::uint64_t size : {3 * MiB, 40 * MiB, 100 * MiB}) drop.push_back(must_allocate(al, size));
  for (void* p : drop) must_free(al, p);
  EXPECT_EQ(a.fake->live_segments(), 4U);
  ASSERT_TRUE(al.empty_cache().is_ok());
  EXPECT_EQ(a.fake->free_calls(), 3);
  EXPECT_EQ(a.fake->live_bytes(), kSmallSegmentSize);
  auto s = al.stats();
  EXPECT_EQ(s.reserved_bytes, static_cast<std::int64_t>(kSmallSegmentSize));
  EXPECT_EQ(s.segment_count, 1);
  EXPECT_EQ(s.segment_frees, 3);
  must_free(al, keep);
  ASSERT_TRUE(al.empty_cache().is_ok());
  EXPECT_EQ(a.fake->live_bytes(), 0U);
  EXPECT_EQ(al.stats().reserved_bytes, 0);
  EXPECT_EQ(al.stats().reserved_bytes_peak,
            static_cast<std::int64_t>(2 * MiB + 20 * MiB + 40 * MiB + 100 * MiB));
}

TEST(AllocatorPolicy, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  auto a = make_fake_allocator();
  auto r = a->allocate(0, Category::input);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r.value(), nullptr);
  EXPECT_TRUE(a->deallocate(nullptr).is_ok());
  EXPECT_EQ(a->stats().all.allocation_count, 0);
  EXPECT_EQ(a.fake->allocate_calls(), 0);
}

TEST(AllocatorPolicy, RejectsForeignPointersAndDoubleFrees) {
  auto a = make_fake_allocator();
  void* p = must_allocate(*a.allocator, 4 * KiB);
  int local = 0;
  EXPECT_EQ(a->deallocate(&local).code(), Errc::invalid_argument);
  // An interior pointer is not an allocation either.
  EXPECT_EQ(a->deallocate(static_cast<char*>(p) + 512).code(), Errc::invalid_argument);
  must_free(*a.allocator, p);
  EXPECT_EQ(a->deallocate(p).code(), Errc::invalid_argument);
  EXPECT_EQ(a->stats().all.free_count, 1);
}

TEST(AllocatorPolicy, DestructionReturnsEverySegment) {
  auto source = std::make_unique<FakeMemorySource>();
  FakeMemorySource* fake = source.get();
  // The fake must outlive the allocator to be inspected, so the allocator gets a forwarding source.
  class Forward final : public MemorySource {
   public:
    explicit Forward(FakeMemorySource* f) : f_(f) {}
    std::string_view name() const override { return f_->name(); }
    Result<void*> allocate(std::size_t bytes) override { return f_->allocate(bytes); }
    Status free(void* ptr, std::size_t bytes) override { return f_->free(ptr, bytes); }
    std::optional<DeviceMemoryInfo> memory_info() const override { return f_->memory_info(); }

   private:
    FakeMemorySource* f_;
  };
  {
    auto created = CachingAllocator::create(std::make_unique<Forward>(fake));
    ASSERT_TRUE(created.has_value());
    auto& al = *created.value();
    void* p = must_allocate(al, 5 * MiB);
    void* q = must_allocate(al, 5 * KiB);
    must_free(al, p);
    must_free(al, q);
    EXPECT_EQ(fake->live_segments(), 2U);
  }
  EXPECT_EQ(fake->live_segments(), 0U);
  EXPECT_EQ(fake->free_calls(), 2);
}

TEST(DeviceBuffer, FreesOnDestructionAndMoves) {
  auto a = make_fake_allocator();
  {
    auto made = a->allocate_buffer(10 * KiB, Category::activations, "block1");
    ASSERT_TRUE(made.has_value());
    DeviceBuffer buffer = std::move(made).value();
    EXPECT_TRUE(buffer);
    EXPECT_EQ(buffer.size(), 10 * KiB);
    EXPECT_EQ(buffer.category(), Category::activations);
    void* data = buffer.data();
    DeviceBuffer moved = std::move(buffer);
    EXPECT_FALSE(buffer);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
    EXPECT_EQ(moved.data(), data);
    EXPECT_EQ(a->stats().all.live_count, 1);
    DeviceBuffer other = a->allocate_buffer(KiB, Category::input).value();
    other = std::move(moved);  // frees what `other` held
    EXPECT_EQ(a->stats().all.live_count, 1);
    EXPECT_EQ(other.data(), data);
  }
  EXPECT_EQ(a->stats().all.live_count, 0);
  EXPECT_EQ(a->stats().all.free_count, 2);
  auto early = a->allocate_buffer(KiB, Category::workspace).value();
  early.reset();
  EXPECT_EQ(a->stats().all.live_count, 0);
}

}  // namespace
}  // namespace dlprobe::memory
