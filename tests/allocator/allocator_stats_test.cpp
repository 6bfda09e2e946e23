// Accounting: per-category counters, the peak snapshot, fragmentation and the flat export.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "test_util.h"

namespace dlprobe::memory {
namespace {

using namespace testing;

std::int64_t i64(std::uint64_t v) {
  return static_cast<std::int64_t>(v);
}

TEST(AllocatorStats, CountsPerCategoryAndOverall) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* w = must_allocate(al, 1000, Category::weights);                         // block 1024
  void* act1 = must_allocate(al, 3 * MiB, Category::activations);               // block 3 MiB
  void* act2 = must_allocate(al, kSmallRequestMax + 1, Category::activations);  // 1 MiB + 512
  must_free(al, act1);
  const auto s = al.stats();

  const CategoryStats& weights = s[Category::weights];
  EXPECT_EQ(weights.allocated_bytes, 1024);
  EXPECT_EQ(weights.requested_bytes, 1000);
  EXPECT_EQ(weights.waste_bytes(), 24);
  EXPECT_EQ(weights.allocation_count, 1);
  EXPECT_EQ(weights.free_count, 0);
  EXPECT_EQ(weights.live_count, 1);

  const CategoryStats& act = s[Category::activations];
  EXPECT_EQ(act.allocated_bytes, i64(MiB + 512));
  EXPECT_EQ(act.allocated_bytes_peak, i64(4 * MiB + 512));
  EXPECT_EQ(act.requested_bytes, i64(MiB + 1));
  EXPECT_EQ(act.requested_bytes_peak, i64(4 * MiB + 1));
  EXPECT_EQ(act.allocation_count, 2);
  EXPECT_EQ(act.free_count, 1);
  EXPECT_EQ(act.live_count, 1);

  EXPECT_EQ(s[Category::gradients].allocation_count, 0);
  EXPECT_EQ(s.all.allocated_bytes, weights.allocated_bytes + act.allocated_bytes);
  EXPECT_EQ(s.all.allocated_bytes_peak, i64(1024 + 4 * MiB + 512));
  EXPECT_EQ(s.all.allocation_count, 3);
  EXPECT_EQ(s.all.free_count, 1);
  EXPECT_EQ(s.all.waste_bytes(), 24 + 511);
  EXPECT_EQ(s.reserved_bytes, i64(kSmallSegmentSize + kMediumSegmentSize));
  EXPECT_EQ(s.cached_free_bytes, s.reserved_bytes - s.all.allocated_bytes);
  must_free(al, w);
  must_free(al, act2);
}

TEST(AllocatorStats, PeakSnapshotNamesTheLayerAtThePeak) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* embed = must_allocate(al, 10 * MiB, Category::weights, "embed");
  void* l1 = must_allocate(al, 4 * MiB, Category::activations, "layer1");
  void* l2 = must_allocate(al, 8 * MiB, Category::activations, "layer2");
  must_free(al, l2);
  void* l3 = must_allocate(al, 2 * MiB, Category::activations, "layer3");  // below the peak
  auto s = al.stats();
  EXPECT_EQ(s.peak.allocated_bytes, i64(22 * MiB));
  EXPECT_EQ(s.peak.owner, "layer2");
  EXPECT_EQ(s.peak.category, Category::activations);
  EXPECT_EQ(s.peak.requested_bytes, i64(8 * MiB));
  EXPECT_EQ(s.peak.allocated_by_category[static_cast<std::size_t>(Category::weights)],
            i64(10 * MiB));
  EXPECT_EQ(s.peak.allocated_by_category[static_cast<std::size_t>(Category::activations)],
            i64(12 * MiB));
  EXPECT_EQ(s.peak.reserved_bytes, s.reserved_bytes);

  // A new phase: the next peak is its own, set by whatever passes the current total.
  al.reset_peak_stats();
  s = al.stats();
  EXPECT_EQ(s.all.allocated_bytes_peak, i64(16 * MiB));
  EXPECT_EQ(s[Category::activations].allocated_bytes_peak, i64(6 * MiB));
  EXPECT_EQ(s.peak.allocated_bytes, i64(16 * MiB));
  EXPECT_EQ(s.peak.owner, "");
  void* l4 = must_allocate(al, 1 * MiB, Category::temporaries, "layer4.softmax");
  s = al.stats();
  EXPECT_EQ(s.peak.owner, "layer4.softmax");
  EXPECT_EQ(s.peak.category, Category::temporaries);
  EXPECT_EQ(s.peak.allocated_bytes, i64(17 * MiB));
  for (void* p : {embed, l1, l3, l4}) must_free(al, p);
}

TEST(AllocatorStats, FragmentationOfAConstructedLayout) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  EXPECT_EQ(al.stats().fragmentation, 0.0);
  // One small segment, filled exactly: [a 512K][s1 256K][b 256K][s2 1M].
  void* pa = must_allocate(al, 512 * KiB);
  void* s1 = must_allocate(al, 256 * KiB);
  void* pb = must_allocate(al, 256 * KiB);
  void* s2 = must_allocate(al, 1 * MiB);
  ASSERT_EQ(al.segments().size(), 1U);
  EXPECT_EQ(al.stats().cached_free_bytes, 0);
  EXPECT_EQ(al.stats().fragmentation, 0.0);
  must_free(al, pa);
  must_free(al, pb);
  auto s = al.stats();
  EXPECT_EQ(s.cached_free_bytes, i64(768 * KiB));
  EXPECT_EQ(s.largest_free_block_bytes, i64(512 * KiB));
  EXPECT_DOUBLE_EQ(s.fragmentation, 1.0 - 512.0 / 768.0);
  must_free(al, s1);  // joins both holes: one free block, no fragmentation
  s = al.stats();
  EXPECT_EQ(s.largest_free_block_bytes, i64(1 * MiB));
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);
  must_free(al, s2);
}

TEST(AllocatorStats, FlatJsonKeys) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  void* p = must_allocate(al, 3000, Category::activations, "conv1");
  void* q = must_allocate(al, 5 * MiB, Category::optimizer_state);
  must_free(al, q);
  const nlohmann::json j = to_flat_json(al.stats());
  EXPECT_EQ(j.at("allocated_bytes.activations.current"), 3072);
  EXPECT_EQ(j.at("allocated_bytes.activations.peak"), 3072);
  EXPECT_EQ(j.at("requested_bytes.activations.current"), 3000);
  EXPECT_EQ(j.at("waste_bytes.activations.current"), 72);
  EXPECT_EQ(j.at("allocated_bytes.optimizer_state.current"), 0);
  EXPECT_EQ(j.at("allocated_bytes.optimizer_state.peak"), i64(5 * MiB));
  EXPECT_EQ(j.at("allocations.optimizer_state.allocated"), 1);
  EXPECT_EQ(j.at("allocations.optimizer_state.freed"), 1);
  EXPECT_EQ(j.at("allocations.all.current"), 1);
  EXPECT_EQ(j.at("allocated_bytes.all.peak"), i64(5 * MiB + 3072));
  EXPECT_EQ(j.at("reserved_bytes.all.current"), i64(kSmallSegmentSize + kMediumSegmentSize));
  EXPECT_EQ(j.at("segments.all.current"), 2);
  EXPECT_EQ(j.at("peak.owner"), "");
  EXPECT_EQ(j.at("peak.category"), "optimizer_state");
  EXPECT_EQ(j.at("peak.allocated_bytes.activations"), 3072);
  EXPECT_TRUE(j.at("fragmentation").is_number_float());
  for (Category c : kAllCategories) {
    EXPECT_TRUE(j.contains("allocated_bytes." + std::string(category_name(c)) + ".peak"));
  }
  // Every value is a number, but the two names under peak.
  for (const auto& [key, value] : j.items()) {
    if (key == "peak.owner" || key == "peak.category") continue;
    EXPECT_TRUE(value.is_number()) << key;
  }
  must_free(al, p);
}

TEST(AllocatorStats, ReadableWhileAnotherThreadAllocates) {
  auto a = make_fake_allocator();
  auto& al = *a.allocator;
  std::atomic<bool> done{false};
  std::atomic<std::int64_t> reads{0};
  std::int64_t inconsistent = 0;
  std::thread sampler([&] {
    while (!done.load()) {
      const auto s = al.stats();
      if (s.all.allocated_bytes > s.all.allocated_bytes_peak ||
          s.all.allocated_bytes > s.reserved_bytes) {
        ++inconsistent;
      }
      ++reads;
    }
  });
  // On a loaded machine the reader may not be scheduled before the loop ends; let it start first
  // so the test checks concurrent reads rather than the scheduler.
  while (reads.load() == 0) std::this_thread::yield();
  std::vector<void*> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.size() < 50 && i % 3 != 0) {
      live.push_back(must_allocate(al, static_cast<std::uint64_t>(i % 97 + 1) * 4 * KiB));
    } else if (!live.empty()) {
      must_free(al, live.back());
      live.pop_back();
    }
  }
  done = true;
  sampler.join();
  for (void* p : live) must_free(al, p);
  EXPECT_EQ(inconsistent, 0);
}

}  // namespace
}  // namespace dlprobe::memory
