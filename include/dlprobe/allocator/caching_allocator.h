// The caching device-memory allocator that the training engine routes all of its device memory
// through. It takes whole segments from a MemorySource (cudaMalloc, the heap, or fake addresses),
// carves blocks out of them, keeps freed blocks cached for reuse, and accounts every byte to a
// category (weights, activations, ...) and an optional owner label (the layer, "layer3.2.conv2").
// Those figures are what `dlprobe memory` reports: current and peak per category, the breakdown at
// the overall peak and the layer that set it, rounding waste, reserved bytes and fragmentation.
//
// The policy (size classes, best fit, splitting, coalescing, the out-of-memory fallback chain) is
// written out at the top of src/memory/caching_allocator.cpp; docs/memory.md describes it for
// users.
//
// Modes (AllocatorOptions::mode):
//   growth       Segments are taken from the source on demand and kept cached until empty_cache()
//                or an out-of-memory retry. Nothing caps them but the device.
//   preallocate  One segment is reserved up front (preallocate_bytes, or preallocate_fraction of
//   the
//                device's total memory) and every block is carved from it. The source is never
//                asked again: a request that does not fit fails, and empty_cache() keeps the
//                segment.
//   limit        As growth, but reserved bytes never exceed limit_bytes - overhead_bytes.
//   limit_bytes
//                is the memory of the whole process on the device (the card it should fit), and
//                overhead_bytes is what the process holds outside this allocator (CUDA context,
//                cuBLAS/cuDNN workspaces) as measured by the caller. So limit 16 GiB with 1.2 GiB
//                of overhead lets the allocator reserve at most 14.8 GiB: the process fits a 16 GiB
//                card.
//
// Thread safety: every member function locks one mutex, so a sampler thread may read stats() while
// the engine allocates. The engine itself is expected to use one allocator per device from one
// thread; the lock is for readers, not for sharing one allocator between busy threads.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/named.h"
#include "dlprobe/core/status.h"

namespace dlprobe::memory {

// What an allocation holds; every allocation has exactly one.
enum class Category : std::uint8_t {
  weights,
  gradients,
  optimizer_state,
  activations,  // saved for the backward pass
  workspace,    // scratch of a library call (cuDNN, cuBLAS)
  temporaries,  // intermediates freed within the op or step
  input,        // the batch
  // A planned step's one static block that holds its activations and temporaries at fixed
  // offsets (engine::MemoryPlan::planned). Which of them it holds at any moment is known from the
  // plan, not from the allocator: memory analysis splits it (include/dlprobe/memory/step_memory.h).
  arena,
};
// "weights", "optimizer_state", ...: the names used in stats keys and reports.
inline constexpr Named<Category> kCategoryNames[] = {{Category::weights, "weights"},
                                                     {Category::gradients, "gradients"},
                                                     {Category::optimizer_state, "optimizer_state"},
                                                     {Category::activations, "activations"},
                                                     {Category::workspace, "workspace"},
                                                     {Category::temporaries, "temporaries"},
                                                     {Category::input, "input"},
                                                     {Category::arena, "arena"}};
inline constexpr std::size_t kCategoryCount = std::size(kCategoryNames);
inline constexpr std::array<Category, kCategoryCount> kAllCategories = values_of(kCategoryNames);
std::string_view category_name(Category category);

// Size classes; see the policy list in caching_allocator.cpp for why these values.
inline constexpr std::uint64_t kBlockRound = 512;                 // every request rounds up to it
inline constexpr std::uint64_t kSmallRequestMax = 1ull << 20;     // <= 1 MiB: small pool
inline constexpr std::uint64_t kSmallSegmentSize = 2ull << 20;    // small-pool segments: 2 MiB
inline constexpr std::uint64_t kMediumRequestMax = 10ull << 20;   // < 10 MiB: shares a segment
inline constexpr std::uint64_t kMediumSegmentSize = 20ull << 20;  // of 20 MiB
inline constexpr std::uint64_t kLargeSegmentRound = 2ull << 20;  // larger: own segment, 2 MiB steps
inline constexpr std::uint64_t kMaxRequestBytes = 1ull << 50;    // 1 PiB: no device has more

enum class Mode { growth, preallocate, limit };
std::string_view mode_name(Mode mode);

struct AllocatorOptions {
  Mode mode = Mode::growth;
  // preallocate: exactly one of these; the fraction needs a source that reports total memory.
  std::uint64_t preallocate_bytes = 0;
  double preallocate_fraction = 0.0;
  // limit: the process's budget on the device, and what the process holds outside the allocator.
  std::uint64_t limit_bytes = 0;
  std::uint64_t overhead_bytes = 0;

  bool operator==(const AllocatorOptions&) const = default;
};

// Counters of one category, or of all ("all"). Bytes "allocated" are block sizes (after rounding
// and any unsplit remainder); bytes "requested" are what callers asked for. The difference is
// waste.
struct CategoryStats {
  std::int64_t allocated_bytes = 0;
  std::int64_t allocated_bytes_peak = 0;
  std::int64_t requested_bytes = 0;
  std::int64_t requested_bytes_peak = 0;
  std::int64_t live_count = 0;
  std::int64_t allocation_count = 0;  // cumulative since creation
  std::int64_t free_count = 0;        // cumulative since creation
  std::int64_t waste_bytes() const { return allocated_bytes - requested_bytes; }
};

// The state at the moment overall allocated bytes reached their peak.
struct PeakSnapshot {
  std::int64_t allocated_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::array<std::int64_t, kCategoryCount> allocated_by_category{};
  // The allocation that set the peak: its category, owner ("the layer at the peak"; empty when it
  // had none or the peak was reset) and requested size.
  Category category = Category::weights;
  std::string owner;
  std::int64_t requested_bytes = 0;
};

struct MemoryStats {
  CategoryStats all;
  std::array<CategoryStats, kCategoryCount> by_category;
  std::int64_t reserved_bytes = 0;  // held from the source in segments
  std::int64_t reserved_bytes_peak = 0;
  std::int64_t segment_count = 0;
  std::int64_t segment_allocations = 0;  // calls to the source that succeeded, cumulative
  std::int64_t segment_frees = 0;
  std::int64_t cached_free_bytes = 0;  // reserved, in no live block
  std::int64_t largest_free_block_bytes = 0;
  // 1 - largest free block / cached free bytes: 0 when the free cache is one block (or empty),
  // towards 1 when it is scattered into pieces too small for a large request.
  double fragmentation = 0.0;
  std::int64_t oom_count = 0;
  std::int64_t cache_flushes = 0;  // cache released to retry a failed segment allocation
  PeakSnapshot peak;

  const CategoryStats& operator[](Category c) const {
    return by_category[static_cast<std::size_t>(c)];
  }
};

// Flat keys, one number (or, under peak.*, a name) each; "all" and the category names stand for
// <c>:
//   allocated_bytes.<c>.{current,peak}   requested_bytes.<c>.{current,peak} waste_bytes.<c>.current
//   allocations.<c>.{current,allocated,freed}
//   reserved_bytes.all.{current,peak}   segments.all.{current,allocated,freed}
//   cached_free_bytes   largest_free_block_bytes   fragmentation   oom_count   cache_flushes
//   peak.allocated_bytes   peak.reserved_bytes   peak.allocated_bytes.<category>
//   peak.category   peak.owner   peak.requested_bytes
nlohmann::json to_flat_json(const MemoryStats& stats);

// What the allocator's owner knows of the work that an out-of-memory message should suggest: the
// allocator itself sees bytes, not precisions or plans.
struct OomAdvice {
  bool mixed_precision = false;  // already mixed precision: not worth suggesting
  bool planned = false;          // already the planned memory mode, its arena taken or not yet
  std::string also;              // one more thing to try, e.g. "recomputing the block outputs"
};

// Everything known when an allocation failed for lack of memory.
struct OomReport {
  std::uint64_t requested_bytes = 0;
  std::uint64_t rounded_bytes = 0;
  Category category = Category::weights;
  std::string owner;
  std::string reason;  // why no memory: "cuda:0 is out of memory", "limit ... reached", ...
  std::string source;  // the source's name
  Mode mode = Mode::growth;
  std::int64_t allocated_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t cached_free_bytes = 0;
  std::int64_t largest_free_block_bytes = 0;
  std::array<std::int64_t, kCategoryCount> allocated_by_category{};
  std::optional<DeviceMemoryInfo> device;  // at the time of failure, when the source can tell
  OomAdvice advice;                        // as set_oom_advice left it
  // One line: what was asked for, why it failed, where memory is, and what to try.
  std::string message() const;
};

// One allocation or free, with the allocator's state right after it, for a caller that follows a
// step event by event (memory analysis builds its timeline from these).
struct AllocationEvent {
  bool allocation = true;  // false: a free
  Category category = Category::weights;
  std::string_view owner;   // valid during the hook call only
  std::uint64_t bytes = 0;  // the block's size
  std::uint64_t requested_bytes = 0;
  std::int64_t allocated_bytes = 0;  // totals after the event
  std::int64_t requested_total_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t largest_free_block_bytes = 0;
  std::array<std::int64_t, kCategoryCount> allocated_by_category{};
};
// Called under the allocator's lock, on the thread that allocates: it must not call back into the
// allocator, and should be quick.
using AllocationHook = std::function<void(const AllocationEvent&)>;

// A block of one segment, as laid out now (for memory maps and invariant checks).
struct BlockInfo {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_bytes = 0;  // 0 for a free block
  bool allocated = false;
  Category category = Category::weights;
  std::string owner;
};
struct SegmentInfo {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  bool small_pool = false;
  bool preallocated = false;
  std::vector<BlockInfo> blocks;  // by address, covering the segment
};

class CachingAllocator;

// An allocation that returns itself to its allocator when destroyed. Move-only; must not outlive
// the allocator. A zero-byte allocation is an empty buffer (data() is null).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return ptr_; }
  std::size_t size() const { return size_; }  // as requested
  Category category() const { return category_; }
  explicit operator bool() const { return ptr_ != nullptr; }
  // Frees now.
  void reset();

 private:
  friend class CachingAllocator;
  DeviceBuffer(CachingAllocator* allocator, void* ptr, std::size_t size, Category category)
      : allocator_(allocator), ptr_(ptr), size_(size), category_(category) {}

  CachingAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  Category category_ = Category::weights;
};

class CachingAllocator {
 public:
  // Checks the options against the mode (a field the mode does not read is an error, so a caller
  // cannot believe a limit applies when it does not) and, in preallocate mode, reserves the
  // segment.
  static Result<std::unique_ptr<CachingAllocator>> create(std::unique_ptr<MemorySource> source,
                                                          AllocatorOptions options = {});
  // Returns every segment to the source. Live allocations at this point are a leak in the caller
  // and are logged as a warning.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes`, aligned to kBlockRound within a segment. Zero bytes gives null.
  // Running out of memory is Errc::out_of_memory with OomReport::message() as its message; the
  // report stays readable through last_oom() and the allocator stays usable.
  Result<void*> allocate(std::size_t bytes, Category category, std::string_view owner = {});
  // Null is accepted and does nothing; a pointer this allocator did not hand out (or already took
  // back) is Errc::invalid_argument.
  Status deallocate(void* ptr);
  Result<DeviceBuffer> allocate_buffer(std::size_t bytes, Category category,
                                       std::string_view owner = {});

  // Returns every cached segment with no live block to the source (not the preallocated one).
  Status empty_cache();

  MemoryStats stats() const;
  // Sets every peak to the current value and the peak snapshot to the current state, so the next
  // peak is that of the coming step or phase.
  void reset_peak_stats();
  std::optional<OomReport> last_oom() const;
  std::vector<SegmentInfo> segments() const;

  // Every later successful allocation and free is reported to `hook` until it is replaced; an
  // empty hook stops the reports.
  void set_hook(AllocationHook hook);

  // What a later out-of-memory message suggests beside a smaller batch (and the planned mode where
  // no arena is live), until replaced; the default suggests mixed precision and nothing more.
  void set_oom_advice(OomAdvice advice);

  // Limit mode only: replaces overhead_bytes with a newer measurement of what the process holds
  // outside the allocator (CUDA loads library kernels and workspaces lazily, on first use, so the
  // figure grows after the first step). Fails with out_of_memory, changing nothing, when the
  // allocator already reserves more than the limit would now leave it.
  Status set_overhead_bytes(std::uint64_t overhead_bytes);

  // The most the allocator may reserve: limit_bytes - overhead_bytes in limit mode, the segment in
  // preallocate mode, none in growth mode.
  std::optional<std::uint64_t> reserve_cap() const;
  const AllocatorOptions& options() const;
  MemorySource& source();

 private:
  struct Impl;
  explicit CachingAllocator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlprobe::memory
