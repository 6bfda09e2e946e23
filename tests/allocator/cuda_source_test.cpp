// The allocator over cudaMalloc on GPU 0 (LABELS gpu: needs a GPU).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"

namespace dlprobe::memory {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;

std::unique_ptr<CachingAllocator> make_cuda_allocator(AllocatorOptions options = {}) {
  auto source = make_cuda_memory_source(0);
  EXPECT_TRUE(source.has_value()) << source.status().message();
  if (!source) return nullptr;
  auto created = CachingAllocator::create(std::move(source).value(), options);
  EXPECT_TRUE(created.has_value()) << created.status().message();
  return created ? std::move(created).value() : nullptr;
}

// Writes `value` over the buffer on the device and reads it all back.
void expect_filled(const DeviceBuffer& buffer, unsigned char value) {
  ASSERT_EQ(cudaMemset(buffer.data(), value, buffer.size()), cudaSuccess);
  std::vector<unsigned char> host(buffer.size());
  ASSERT_EQ(cudaMemcpy(host.data(), buffer.data(), buffer.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (unsigned char b : host) ASSERT_EQ(b, value);
}

TEST(CudaAllocator, AllocatesWritesAndFrees) {
  auto al = make_cuda_allocator();
  ASSERT_NE(al, nullptr);
  EXPECT_EQ(al->source().name(), "cuda:0");
  const auto info = al->source().memory_info();
  ASSERT_TRUE(info.has_value());
  EXPECT_GT(info->total_bytes, 0U);
  {
    auto small = al->allocate_buffer(1000, Category::weights, "bias").value();
    auto large = al->allocate_buffer(64 * MiB + 3, Category::activations, "conv1").value();
    expect_filled(small, 0x5a);
    expect_filled(large, 0xc3);
    expect_filled(small, 0x5a);  // the large write did not reach the small buffer
    EXPECT_EQ(al->stats().all.live_count, 2);
  }
  auto s = al->stats();
  EXPECT_EQ(s.all.live_count, 0);
  EXPECT_GE(s.reserved_bytes, static_cast<std::int64_t>(66 * MiB));
  // Reuse from the cache: no new segment.
  const auto segments_before = s.segment_allocations;
  auto again = al->allocate_buffer(64 * MiB, Category::activations).value();
  EXPECT_EQ(al->stats().segment_allocations, segments_before);
  again.reset();
  ASSERT_TRUE(al->empty_cache().is_ok());
  EXPECT_EQ(al->stats().reserved_bytes, 0);
}

TEST(CudaAllocator, OutOfMemoryPastTheDeviceAndStaysUsable) {
  auto al = make_cuda_allocator();
  ASSERT_NE(al, nullptr);
  const auto info = al->source().memory_info();
  ASSERT_TRUE(info.has_value());
  auto cached = al->allocate_buffer(256 * MiB, Category::temporaries).value();
  cached.reset();  // cached: must be released on the way to the failure
  auto r = al->allocate(info->total_bytes + GiB, Category::activations, "too_big");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::out_of_memory);
  EXPECT_NE(r.status().message().find("device free"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("too_big"), std::string::npos);
  const auto report = al->last_oom();
  ASSERT_TRUE(report.has_value());
  EXPECT_TRUE(report->device.has_value());
  EXPECT_EQ(al->stats().cache_flushes, 1);
  EXPECT_EQ(al->stats().reserved_bytes, 0);
  // The runtime error was cleared and the allocator works on.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  auto after = al->allocate_buffer(32 * MiB, Category::activations).value();
  expect_filled(after, 0x11);
}

TEST(CudaAllocator, LimitAndPreallocateOnTheDevice) {
  auto limited = make_cuda_allocator(
      {.mode = Mode::limit, .limit_bytes = 1 * GiB, .overhead_bytes = 512 * MiB});
  ASSERT_NE(limited, nullptr);
  auto fits = limited->allocate_buffer(400 * MiB, Category::weights).value();
  auto over = limited->allocate(200 * MiB, Category::weights);
  ASSERT_FALSE(over.has_value());
  EXPECT_NE(over.status().message().find("limit"), std::string::npos) << over.status().message();
  fits.reset();

  auto pre = make_cuda_allocator({.mode = Mode::preallocate, .preallocate_fraction = 0.25});
  ASSERT_NE(pre, nullptr);
  const auto reserved = pre->stats().reserved_bytes;
  EXPECT_GT(reserved, 0);
  auto buffer = pre->allocate_buffer(64 * MiB, Category::activations).value();
  expect_filled(buffer, 0x7e);
  EXPECT_EQ(pre->stats().reserved_bytes, reserved);
}

}  // namespace
}  // namespace dlprobe::memory
