// --gpu-memory parsing: every mode, combinations with planned, and one-line errors.
#include <gtest/gtest.h>

#include "dlprobe/allocator/gpu_memory_option.h"

namespace dlprobe::memory {
namespace {

GpuMemoryOption must_parse(std::string_view text) {
  Result<GpuMemoryOption> r = parse_gpu_memory(text);
  EXPECT_TRUE(r.has_value()) << text << ": " << r.status().message();
  return r.value_or(GpuMemoryOption{});
}

TEST(GpuMemoryOption, ParsesEveryMode) {
  GpuMemoryOption grow = must_parse("grow");
  EXPECT_EQ(grow.allocator.mode, Mode::growth);
  EXPECT_FALSE(grow.planned);
  EXPECT_EQ(grow.text, "grow");

  GpuMemoryOption prealloc = must_parse("prealloc");
  EXPECT_EQ(prealloc.allocator.mode, Mode::preallocate);
  EXPECT_DOUBLE_EQ(prealloc.allocator.preallocate_fraction, kDefaultPreallocateFraction);
  EXPECT_EQ(prealloc.allocator.preallocate_bytes, 0u);

  EXPECT_DOUBLE_EQ(must_parse("prealloc:0.5").allocator.preallocate_fraction, 0.5);
  EXPECT_DOUBLE_EQ(must_parse("prealloc:75%").allocator.preallocate_fraction, 0.75);
  EXPECT_DOUBLE_EQ(must_parse("prealloc:1").allocator.preallocate_fraction, 1.0);
  GpuMemoryOption sized = must_parse("prealloc:8GiB");
  EXPECT_EQ(sized.allocator.preallocate_bytes, 8ull << 30);
  EXPECT_EQ(sized.allocator.preallocate_fraction, 0.0);

  GpuMemoryOption limit = must_parse("limit:16GiB");
  EXPECT_EQ(limit.allocator.mode, Mode::limit);
  EXPECT_EQ(limit.allocator.limit_bytes, 16ull << 30);
  EXPECT_EQ(limit.allocator.overhead_bytes, 0u);

  GpuMemoryOption planned = must_parse("planned");
  EXPECT_TRUE(planned.planned);
  EXPECT_EQ(planned.allocator.mode, Mode::growth);
}

TEST(GpuMemoryOption, PlannedCombinesWithOneAllocatorMode) {
  GpuMemoryOption a = must_parse("planned+limit:12GB");
  EXPECT_TRUE(a.planned);
  EXPECT_EQ(a.allocator.mode, Mode::limit);
  EXPECT_EQ(a.allocator.limit_bytes, 12'000'000'000ull);
  GpuMemoryOption b = must_parse("prealloc:0.8+planned");
  EXPECT_TRUE(b.planned);
  EXPECT_EQ(b.allocator.mode, Mode::preallocate);
}

TEST(GpuMemoryOption, RefusesBadTextWithOneLine) {
  for (std::string_view bad :
       {"", "growth", "limit", "limit:", "limit:0", "limit:lots", "prealloc:0", "prealloc:1.5",
        "prealloc:0B", "prealloc:-1", "planned+planned", "grow+limit:1G", "planned+", "+grow",
        "grow,planned"}) {
    Result<GpuMemoryOption> r = parse_gpu_memory(bad, "--gpu-memory");
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.status().code(), Errc::invalid_argument) << bad;
    EXPECT_EQ(r.status().message().rfind("--gpu-memory", 0), 0u) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace dlprobe::memory
