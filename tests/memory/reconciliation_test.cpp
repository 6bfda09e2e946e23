// NVML's figure for this process, read through the fake NVML as through a driver, and the
// reconciliation's arithmetic.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "dlprobe/memory_analysis.h"
#include "dlprobe/nvml.h"
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

TEST(Reconciliation, TheDifferenceIsWhatLoadedSinceStartUp) {
  Reconciliation r;
  r.reserved_bytes = 10ll << 30;
  r.context_bytes = 600ll << 20;
  r.nvml_process_bytes = (10ll << 30) + (900ll << 20);
  EXPECT_EQ(r.lazy_bytes(), 300ll << 20);
}

}  // namespace
}  // namespace dlprobe::memory
