// NVML's figure for this process, read through the fake NVML as through a driver: by pid, the
// device-wide fallback, the limit's overhead kept to it; and the reconciliation's arithmetic.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "dlprobe/memory/gpu_process_memory.h"
#include "dlprobe/memory/session.h"
#include "dlprobe/monitor/nvml.h"
#include "fake_script.h"

namespace dlprobe::memory {
namespace {

using dlprobe::testing::FakeScript;

std::string script_with(const std::string& process_lines) {
  return "driver_version 580.95.05\ndevice\nname NVIDIA H200\npci_bus_id 00000000:19:00.0\n"
         "memory_total 150754820096\nmem_used 3221225472\n" +
         process_lines;
}

TEST(NvmlProcessMemory, ReadsThisProcessesFigure) {
  const unsigned pid = static_cast<unsigned>(getpid());
  FakeScript script(script_with(fmt::format("process 1 1073741824\nprocess {} 4294967296\n", pid)));
  auto lib = nvml::Library::open(DLPROBE_FAKE_NVML);
  ASSERT_TRUE(lib.has_value()) << lib.status().message();
  Result<std::int64_t> used = nvml_process_used_bytes(**lib, 0, pid);
  ASSERT_TRUE(used.has_value()) << used.status().message();
  EXPECT_EQ(*used, 4294967296);
  EXPECT_EQ(nvml_process_used_bytes(**lib, 0, pid + 1).status().code(), Errc::not_found);
  EXPECT_FALSE(nvml_process_used_bytes(**lib, 7, pid).has_value());
}

TEST(NvmlProcessMemory, AListedProcessWithoutAFigureIsUnavailable) {
  const unsigned pid = static_cast<unsigned>(getpid());
  FakeScript script(script_with(fmt::format("process {} na\n", pid)));
  auto lib = nvml::Library::open(DLPROBE_FAKE_NVML);
  ASSERT_TRUE(lib.has_value()) << lib.status().message();
  EXPECT_EQ(nvml_process_used_bytes(**lib, 0, pid).status().code(), Errc::unavailable);
}

std::shared_ptr<nvml::Library> open_fake() {
  auto lib = nvml::Library::open(DLPROBE_FAKE_NVML);
  EXPECT_TRUE(lib.has_value()) << lib.status().message();
  return lib.has_value() ? *lib : nullptr;
}

TEST(GpuProcessMemory, ReadsThisPidOrFallsBackToTheDevicesGrowth) {
  const unsigned pid = static_cast<unsigned>(getpid());
  {
    FakeScript script(script_with(fmt::format("process {} 2147483648\n", pid)));
    Result<GpuProcessMemory> p = GpuProcessMemory::open(open_fake());
    ASSERT_TRUE(p.has_value()) << p.status().message();
    EXPECT_FALSE(p->read().has_value());  // attached to no device yet
    p->attach_nvml_index(0);
    EXPECT_EQ(p->gpu_name(), "NVIDIA H200");
    const auto r = p->read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->bytes, 2147483648);
    EXPECT_EQ(r->source, "process");
  }
  {
    // Not listed (another pid namespace): 1 GiB used when opened, 3 GiB later.
    FakeScript script(
        "device\nname NVIDIA H200\nmemory_total 150754820096\nmem_used 1073741824 "
        "3221225472\nprocess 1 1073741824\n");
    Result<GpuProcessMemory> p = GpuProcessMemory::open(open_fake());
    ASSERT_TRUE(p.has_value()) << p.status().message();
    p->attach_nvml_index(0);
    const auto r = p->read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->bytes, 2147483648);
    EXPECT_EQ(r->source, "device");
  }
}

TEST(GpuProcessMemory, KeepsALimitsOverheadToWhatNvmlSees) {
  const unsigned pid = static_cast<unsigned>(getpid());
  AllocatorOptions o;
  o.mode = Mode::limit;
  o.limit_bytes = 8ull << 30;
  auto allocator = CachingAllocator::create(std::make_unique<FakeMemorySource>(), o).value();
  void* held = allocator->allocate(1ull << 30, Category::activations).value();
  {
    // 1 GiB reserved by the allocator, 1.5 GiB for the process: 512 MiB outside it.
    FakeScript script(script_with(fmt::format("process {} 1610612736\n", pid)));
    Result<GpuProcessMemory> p = GpuProcessMemory::open(open_fake());
    ASSERT_TRUE(p.has_value());
    p->attach_nvml_index(0);
    Result<std::int64_t> outside = update_limit_overhead(*allocator, *p);
    ASSERT_TRUE(outside.has_value()) << outside.status().message();
    EXPECT_EQ(*outside, 512 << 20);
    EXPECT_EQ(allocator->reserve_cap(), (8ull << 30) - (512ull << 20));
  }
  {
    // 7.5 GiB outside would leave less than the 1 GiB reserved.
    FakeScript script(script_with(fmt::format("process {} 9126805504\n", pid)));
    Result<GpuProcessMemory> p = GpuProcessMemory::open(open_fake());
    ASSERT_TRUE(p.has_value());
    p->attach_nvml_index(0);
    EXPECT_EQ(update_limit_overhead(*allocator, *p).status().code(), Errc::out_of_memory);
    EXPECT_EQ(allocator->reserve_cap(), (8ull << 30) - (512ull << 20));
  }
  ASSERT_TRUE(allocator->deallocate(held).is_ok());
}

TEST(Reconciliation, TheDifferenceIsWhatLoadedSinceStartUp) {
  Reconciliation r;
  r.reserved_bytes = 10ll << 30;
  r.context_bytes = 600ll << 20;
  r.nvml_process_bytes = (10ll << 30) + (900ll << 20);
  EXPECT_EQ(r.lazy_bytes(), 300ll << 20);
}

}  // namespace
}  // namespace dlprobe::memory
