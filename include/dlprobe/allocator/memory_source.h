// Where the caching allocator gets its memory from: a MemorySource hands out and takes back whole
// segments and knows nothing of caching, categories or statistics. Keeping the raw source apart
// from the policy lets the same allocator run over cudaMalloc on a GPU, over the heap for the CPU
// backend and CI, and over fake addresses in tests that simulate a full or fragmented device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dlprobe/core/host_memory.h"
#include "dlprobe/core/status.h"

namespace dlprobe::memory {

// What the device says about its memory, for out-of-memory reports and fraction-based presets.
struct DeviceMemoryInfo {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};

class MemorySource {
 public:
  virtual ~MemorySource() = default;

  // "cuda:0", "host", "fake": named in reports.
  virtual std::string_view name() const = 0;
  // A new segment of at least `bytes`. Fails with Errc::out_of_memory when the memory is not there
  // (the allocator then frees its cache and retries) and with another code for anything else.
  virtual Result<void*> allocate(std::size_t bytes) = 0;
  // Returns a segment; `bytes` is what was passed to allocate().
  virtual Status free(void* ptr, std::size_t bytes) = 0;
  // Free and total memory of the device, when the source can tell.
  virtual std::optional<DeviceMemoryInfo> memory_info() const = 0;
};

// Fake addresses from an address range of `capacity_bytes`, never dereferenced. Placement is
// first-fit by address, so a capacity makes out-of-memory and a fragmented device (enough free
// bytes in total, no hole large enough) happen as they would on a GPU.
struct FakeMemoryConfig {
  std::uint64_t capacity_bytes = std::uint64_t{1} << 46;  // 64 TiB: in effect unlimited
  std::uint64_t base_address = std::uint64_t{1} << 44;
  // Whether memory_info() answers (a CUDA source does; the host source does not).
  bool report_memory_info = true;
};

class FakeMemorySource final : public MemorySource {
 public:
  // Every address handed out is a multiple of this, as cudaMalloc's are of 256.
  static constexpr std::uint64_t kAlignment = 512;

  explicit FakeMemorySource(FakeMemoryConfig options = {});

  std::string_view name() const override { return "fake"; }
  Result<void*> allocate(std::size_t bytes) override;
  Status free(void* ptr, std::size_t bytes) override;
  std::optional<DeviceMemoryInfo> memory_info() const override;

  // Counters for tests: how often the allocator went to its source.
  std::int64_t allocate_calls() const { return allocate_calls_; }
  std::int64_t free_calls() const { return free_calls_; }
  std::int64_t failed_allocations() const { return failed_allocations_; }
  std::uint64_t live_bytes() const { return live_bytes_; }
  std::size_t live_segments() const { return live_.size(); }

 private:
  FakeMemoryConfig options_;
  std::map<std::uint64_t, std::uint64_t> holes_;  // address -> size, adjacent holes merged
  std::map<std::uint64_t, std::uint64_t> live_;   // address -> size
  std::uint64_t live_bytes_ = 0;
  std::int64_t allocate_calls_ = 0;
  std::int64_t free_calls_ = 0;
  std::int64_t failed_allocations_ = 0;
};

// Heap memory with the alignment a GPU allocation has, so the CPU backend and CI run the allocator
// over real memory (and AddressSanitizer sees any block that strays past its segment).
class HostMemorySource final : public MemorySource {
 public:
  static constexpr std::size_t kAlignment = 512;

  // `budget_bytes`: the most this source holds at once; a segment past it fails with
  // Errc::out_of_memory. By default the host's available memory when the source is made: the
  // kernel lets the heap promise more than there is, and a run past it would be killed when it
  // touched the memory, with no error and no results.
  explicit HostMemorySource(std::optional<std::uint64_t> budget_bytes = host_memory_available());

  std::string_view name() const override { return "host"; }
  Result<void*> allocate(std::size_t bytes) override;
  Status free(void* ptr, std::size_t bytes) override;
  // Not answered: other processes take and give back host memory while the run goes on, so a
  // free/total figure would mislead a fraction-based preset; the budget is the source's own limit.
  std::optional<DeviceMemoryInfo> memory_info() const override { return std::nullopt; }

 private:
  std::optional<std::uint64_t> budget_bytes_;
  std::uint64_t live_bytes_ = 0;
};

// cudaMalloc/cudaFree on `device`; memory_info() is cudaMemGetInfo. Fails with Errc::unavailable
// when dlprobe was built without CUDA or no GPU is usable, Errc::not_found for a bad device index.
Result<std::unique_ptr<MemorySource>> make_cuda_memory_source(int device);

}  // namespace dlprobe::memory
