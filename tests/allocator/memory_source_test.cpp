// The fake and host sources, and the allocator over real host memory.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"
#include "test_util.h"

namespace dlprobe::memory {
namespace {

using namespace testing;

TEST(FakeSource, FirstFitWithHolesThatMerge) {
  FakeMemorySource fake({.capacity_bytes = 6 * MiB, .base_address = 1 * GiB});
  void* a = fake.allocate(2 * MiB).value();
  void* b = fake.allocate(2 * MiB).value();
  void* c = fake.allocate(2 * MiB).value();
  EXPECT_EQ(addr(a), 1 * GiB);
  EXPECT_EQ(addr(b), 1 * GiB + 2 * MiB);
  EXPECT_EQ(fake.allocate(512).status().code(), Errc::out_of_memory);
  ASSERT_TRUE(fake.free(a, 2 * MiB).is_ok());
  ASSERT_TRUE(fake.free(c, 2 * MiB).is_ok());
  // 4 MiB free, but in two holes: a fragmented device.
  EXPECT_EQ(fake.memory_info()->free_bytes, 4 * MiB);
  EXPECT_EQ(fake.allocate(3 * MiB).status().code(), Errc::out_of_memory);
  ASSERT_TRUE(fake.free(b, 2 * MiB).is_ok());
  void* whole = fake.allocate(6 * MiB).value();
  EXPECT_EQ(addr(whole), 1 * GiB) << "the three holes merged back into one";
  EXPECT_EQ(fake.free(whole, 2 * MiB).code(), Errc::invalid_argument) << "size must match";
  EXPECT_EQ(fake.free(b, 2 * MiB).code(), Errc::invalid_argument) << "not live";
  ASSERT_TRUE(fake.free(whole, 6 * MiB).is_ok());
  EXPECT_EQ(fake.allocate_calls(), 6);
  EXPECT_EQ(fake.failed_allocations(), 2);
  EXPECT_EQ(fake.free_calls(), 4);
  EXPECT_EQ(fake.live_bytes(), 0U);
}

TEST(HostSource, AlignedRealMemory) {
  HostMemorySource host;
  auto r = host.allocate(1000);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(addr(r.value()) % HostMemorySource::kAlignment, 0U);
  std::memset(r.value(), 0xab, 1000);
  EXPECT_TRUE(host.free(r.value(), 1000).is_ok());
  EXPECT_FALSE(host.memory_info().has_value());
}

// Past its budget the source says out of memory, as a full GPU does, and the allocator can free
// its cache and retry; the heap alone would promise the memory and the kernel kill the process.
TEST(HostSource, RefusesPastItsBudget) {
  HostMemorySource host(3 * MiB);
  auto a = host.allocate(2 * MiB);
  ASSERT_TRUE(a.has_value());
  auto b = host.allocate(2 * MiB);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.status().code(), Errc::out_of_memory);
  EXPECT_EQ(b.status().message(),
            "host: 2.00 MiB more would pass the 3.00 MiB of memory available to this run (2.00 MiB "
            "held)");
  ASSERT_TRUE(host.free(a.value(), 2 * MiB).is_ok());
  auto c = host.allocate(3 * MiB);
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(host.free(c.value(), 3 * MiB).is_ok());
  EXPECT_FALSE(HostMemorySource(3 * MiB).allocate(SIZE_MAX).has_value());
}

TEST(HostSource, AllocatorKeepsEveryBufferIntact) {
  auto created = CachingAllocator::create(std::make_unique<HostMemorySource>());
  ASSERT_TRUE(created.has_value());
  auto& al = *created.value();
  std::mt19937 rng(7);
  struct Buffer {
    DeviceBuffer buffer;
    unsigned char pattern;
  };
  std::vector<Buffer> live;
  auto intact = [](const Buffer& b) {
    const auto* bytes = static_cast<const unsigned char*>(b.buffer.data());
    for (std::size_t i = 0; i < b.buffer.size(); ++i) {
      if (bytes[i] != b.pattern) return false;
    }
    return true;
  };
  for (int round = 0; round < 400; ++round) {
    if (live.size() < 40 || rng() % 2 == 0) {
      const std::size_t bytes = 1 + rng() % (3 * MiB);
      auto r = al.allocate_buffer(bytes, Category::activations, "host");
      ASSERT_TRUE(r.has_value()) << r.status().message();
      const auto pattern = static_cast<unsigned char>(round);
      std::memset(r.value().data(), pattern, bytes);  // writes every byte: ASan checks the range
      live.push_back({std::move(r).value(), pattern});
    } else {
      const std::size_t victim = rng() % live.size();
      ASSERT_TRUE(intact(live[victim])) << "a neighbour overwrote this buffer";
      live.erase(live.begin() + static_cast<long>(victim));
    }
  }
  for (const auto& b : live) ASSERT_TRUE(intact(b));
  live.clear();
  const auto s = al.stats();
  EXPECT_EQ(s.all.live_count, 0);
  EXPECT_GT(s.reserved_bytes, 0);
  ASSERT_TRUE(al.empty_cache().is_ok());
  EXPECT_EQ(al.stats().reserved_bytes, 0);
}

TEST(CudaSource, UnavailableWithoutAGpu) {
  auto r = make_cuda_memory_source(0);
  if (r.has_value()) GTEST_SKIP() << "a GPU is present; the gpu-labelled tests cover it";
  EXPECT_EQ(r.status().code(), Errc::unavailable) << r.status().message();
}

}  // namespace
}  // namespace dlprobe::memory
