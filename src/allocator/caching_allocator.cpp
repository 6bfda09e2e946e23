// The caching allocator's policy, in the order a request meets it:
//
//  1. Rounding. Every request is rounded up to kBlockRound (512 B), so blocks stay aligned for any
//     element type and vectorised access, and freed blocks are interchangeable in sizes that recur.
//  2. Pools. Requests up to kSmallRequestMax (1 MiB) come from the small pool, larger ones from the
//     large pool; the pools never share a segment. Small tensors (biases, norms, scalars) are freed
//     and made at a different rhythm from large activations; mixing them pins large segments with
//     small long-lived blocks. In preallocate mode there is a single pool: the one segment.
//  3. Best fit. The pool's free blocks are ordered by (size, address); the first block not smaller
//     than the request is taken: the smallest that fits, the lowest address among equals.
//  4. Splitting. The block is split when the remainder is worth keeping: in the small pool when it
//  is
//     at least kBlockRound, in the large pool only when it is larger than kSmallRequestMax, since a
//     smaller remainder there could never serve a large-pool request and would only sit between
//     blocks. An unsplit remainder stays with the allocation and is counted as waste.
//  5. New segment. With no fitting free block, a segment is taken from the source:
//  kSmallSegmentSize
//     (2 MiB) for the small pool; kMediumSegmentSize (20 MiB) for requests under kMediumRequestMax
//     (10 MiB), so several share one source call; otherwise the request rounded up to
//     kLargeSegmentRound (2 MiB). When the preferred size does not fit (device or limit), the
//     smallest segment that holds the request is tried.
//  6. Out of memory. When the source (or the limit) refuses, every cached segment with no live
//  block
//     is returned to the source and the segment is asked for again. Only then does the request fail
//     with Errc::out_of_memory and a full report; state is unchanged apart from the released cache.
//  7. Free. A freed block is merged with free neighbours of its own segment (coalescing) and goes
//     back to its pool's free set. Segments stay cached until empty_cache() or step 6.
//
// Every allocation is accounted to its category and to "all": current and peak bytes (block sizes
// and requested sizes), live count, cumulative allocations and frees. When overall allocated bytes
// pass their peak, the per-category breakdown and the allocation that did it are recorded.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"

namespace dlprobe::memory {

std::string_view category_name(Category category) {
  return name_of(kCategoryNames, category, "unknown");
}

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::growth:
      return "growth";
    case Mode::preallocate:
      return "preallocate";
    case Mode::limit:
      return "limit";
  }
  return "unknown";
}

namespace {

std::int64_t signed_bytes(std::uint64_t bytes) {
  return static_cast<std::int64_t>(bytes);
}
std::uint64_t unsigned_bytes(std::int64_t bytes) {
  return bytes > 0 ? static_cast<std::uint64_t>(bytes) : 0;
}

std::size_t index_of(Category category) {
  return static_cast<std::size_t>(category);
}

enum class PoolKind : std::uint8_t { small, large, arena };

struct Segment;

struct Block {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // neighbours in the same segment, by address
  Block* next = nullptr;
  bool allocated = false;
  Category category = Category::weights;
  std::string owner;
};

struct Segment {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  PoolKind pool = PoolKind::large;
  bool preallocated = false;
  Block* head = nullptr;
};

// Orders free blocks by (size, address); a (size, address) pair looks up without making a Block.
struct BySizeThenAddress {
  using is_transparent = void;
  using Key = std::pair<std::uint64_t, std::uint64_t>;
  static Key key(const Block* b) { return {b->size, b->address}; }
  static const Key& key(const Key& k) { return k; }
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    return key(a) < key(b);
  }
};

struct Pool {
  std::set<Block*, BySizeThenAddress> free_blocks;
  std::uint64_t split_min = kBlockRound;  // smallest remainder worth splitting off
};

void update_peak(std::int64_t& current, std::int64_t& peak, std::int64_t delta) {
  current += delta;
  peak = std::max(peak, current);
}

}  // namespace

struct CachingAllocator::Impl {
  std::unique_ptr<MemorySource> source;
  AllocatorOptions options;
  std::optional<std::uint64_t> cap;  // most bytes that may be reserved

  mutable std::mutex mutex;
  std::map<std::uint64_t, std::unique_ptr<Segment>> segments;        // by address
  std::unordered_map<std::uint64_t, std::unique_ptr<Block>> blocks;  // every block, by address
  Pool pools[3];
  MemoryStats stats;
  std::optional<OomReport> last_oom;
  AllocationHook hook;
  OomAdvice advice;

  Pool& pool(PoolKind kind) { return pools[static_cast<std::size_t>(kind)]; }

  PoolKind pool_for(std::uint64_t rounded) const {
    if (options.mode == Mode::preallocate) return PoolKind::arena;
    return rounded <= kSmallRequestMax ? PoolKind::small : PoolKind::large;
  }

  std::int64_t largest_free_block() const {
    std::uint64_t largest = 0;
    for (const Pool& p : pools) {
      if (!p.free_blocks.empty()) largest = std::max(largest, (*p.free_blocks.rbegin())->size);
    }
    return signed_bytes(largest);
  }

  // Result of asking for one segment: the Status is out_of_memory for "no memory" (device or
  // limit) and anything else for a failure that must not be retried.
  Result<Block*> add_segment(PoolKind kind, std::uint64_t size, bool preallocated) {
    if (cap && unsigned_bytes(stats.reserved_bytes) + size > *cap) {
      return error(
          Errc::out_of_memory,
          fmt::format("limit {} reached ({} overhead leaves {} to reserve; {} reserved)",
                      format_size(options.limit_bytes), format_size(options.overhead_bytes),
                      format_size(*cap), format_size(unsigned_bytes(stats.reserved_bytes))));
    }
    DLPROBE_ASSIGN_OR_RETURN(void* ptr, source->allocate(size));
    auto segment = std::make_unique<Segment>();
    segment->address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr));
    segment->size = size;
    segment->pool = kind;
    segment->preallocated = preallocated;
    auto block = std::make_unique<Block>();
    block->address = segment->address;
    block->size = size;
    block->segment = segment.get();
    segment->head = block.get();
    Block* raw = block.get();
    blocks.emplace(raw->address, std::move(block));
    segments.emplace(segment->address, std::move(segment));
    update_peak(stats.reserved_bytes, stats.reserved_bytes_peak, signed_bytes(size));
    ++stats.segment_count;
    ++stats.segment_allocations;
    return raw;
  }

  // Returns to the source every segment that is one free block. A source that fails to free is
  // reported, but its segment is dropped from the books all the same: cudaFree fails only when the
  // context is lost, and then that memory cannot be used again either way.
  Status release_cached_segments() {
    Status first_failure;
    for (auto it = segments.begin(); it != segments.end();) {
      Segment& segment = *it->second;
      Block* head = segment.head;
      if (segment.preallocated || head->allocated || head->next != nullptr) {
        ++it;
        continue;
      }
      pool(segment.pool).free_blocks.erase(head);
      Status freed = source->free(
          reinterpret_cast<void*>(static_cast<std::uintptr_t>(segment.address)), segment.size);
      if (!freed.is_ok() && first_failure.is_ok()) first_failure = freed;
      stats.reserved_bytes -= signed_bytes(segment.size);
      --stats.segment_count;
      ++stats.segment_frees;
      blocks.erase(head->address);
      it = segments.erase(it);
    }
    return first_failure;
  }

  // Steps 5 and 6 of the policy. Sets `oom_reason` when it fails for lack of memory.
  Result<Block*> grow(PoolKind kind, std::uint64_t rounded, std::string& oom_reason) {
    std::uint64_t preferred = round_up(rounded, kLargeSegmentRound);
    std::uint64_t minimal = preferred;
    if (kind == PoolKind::small) {
      preferred = minimal = kSmallSegmentSize;
    } else if (rounded < kMediumRequestMax) {
      preferred = kMediumSegmentSize;
    }
    std::vector<std::uint64_t> sizes = {preferred};
    if (minimal != preferred) sizes.push_back(minimal);
    for (int attempt = 0; attempt < 2; ++attempt) {
      for (std::uint64_t size : sizes) {
        auto block = add_segment(kind, size, false);
        if (block) return block;
        if (block.status().code() != Errc::out_of_memory) return block.status();
        oom_reason = block.status().message();
      }
      if (attempt == 1) break;
      const std::int64_t released_before = stats.segment_frees;
      DLPROBE_RETURN_IF_ERROR(release_cached_segments());
      // With nothing cached there is nothing new to try.
      if (stats.segment_frees == released_before) break;
      ++stats.cache_flushes;
    }
    return error(Errc::out_of_memory, oom_reason);
  }

  void split(Block* block, std::uint64_t rounded, Pool& p) {
    const std::uint64_t rest = block->size - rounded;
    if (rest < p.split_min) return;
    auto tail = std::make_unique<Block>();
    tail->address = block->address + rounded;
    tail->size = rest;
    tail->segment = block->segment;
    tail->prev = block;
    tail->next = block->next;
    if (block->next != nullptr) block->next->prev = tail.get();
    block->next = tail.get();
    block->size = rounded;
    p.free_blocks.insert(tail.get());
    blocks.emplace(tail->address, std::move(tail));
  }

  // `right` is absorbed into `left`, its neighbour; neither is in a free set.
  void merge(Block* left, Block* right) {
    left->size += right->size;
    left->next = right->next;
    if (right->next != nullptr) right->next->prev = left;
    blocks.erase(right->address);
  }

  void account(const Block& block, int sign) {
    const std::int64_t size = sign * signed_bytes(block.size);
    const std::int64_t requested = sign * signed_bytes(block.requested);
    for (CategoryStats* s : {&stats.all, &stats.by_category[index_of(block.category)]}) {
      update_peak(s->allocated_bytes, s->allocated_bytes_peak, size);
      update_peak(s->requested_bytes, s->requested_bytes_peak, requested);
      s->live_count += sign;
      if (sign > 0) {
        ++s->allocation_count;
      } else {
        ++s->free_count;
      }
    }
    if (sign > 0 && stats.all.allocated_bytes > stats.peak.allocated_bytes) {
      PeakSnapshot& peak = stats.peak;
      peak.allocated_bytes = stats.all.allocated_bytes;
      peak.reserved_bytes = stats.reserved_bytes;
      for (std::size_t i = 0; i < kCategoryCount; ++i) {
        peak.allocated_by_category[i] = stats.by_category[i].allocated_bytes;
      }
      peak.category = block.category;
      peak.owner = block.owner;
      peak.requested_bytes = signed_bytes(block.requested);
    }
  }

  // Reports one event to the hook, with the state after it (a freed block already merged back).
  void notify(bool allocation, Category category, std::string_view owner, std::uint64_t size,
              std::uint64_t requested) {
    if (!hook) return;
    AllocationEvent e;
    e.allocation = allocation;
    e.category = category;
    e.owner = owner;
    e.bytes = size;
    e.requested_bytes = requested;
    e.allocated_bytes = stats.all.allocated_bytes;
    e.requested_total_bytes = stats.all.requested_bytes;
    e.reserved_bytes = stats.reserved_bytes;
    e.largest_free_block_bytes = largest_free_block();
    for (std::size_t i = 0; i < kCategoryCount; ++i) {
      e.allocated_by_category[i] = stats.by_category[i].allocated_bytes;
    }
    hook(e);
  }

  Status out_of_memory(std::uint64_t bytes, std::uint64_t rounded, Category category,
                       std::string_view owner, std::string reason) {
    OomReport report;
    report.requested_bytes = bytes;
    report.rounded_bytes = rounded;
    report.category = category;
    report.owner = std::string(owner);
    report.reason = std::move(reason);
    report.source = std::string(source->name());
    report.mode = options.mode;
    report.allocated_bytes = stats.all.allocated_bytes;
    report.reserved_bytes = stats.reserved_bytes;
    report.cached_free_bytes = stats.reserved_bytes - stats.all.allocated_bytes;
    report.largest_free_block_bytes = largest_free_block();
    for (std::size_t i = 0; i < kCategoryCount; ++i) {
      report.allocated_by_category[i] = stats.by_category[i].allocated_bytes;
    }
    report.device = source->memory_info();
    report.advice = advice;
    ++stats.oom_count;
    Status status = error(Errc::out_of_memory, report.message());
    last_oom = std::move(report);
    return status;
  }

  Result<void*> allocate(std::size_t bytes, Category category, std::string_view owner) {
    if (bytes == 0) return static_cast<void*>(nullptr);
    if (bytes > kMaxRequestBytes) {
      return out_of_memory(
          bytes, bytes, category, owner,
          fmt::format("more than {}, larger than any device", format_size(kMaxRequestBytes)));
    }
    const std::uint64_t rounded = round_up(bytes, kBlockRound);
    const PoolKind kind = pool_for(rounded);
    Pool& p = pool(kind);
    Block* block = nullptr;
    auto fit = p.free_blocks.lower_bound(BySizeThenAddress::Key{rounded, 0});
    if (fit != p.free_blocks.end()) {
      block = *fit;
      p.free_blocks.erase(fit);
    } else if (kind == PoolKind::arena) {
      return out_of_memory(bytes, rounded, category, owner,
                           fmt::format("the preallocated {} has no free block that large",
                                       format_size(segments.begin()->second->size)));
    } else {
      std::string reason;
      auto grown = grow(kind, rounded, reason);
      if (!grown) {
        if (grown.status().code() != Errc::out_of_memory) return grown.status();
        return out_of_memory(bytes, rounded, category, owner, std::move(reason));
      }
      block = *grown;
    }
    split(block, rounded, p);
    block->allocated = true;
    block->requested = bytes;
    block->category = category;
    block->owner = std::string(owner);
    account(*block, +1);
    notify(true, category, block->owner, block->size, bytes);
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(block->address));
  }

  Status deallocate(void* ptr) {
    if (ptr == nullptr) return Status::ok();
    const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr));
    auto found = blocks.find(address);
    if (found == blocks.end() || !found->second->allocated) {
      return error(
          Errc::invalid_argument,
          fmt::format("free of {:#x}, which is not a live allocation of this allocator", address));
    }
    Block* block = found->second.get();
    account(*block, -1);
    const Category category = block->category;
    const std::uint64_t size = block->size;
    const std::uint64_t requested = block->requested;
    std::string owner = std::move(block->owner);
    block->allocated = false;
    block->requested = 0;
    block->owner.clear();
    Pool& p = pool(block->segment->pool);
    if (block->prev != nullptr && !block->prev->allocated) {
      Block* prev = block->prev;
      p.free_blocks.erase(prev);
      merge(prev, block);
      block = prev;
    }
    if (block->next != nullptr && !block->next->allocated) {
      Block* next = block->next;
      p.free_blocks.erase(next);
      merge(block, next);
    }
    p.free_blocks.insert(block);
    notify(false, category, owner, size, requested);
    return Status::ok();
  }

  MemoryStats snapshot_stats() const {
    MemoryStats s = stats;
    s.cached_free_bytes = stats.reserved_bytes - stats.all.allocated_bytes;
    s.largest_free_block_bytes = largest_free_block();
    s.fragmentation = s.cached_free_bytes > 0
                          ? 1.0 - static_cast<double>(s.largest_free_block_bytes) /
                                      static_cast<double>(s.cached_free_bytes)
                          : 0.0;
    return s;
  }
};

std::string OomReport::message() const {
  std::string who(category_name(category));
  if (!owner.empty()) who += fmt::format(" of {}", owner);
  std::string device_part;
  if (device) {
    device_part = fmt::format(", device free {} of {}", format_size(device->free_bytes),
                              format_size(device->total_bytes));
  }
  // The largest free block being too small while the cache holds enough in total means the cache is
  // fragmented; that is worth saying, since a planned layout fixes it without a smaller batch.
  std::string fragmented;
  if (unsigned_bytes(cached_free_bytes) >= rounded_bytes &&
      unsigned_bytes(largest_free_block_bytes) < rounded_bytes) {
    fragmented = "the free cache is fragmented; ";
  }
  // A planned arena taken or being taken: that mode is already in use.
  const bool planned =
      category == Category::arena || allocated_by_category[index_of(Category::arena)] > 0;
  std::vector<std::string> tries = {"a smaller batch"};
  if (!advice.mixed_precision) tries.emplace_back("mixed precision (bf16/fp16)");
  if (!planned && !advice.planned) tries.emplace_back("the planned memory mode");
  if (!advice.also.empty()) tries.push_back(advice.also);
  std::string try_text = tries.front();
  for (std::size_t i = 1; i < tries.size(); ++i)
    try_text += (i + 1 == tries.size() ? " or " : ", ") + tries[i];
  return fmt::format(
      "cannot allocate {} for {}: {}; allocated {}, reserved {}, largest free block {}{} ({} "
      "mode, {}); {}try {}",
      format_size(requested_bytes), who, reason, format_size(unsigned_bytes(allocated_bytes)),
      format_size(unsigned_bytes(reserved_bytes)),
      format_size(unsigned_bytes(largest_free_block_bytes)), device_part, mode_name(mode), source,
      fragmented, try_text);
}

nlohmann::json to_flat_json(const MemoryStats& stats) {
  nlohmann::json j = nlohmann::json::object();
  auto put = [&j](std::string_view name, const CategoryStats& c) {
    const std::string n(name);
    j["allocated_bytes." + n + ".current"] = c.allocated_bytes;
    j["allocated_bytes." + n + ".peak"] = c.allocated_bytes_peak;
    j["requested_bytes." + n + ".current"] = c.requested_bytes;
    j["requested_bytes." + n + ".peak"] = c.requested_bytes_peak;
    j["waste_bytes." + n + ".current"] = c.waste_bytes();
    j["allocations." + n + ".current"] = c.live_count;
    j["allocations." + n + ".allocated"] = c.allocation_count;
    j["allocations." + n + ".freed"] = c.free_count;
  };
  put("all", stats.all);
  for (Category c : kAllCategories) put(category_name(c), stats[c]);
  j["reserved_bytes.all.current"] = stats.reserved_bytes;
  j["reserved_bytes.all.peak"] = stats.reserved_bytes_peak;
  j["segments.all.current"] = stats.segment_count;
  j["segments.all.allocated"] = stats.segment_allocations;
  j["segments.all.freed"] = stats.segment_frees;
  j["cached_free_bytes"] = stats.cached_free_bytes;
  j["largest_free_block_bytes"] = stats.largest_free_block_bytes;
  j["fragmentation"] = stats.fragmentation;
  j["oom_count"] = stats.oom_count;
  j["cache_flushes"] = stats.cache_flushes;
  j["peak.allocated_bytes"] = stats.peak.allocated_bytes;
  j["peak.reserved_bytes"] = stats.peak.reserved_bytes;
  for (Category c : kAllCategories) {
    j["peak.allocated_bytes." + std::string(category_name(c))] =
        stats.peak.allocated_by_category[index_of(c)];
  }
  j["peak.category"] = std::string(category_name(stats.peak.category));
  j["peak.owner"] = stats.peak.owner;
  j["peak.requested_bytes"] = stats.peak.requested_bytes;
  return j;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      category_(other.category_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    category_ = other.category_;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (allocator_ != nullptr && ptr_ != nullptr) {
    Status freed = allocator_->deallocate(ptr_);
    // Only a buffer whose allocator was already destroyed, or a corrupted one, can get here.
    if (!freed.is_ok()) log_error("freeing a device buffer: {}", freed.message());
  }
  allocator_ = nullptr;
  ptr_ = nullptr;
  size_ = 0;
}

CachingAllocator::CachingAllocator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<CachingAllocator>> CachingAllocator::create(
    std::unique_ptr<MemorySource> source, AllocatorOptions options) {
  if (source == nullptr) return invalid_argument("allocator: no memory source");
  const bool preallocating = options.mode == Mode::preallocate;
  const bool limiting = options.mode == Mode::limit;
  if (!preallocating && (options.preallocate_bytes != 0 || options.preallocate_fraction != 0.0)) {
    return invalid_argument(
        fmt::format("allocator: a preallocation size is only read in "
                    "preallocate mode, not in {} mode",
                    mode_name(options.mode)));
  }
  if (!limiting && (options.limit_bytes != 0 || options.overhead_bytes != 0)) {
    return invalid_argument(
        fmt::format("allocator: a limit and overhead are only read in limit mode, not in {} mode",
                    mode_name(options.mode)));
  }
  auto impl = std::make_unique<Impl>();
  impl->pool(PoolKind::small).split_min = kBlockRound;
  // See step 4 of the policy for why large-pool remainders of 1 MiB or less are not split off.
  impl->pool(PoolKind::large).split_min = kSmallRequestMax + 1;
  impl->pool(PoolKind::arena).split_min = kBlockRound;

  if (limiting) {
    if (options.limit_bytes <= options.overhead_bytes) {
      return invalid_argument(fmt::format("allocator: limit {} leaves nothing after {} of overhead",
                                          format_size(options.limit_bytes),
                                          format_size(options.overhead_bytes)));
    }
    impl->cap = options.limit_bytes - options.overhead_bytes;
  }

  std::uint64_t arena_bytes = 0;
  if (preallocating) {
    const bool by_bytes = options.preallocate_bytes != 0;
    const bool by_fraction = options.preallocate_fraction != 0.0;
    if (by_bytes == by_fraction) {
      return invalid_argument(
          "allocator: preallocate mode needs exactly one of a size and a fraction");
    }
    arena_bytes = options.preallocate_bytes;
    if (by_fraction) {
      if (!(options.preallocate_fraction > 0.0 && options.preallocate_fraction <= 1.0)) {
        return invalid_argument(fmt::format("allocator: preallocate fraction {} is not in (0, 1]",
                                            options.preallocate_fraction));
      }
      const auto info = source->memory_info();
      if (!info) {
        return error(Errc::unavailable,
                     fmt::format("allocator: {} cannot tell its total memory, so a fraction of it "
                                 "cannot be preallocated; give a size",
                                 source->name()));
      }
      arena_bytes = static_cast<std::uint64_t>(options.preallocate_fraction *
                                               static_cast<double>(info->total_bytes));
      // Rounded down: a fraction of 1.0 must not ask for more than the device has.
      arena_bytes = arena_bytes / kLargeSegmentRound * kLargeSegmentRound;
    } else {
      arena_bytes = round_up(arena_bytes, kLargeSegmentRound);
    }
    if (arena_bytes == 0 || arena_bytes > kMaxRequestBytes) {
      return invalid_argument(
          fmt::format("allocator: cannot preallocate {}", format_size(arena_bytes)));
    }
    impl->cap = arena_bytes;
  }

  impl->source = std::move(source);
  impl->options = options;
  if (preallocating) {
    auto arena = impl->add_segment(PoolKind::arena, arena_bytes, true);
    if (!arena) return arena.status().with_context("preallocating device memory");
    impl->pool(PoolKind::arena).free_blocks.insert(*arena);
  }
  return std::unique_ptr<CachingAllocator>(new CachingAllocator(std::move(impl)));
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->stats.all.live_count > 0) {
    log_warn("device allocator destroyed with {} live allocations ({}) on {}",
             impl_->stats.all.live_count,
             format_size(unsigned_bytes(impl_->stats.all.allocated_bytes)), impl_->source->name());
  }
  for (auto& [address, segment] : impl_->segments) {
    Status freed = impl_->source->free(
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), segment->size);
    if (!freed.is_ok()) log_warn("returning device memory: {}", freed.message());
  }
}

Result<void*> CachingAllocator::allocate(std::size_t bytes, Category category,
                                         std::string_view owner) {
  std::lock_guard lock(impl_->mutex);
  return impl_->allocate(bytes, category, owner);
}

Status CachingAllocator::deallocate(void* ptr) {
  std::lock_guard lock(impl_->mutex);
  return impl_->deallocate(ptr);
}

Result<DeviceBuffer> CachingAllocator::allocate_buffer(std::size_t bytes, Category category,
                                                       std::string_view owner) {
  DLPROBE_ASSIGN_OR_RETURN(void* ptr, allocate(bytes, category, owner));
  return DeviceBuffer(this, ptr, bytes, category);
}

Status CachingAllocator::empty_cache() {
  std::lock_guard lock(impl_->mutex);
  return impl_->release_cached_segments();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->snapshot_stats();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(impl_->mutex);
  MemoryStats& s = impl_->stats;
  auto reset = [](CategoryStats& c) {
    c.allocated_bytes_peak = c.allocated_bytes;
    c.requested_bytes_peak = c.requested_bytes;
  };
  reset(s.all);
  for (CategoryStats& c : s.by_category) reset(c);
  s.reserved_bytes_peak = s.reserved_bytes;
  s.peak = PeakSnapshot{};
  s.peak.allocated_bytes = s.all.allocated_bytes;
  s.peak.reserved_bytes = s.reserved_bytes;
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    s.peak.allocated_by_category[i] = s.by_category[i].allocated_bytes;
  }
}

std::optional<OomReport> CachingAllocator::last_oom() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->last_oom;
}

std::vector<SegmentInfo> CachingAllocator::segments() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<SegmentInfo> out;
  out.reserve(impl_->segments.size());
  for (const auto& [address, segment] : impl_->segments) {
    SegmentInfo info;
    info.address = address;
    info.size = segment->size;
    info.small_pool = segment->pool == PoolKind::small;
    info.preallocated = segment->preallocated;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      info.blocks.push_back(
          BlockInfo{b->address, b->size, b->requested, b->allocated, b->category, b->owner});
    }
    out.push_back(std::move(info));
  }
  return out;
}

void CachingAllocator::set_hook(AllocationHook hook) {
  std::lock_guard lock(impl_->mutex);
  impl_->hook = std::move(hook);
}

void CachingAllocator::set_oom_advice(OomAdvice advice) {
  std::lock_guard lock(impl_->mutex);
  impl_->advice = std::move(advice);
}

Status CachingAllocator::set_overhead_bytes(std::uint64_t overhead_bytes) {
  std::lock_guard lock(impl_->mutex);
  const AllocatorOptions& o = impl_->options;
  if (o.mode != Mode::limit) {
    return invalid_argument(fmt::format(
        "allocator: an overhead is only read in limit mode, not in {} mode", mode_name(o.mode)));
  }
  const std::uint64_t reserved = unsigned_bytes(impl_->stats.reserved_bytes);
  if (o.limit_bytes <= overhead_bytes || o.limit_bytes - overhead_bytes < reserved) {
    return error(
        Errc::out_of_memory,
        fmt::format("limit {} with {} of overhead leaves less than the {} already reserved",
                    format_size(o.limit_bytes), format_size(overhead_bytes),
                    format_size(reserved)));
  }
  impl_->options.overhead_bytes = overhead_bytes;
  impl_->cap = o.limit_bytes - overhead_bytes;
  return Status::ok();
}

std::optional<std::uint64_t> CachingAllocator::reserve_cap() const {
  return impl_->cap;
}

const AllocatorOptions& CachingAllocator::options() const {
  return impl_->options;
}

MemorySource& CachingAllocator::source() {
  return *impl_->source;
}

}  // namespace dlprobe::memory
