// The graph recording's scratch pool, over the caching allocator with host memory.
#include "scratch_pool.h"

#include <gtest/gtest.h>

#include <memory>

#include "dlprobe/allocator/memory_source.h"

namespace dlprobe::cuda {
namespace {

std::unique_ptr<memory::CachingAllocator> host_allocator() {
  return memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
}

TEST(ScratchPool, EmptyPoolAllocatesWorkspace) {
  auto allocator = host_allocator();
  ScratchPool pool;
  auto b = pool.take(*allocator, 1000, "op");
  ASSERT_TRUE(b.has_value()) << b.status().message();
  EXPECT_GE(b->size(), 1000U);
  EXPECT_GT(allocator->stats()[memory::Category::workspace].allocated_bytes, 0);
}

TEST(ScratchPool, GivenBackBufferServesALaterSmallerRequest) {
  auto allocator = host_allocator();
  ScratchPool pool;
  memory::DeviceBuffer first = pool.take(*allocator, 4096, "a").value();
  void* const address = first.data();
  pool.give(std::move(first));
  EXPECT_EQ(pool.idle(), 1U);
  memory::DeviceBuffer second = pool.take(*allocator, 1024, "b").value();
  EXPECT_EQ(second.data(), address);
  EXPECT_EQ(pool.idle(), 0U);
}

TEST(ScratchPool, LargerRequestGetsANewBufferAndTheSmallOneWaits) {
  auto allocator = host_allocator();
  ScratchPool pool;
  memory::DeviceBuffer small = pool.take(*allocator, 1024, "a").value();
  void* const small_address = small.data();
  pool.give(std::move(small));
  memory::DeviceBuffer big = pool.take(*allocator, 1 << 20, "b").value();
  EXPECT_NE(big.data(), small_address);
  EXPECT_EQ(pool.idle(), 1U);
}

TEST(ScratchPool, BestFitTakesTheSmallestThatHolds) {
  auto allocator = host_allocator();
  ScratchPool pool;
  memory::DeviceBuffer a = pool.take(*allocator, 1 << 20, "a").value();
  memory::DeviceBuffer b = pool.take(*allocator, 8192, "b").value();
  memory::DeviceBuffer c = pool.take(*allocator, 65536, "c").value();
  void* const c_address = c.data();
  pool.give(std::move(a));
  pool.give(std::move(b));
  pool.give(std::move(c));
  memory::DeviceBuffer d = pool.take(*allocator, 10000, "d").value();
  EXPECT_EQ(d.data(), c_address);
  EXPECT_EQ(pool.idle(), 2U);
}

// A kept buffer (written once while recording, read at every replay) is never lent to a later
// call, and lives as long as the pool.
TEST(ScratchPool, KeptBufferIsNeverLentAgain) {
  auto allocator = host_allocator();
  {
    ScratchPool pool;
    void* const kept = pool.keep(*allocator, 4096, "table").value();
    EXPECT_EQ(pool.idle(), 0U);
    memory::DeviceBuffer next = pool.take(*allocator, 1024, "b").value();
    EXPECT_NE(next.data(), kept);
    pool.give(std::move(next));
    EXPECT_EQ(pool.idle(), 1U);
    EXPECT_GE(allocator->stats()[memory::Category::workspace].allocated_bytes, 4096);
  }
  EXPECT_EQ(allocator->stats()[memory::Category::workspace].allocated_bytes, 0);
}

TEST(ScratchPool, PooledBuffersStayAllocatedUntilThePoolGoes) {
  auto allocator = host_allocator();
  {
    ScratchPool pool;
    pool.give(pool.take(*allocator, 4096, "a").value());
    EXPECT_GT(allocator->stats()[memory::Category::workspace].allocated_bytes, 0);
  }
  EXPECT_EQ(allocator->stats()[memory::Category::workspace].allocated_bytes, 0);
}

}  // namespace
}  // namespace dlprobe::cuda
