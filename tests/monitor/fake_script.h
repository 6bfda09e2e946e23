// Test support: writes a fake-NVML script to a temporary file and points DLPROBE_FAKE_NVML_SCRIPT
// at it for as long as the object lives.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace dlprobe::testing {

class FakeScript {
 public:
  explicit FakeScript(std::string_view text) {
    char name[] = "/tmp/dlprobe_fake_nvml_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    const auto written = write(fd, text.data(), text.size());
    EXPECT_EQ(written, static_cast<ssize_t>(text.size()));
    close(fd);
    setenv("DLPROBE_FAKE_NVML_SCRIPT", path_.c_str(), 1);
  }
  ~FakeScript() {
    std::remove(path_.c_str());
    unsetenv("DLPROBE_FAKE_NVML_SCRIPT");
  }
  FakeScript(const FakeScript&) = delete;
  FakeScript& operator=(const FakeScript&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An H200-like GPU whose dynamic fields step through three samples.
inline constexpr std::string_view kH200Script = R"(
driver_version 580.95.05
nvml_version 13.580.95.05
cuda_driver_version 13000
device
name NVIDIA H200
uuid GPU-11111111-2222-3333-4444-555555555555
pci_bus_id 00000000:19:00.0
memory_total 150754820096
memory_reserved 536870912
power_limit_mw 700000
default_power_limit_mw 700000
max_sm_clock 1980
max_mem_clock 3201
cc_major 9
cc_minor 0
ecc 1
mig 0
persistence 1
pcie_gen 5
pcie_width 16
gpu_util 10 90 50
mem_util 5 40 20
mem_used 1073741824 3221225472 2147483648
power_mw 100000 300000 200000
energy_mj 1000000 1030000 1050000
temperature 40 60 50
sm_clock 1980 1755 1980
mem_clock 3201
clock_events 0x1 0x44 0x0
pcie_rx 1000
pcie_tx 2000
process 4242 1073741824
process 4343 na
putil 4242 77 12 5000
)";

}  // namespace dlprobe::testing
