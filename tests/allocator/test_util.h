// Shared set-up for the allocator tests: an allocator over a fake source the test can still
// inspect.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "dlprobe/allocator/caching_allocator.h"

namespace dlprobe::memory::testing {

inline constexpr std::uint64_t KiB = 1024;
inline constexpr std::uint64_t MiB = 1024 * KiB;
inline constexpr std::uint64_t GiB = 1024 * MiB;

struct FakeAllocator {
  FakeMemorySource* fake = nullptr;  // owned by `allocator`
  std::unique_ptr<CachingAllocator> allocator;

  CachingAllocator* operator->() const { return allocator.get(); }
};

inline FakeAllocator make_fake_allocator(FakeMemoryConfig source_options = {},
                                         AllocatorOptions options = {}) {
  auto source = std::make_unique<FakeMemorySource>(source_options);
  FakeAllocator out;
  out.fake = source.get();
  auto created = CachingAllocator::create(std::move(source), options);
  EXPECT_TRUE(created.has_value()) << created.status().message();
  if (created) out.allocator = std::move(created).value();
  return out;
}

inline std::uint64_t addr(const void* p) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
}

// Allocates or fails the test.
inline void* must_allocate(CachingAllocator& a, std::uint64_t bytes,
                           Category category = Category::temporaries, std::string_view owner = {}) {
  auto r = a.allocate(bytes, category, owner);
  EXPECT_TRUE(r.has_value()) << r.status().message();
  return r.value_or(nullptr);
}

inline void must_free(CachingAllocator& a, void* p) {
  Status s = a.deallocate(p);
  EXPECT_TRUE(s.is_ok()) << s.message();
}

}  // namespace dlprobe::memory::testing
