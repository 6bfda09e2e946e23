// Out of memory (the release-and-retry chain and the report) and the three modes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "test_util.h"

namespace dlprobe::memory {
namespace {

using namespace testing;

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

TEST(AllocatorOom, ReleasesTheCacheAndRetries) {
  auto a = make_fake_allocator({.capacity_bytes = 32 * MiB});
  auto& al = *a.allocator;
  void* medium = must_allocate(al, 3 * MiB);  // a 20 MiB segment
  must_free(al, medium);                      // cached: 12 MiB of the device is left
  void* big = must_allocate(al, 24 * MiB);    // needs the cached 20 MiB back first
  EXPECT_NE(big, nullptr);
  const auto s = al.stats();
  EXPECT_EQ(s.cache_flushes, 1);
  EXPECT_EQ(s.oom_count, 0);
  EXPECT_EQ(a.fake->free_calls(), 1);
  EXPECT_EQ(s.reserved_bytes, static_cast<std::int64_t>(24 * MiB));
  must_free(al, big);
}

TEST(AllocatorOom, FallsBackToTheSmallestSegmentThatHolds) {
  auto a = make_fake_allocator({.capacity_bytes = 10 * MiB});
  // 3 MiB would get a 20 MiB segment, which the device does not have; 4 MiB is enough.
  void* p = must_allocate(*a.allocator, 3 * MiB);
  EXPECT_EQ(a->segments().at(0).size, 4 * MiB);
  must_free(*a.allocator, p);
}

TEST(AllocatorOom, ReportsEverythingAndStaysUsable) {
  auto a = make_fake_allocator({.capacity_bytes = 32 * MiB});
  auto& al = *a.allocator;
  void* weights = must_allocate(al, 12 * MiB, Category::weights, "embed");
  void* held = must_allocate(al, 5 * MiB, Category::activations, "layer1");
  auto r = al.allocate(16 * MiB, Category::activations, "layer3.2.conv2");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::out_of_memory);
  const std::string& message = r.status().message();
  EXPECT_EQ(message.find('\n'), std::string::npos);
  for (std::string_view part :
       {"cannot allocate 16.0 MiB for activations of layer3.2.conv2", "allocated 17.0 MiB",
        "reserved 32.0 MiB", "largest free block 15.0 MiB", "device free 0 B of 32.0 MiB", "fake",
        "smaller batch", "mixed precision", "planned"}) {
    EXPECT_TRUE(contains(message, part)) << part << " not in: " << message;
  }
  const auto report = al.last_oom();
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->message(), message);
  EXPECT_EQ(report->requested_bytes, 16 * MiB);
  EXPECT_EQ(report->category, Category::activations);
  EXPECT_EQ(report->owner, "layer3.2.conv2");
  EXPECT_EQ(report->allocated_bytes, static_cast<std::int64_t>(17 * MiB));
  EXPECT_EQ(report->reserved_bytes, static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ(report->largest_free_block_bytes, static_cast<std::int64_t>(15 * MiB));
  EXPECT_EQ(report->allocated_by_category[static_cast<std::size_t>(Category::weights)],
            static_cast<std::int64_t>(12 * MiB));
  ASSERT_TRUE(report->device.has_value());
  EXPECT_EQ(report->device->total_bytes, 32 * MiB);
  EXPECT_EQ(al.stats().oom_count, 1);

  // Still usable: what fits is served, frees work, and the same request succeeds once its
  // neighbours' blocks are freed and coalesce into a block large enough.
  void* fits = must_allocate(al, 4 * MiB);
  must_free(al, held);
  must_free(al, fits);
  void* retry = must_allocate(al, 16 * MiB, Category::activations, "layer3.2.conv2");
  EXPECT_EQ(a.fake->allocate_calls(), 3) << "two segments, one failed attempt, then reuse";
  for (void* p : {weights, retry}) must_free(al, p);
  EXPECT_EQ(al.stats().all.live_count, 0);
}

// With a planned arena live, the planned memory mode is in use already: not offered as a remedy.
TEST(AllocatorOom, DoesNotOfferThePlannedModeToAPlannedStep) {
  auto a = make_fake_allocator({.capacity_bytes = 32 * MiB});
  auto& al = *a.allocator;
  void* arena = must_allocate(al, 20 * MiB, Category::arena, "planned arena");
  auto r = al.allocate(16 * MiB, Category::workspace, "conv2d_forward");
  ASSERT_FALSE(r.has_value());
  const std::string& message = r.status().message();
  EXPECT_TRUE(contains(message, "try a smaller batch or mixed precision (bf16/fp16)")) << message;
  EXPECT_FALSE(contains(message, "planned memory mode")) << message;
  must_free(al, arena);
}

// The owner's advice: no mixed precision to a step already in it, and one more thing to try.
TEST(AllocatorOom, SuggestsWhatItsOwnerAdvises) {
  auto a = make_fake_allocator({.capacity_bytes = 32 * MiB});
  auto& al = *a.allocator;
  al.set_oom_advice({.mixed_precision = true, .also = "recomputing the block outputs"});
  auto r = al.allocate(40 * MiB, Category::activations, "layer1.0.conv1");
  ASSERT_FALSE(r.has_value());
  EXPECT_TRUE(contains(r.status().message(),
                       "try a smaller batch, the planned memory mode or recomputing the block "
                       "outputs"))
      << r.status().message();
  EXPECT_FALSE(contains(r.status().message(), "mixed precision")) << r.status().message();
  al.set_oom_advice({.mixed_precision = true, .also = ""});
  void* arena = must_allocate(al, 20 * MiB, Category::arena, "planned arena");
  r = al.allocate(16 * MiB, Category::workspace, "conv2d_forward");
  ASSERT_FALSE(r.has_value());
  EXPECT_TRUE(r.status().message().ends_with("try a smaller batch")) << r.status().message();
  must_free(al, arena);
}

TEST(AllocatorOom, SaysWhenTheCacheIsFragmented) {
  auto a = make_fake_allocator({.capacity_bytes = 40 * MiB});
  auto& al = *a.allocator;
  // Two full 20 MiB segments, then an 8 MiB hole punched in each: 16 MiB free, 8 MiB at most in
  // one place, and the device has nothing left.
  std::vector<void*> holes;
  std::vector<void*> pins;
  for (int i = 0; i < 2; ++i) {
    holes.push_back(must_allocate(al, 8 * MiB));
    pins.push_back(must_allocate(al, 8 * MiB));
    pins.push_back(must_allocate(al, 4 * MiB));
  }
  EXPECT_EQ(a.fake->live_bytes(), 40 * MiB);
  for (void* p : holes) must_free(al, p);
  auto r = al.allocate(10 * MiB, Category::activations);
  ASSERT_FALSE(r.has_value());
  EXPECT_TRUE(contains(r.status().message(), "fragmented")) << r.status().message();
  EXPECT_EQ(al.last_oom()->cached_free_bytes, static_cast<std::int64_t>(16 * MiB));
  for (void* p : pins) must_free(al, p);
}

TEST(AllocatorOom, AbsurdRequestsFailCleanly) {
  auto a = make_fake_allocator();
  auto r = a->allocate(~std::size_t{0}, Category::temporaries, "x");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::out_of_memory);
  EXPECT_EQ(a.fake->allocate_calls(), 0);
}

TEST(AllocatorOom, NoDeviceFigureWhenTheSourceCannotTell) {
  auto a = make_fake_allocator({.capacity_bytes = 4 * MiB, .report_memory_info = false});
  auto r = a->allocate(8 * MiB, Category::input);
  ASSERT_FALSE(r.has_value());
  EXPECT_FALSE(contains(r.status().message(), "device free")) << r.status().message();
  EXPECT_EQ(a->last_oom()->device, std::nullopt);
}

TEST(AllocatorLimit, CapsReservedBytesAtLimitLessOverhead) {
  // A 64 MiB "card" of which 24 MiB goes to context and library workspaces: 40 MiB to reserve.
  auto a = make_fake_allocator(
      {}, {.mode = Mode::limit, .limit_bytes = 64 * MiB, .overhead_bytes = 24 * MiB});
  auto& al = *a.allocator;
  EXPECT_EQ(al.reserve_cap(), 40 * MiB);
  void* big = must_allocate(al, 30 * MiB);
  auto r = al.allocate(12 * MiB, Category::gradients, "fc");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::out_of_memory);
  EXPECT_TRUE(contains(r.status().message(), "limit 64.0 MiB reached")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "24.0 MiB overhead")) << r.status().message();
  // 8 MiB would prefer a 20 MiB segment, which the limit forbids; an 8 MiB one fits.
  void* fits = must_allocate(al, 8 * MiB);
  EXPECT_EQ(al.stats().reserved_bytes, static_cast<std::int64_t>(38 * MiB));
  EXPECT_LE(al.stats().reserved_bytes_peak, static_cast<std::int64_t>(40 * MiB));
  // Cached segments are released to make room under the limit, as for a full device.
  must_free(al, big);
  void* again = must_allocate(al, 32 * MiB);
  EXPECT_EQ(al.stats().cache_flushes, 1);
  EXPECT_LE(al.stats().reserved_bytes_peak, static_cast<std::int64_t>(40 * MiB));
  must_free(al, fits);
  must_free(al, again);
}

TEST(AllocatorLimit, RefusesUnclearOptions) {
  auto create = [](AllocatorOptions o) {
    return CachingAllocator::create(std::make_unique<FakeMemorySource>(), o).status().code();
  };
  EXPECT_EQ(create({.mode = Mode::limit, .limit_bytes = GiB, .overhead_bytes = GiB}),
            Errc::invalid_argument);
  EXPECT_EQ(create({.mode = Mode::limit}), Errc::invalid_argument);
  EXPECT_EQ(create({.mode = Mode::growth, .limit_bytes = GiB}), Errc::invalid_argument);
  EXPECT_EQ(create({.mode = Mode::growth, .preallocate_bytes = GiB}), Errc::invalid_argument);
  EXPECT_EQ(create({.mode = Mode::limit, .preallocate_fraction = 0.5, .limit_bytes = GiB}),
            Errc::invalid_argument);
  EXPECT_EQ(CachingAllocator::create(nullptr).status().code(), Errc::invalid_argument);
}

TEST(AllocatorPreallocate, CarvesEverythingFromOneSegment) {
  auto a = make_fake_allocator({}, {.mode = Mode::preallocate, .preallocate_bytes = 63 * MiB});
  auto& al = *a.allocator;
  EXPECT_EQ(a.fake->allocate_calls(), 1);
  EXPECT_EQ(al.stats().reserved_bytes, static_cast<std::int64_t>(64 * MiB));  // 2 MiB steps
  EXPECT_EQ(al.reserve_cap(), 64 * MiB);
  void* small = must_allocate(al, 1 * KiB);
  void* large = must_allocate(al, 40 * MiB);
  EXPECT_EQ(addr(large), addr(small) + 1 * KiB) << "one pool: carved right after";
  auto r = al.allocate(24 * MiB, Category::activations, "head");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::out_of_memory);
  EXPECT_TRUE(contains(r.status().message(), "preallocated 64.0 MiB")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "preallocate mode")) << r.status().message();
  must_free(al, small);
  must_free(al, large);
  ASSERT_TRUE(al.empty_cache().is_ok());
  EXPECT_EQ(a.fake->live_bytes(), 64 * MiB) << "the preallocated segment is kept";
  EXPECT_EQ(a.fake->allocate_calls(), 1);
  EXPECT_EQ(al.segments().at(0).blocks.size(), 1U);
  EXPECT_TRUE(al.segments()[0].preallocated);
}

TEST(AllocatorPreallocate, FractionOfTheDeviceTotal) {
  auto a = make_fake_allocator({.capacity_bytes = GiB},
                               {.mode = Mode::preallocate, .preallocate_fraction = 0.5});
  EXPECT_EQ(a->stats().reserved_bytes, static_cast<std::int64_t>(GiB / 2));

  auto no_info = CachingAllocator::create(
      std::make_unique<FakeMemorySource>(FakeMemoryConfig{.report_memory_info = false}),
      {.mode = Mode::preallocate, .preallocate_fraction = 0.5});
  EXPECT_EQ(no_info.status().code(), Errc::unavailable);
  auto too_big = CachingAllocator::create(
      std::make_unique<FakeMemorySource>(FakeMemoryConfig{.capacity_bytes = GiB}),
      {.mode = Mode::preallocate, .preallocate_bytes = 2 * GiB});
  EXPECT_EQ(too_big.status().code(), Errc::out_of_memory);
  auto both = CachingAllocator::create(
      std::make_unique<FakeMemorySource>(),
      {.mode = Mode::preallocate, .preallocate_bytes = GiB, .preallocate_fraction = 0.5});
  EXPECT_EQ(both.status().code(), Errc::invalid_argument);
  auto bad_fraction =
      CachingAllocator::create(std::make_unique<FakeMemorySource>(),
                               {.mode = Mode::preallocate, .preallocate_fraction = 1.5});
  EXPECT_EQ(bad_fraction.status().code(), Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe::memory
