// Which GPU a command may use, from the machine's facts: each machine a user may have (no GPU, a
// GPU without its driver, a build without CUDA, a driver older than the runtime) gives its reason
// in plain words, and a GPU asked for that is not there says what to run instead.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dlprobe/device/availability.h"

namespace dlprobe::device {
namespace {

GpuFacts no_gpu() {
  GpuFacts f;
  f.nvidia_pci_devices = 0;
  f.cuda_built = true;
  f.cuda_runtime = 12040;
  f.cuda_error = "CUDA driver version is insufficient for CUDA runtime version";
  return f;
}

TEST(ExplainGpus, EachMachineSaysWhatIsMissing) {
  struct Case {
    const char* what;
    GpuFacts facts;
    const char* reason;
  };
  GpuFacts no_driver = no_gpu();
  no_driver.nvidia_pci_devices = 2;
  GpuFacts hidden_bus = no_gpu();
  hidden_bus.nvidia_pci_devices.reset();
  GpuFacts no_cuda = no_gpu();
  no_cuda.driver_loaded = true;
  no_cuda.cuda_built = false;
  no_cuda.cuda_runtime = 0;
  GpuFacts old_driver = no_gpu();
  old_driver.nvidia_pci_devices = 1;
  old_driver.driver_loaded = true;
  old_driver.cuda_driver = 12020;
  GpuFacts other = no_gpu();
  other.nvidia_pci_devices = 1;
  other.driver_loaded = true;
  other.cuda_driver = 12080;
  other.cuda_error = "all CUDA-capable devices are busy or unavailable";
  const Case cases[] = {
      {"no GPU, no driver", no_gpu(), "this machine has no NVIDIA GPU"},
      {"a GPU without its driver", no_driver, "no NVIDIA driver is loaded"},
      {"a bus that cannot be read", hidden_bus, "no NVIDIA driver is loaded"},
      {"a build without CUDA", no_cuda, "this build of dlprobe has no CUDA backend"},
      {"an old driver", old_driver,
       "the NVIDIA driver is too old for CUDA 12.4 (it serves CUDA 12.2 at most"},
      {"the runtime's own words", other, "busy or unavailable"},
  };
  for (const Case& c : cases) {
    const GpuAvailability a = explain_gpus(c.facts);
    EXPECT_EQ(a.devices, 0) << c.what;
    EXPECT_NE(a.why_none.find(c.reason), std::string::npos) << c.what << ": " << a.why_none;
    // The runtime blames an insufficient driver where there is none at all.
    if (c.facts.cuda_driver == 0) {
      EXPECT_EQ(a.why_none.find("insufficient"), std::string::npos) << c.what << ": " << a.why_none;
    }
  }
}

TEST(ExplainGpus, UsableDevicesAreTheDefault) {
  GpuFacts f = no_gpu();
  f.cuda_devices = 2;
  const GpuAvailability a = explain_gpus(f);
  EXPECT_EQ(a.devices, 2);
  EXPECT_TRUE(a.why_none.empty());
  EXPECT_EQ(default_device(a).kind, DeviceKind::cuda);
  EXPECT_EQ(default_device(a).index, 0);
  EXPECT_EQ(default_device(explain_gpus(no_gpu())).kind, DeviceKind::cpu);
}

TEST(CheckDevice, AMissingGpuSaysWhatToRunInstead) {
  const GpuAvailability none = explain_gpus(no_gpu());
  EXPECT_TRUE(check_device({DeviceKind::cpu, 0}, none).is_ok());
  const Status s = check_device({DeviceKind::cuda, 0}, none);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(),
            "cuda:0: no usable GPU: this machine has no NVIDIA GPU (none on its PCI bus); run on "
            "the CPU instead with --device cpu");
  EXPECT_EQ(s.message().find(".cpp"), std::string::npos);

  const GpuAvailability one{1, ""};
  EXPECT_TRUE(check_device({DeviceKind::cuda, 0}, one).is_ok());
  const Status beyond = check_device({DeviceKind::cuda, 1}, one);
  ASSERT_FALSE(beyond.is_ok());
  EXPECT_EQ(beyond.message(), "cuda:1: this machine has 1 usable GPU (cuda:0)");
}

// A /sys/bus/pci/devices of a machine with an NVIDIA GPU (and its audio function), another
// vendor's GPU and an NVSwitch.
TEST(CountNvidiaPciDevices, CountsDisplayAndComputeControllers) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / "dlprobe_fake_pci";
  std::filesystem::remove_all(root);
  const auto add = [&](const char* slot, const char* vendor, const char* cls) {
    std::filesystem::create_directories(root / slot);
    std::ofstream(root / slot / "vendor") << vendor << "\n";
    std::ofstream(root / slot / "class") << cls << "\n";
  };
  EXPECT_EQ(count_nvidia_pci_devices(root / "absent"), std::nullopt);
  std::filesystem::create_directories(root);
  EXPECT_EQ(count_nvidia_pci_devices(root), 0);
  add("0000:19:00.0", "0x10de", "0x030200");
  add("0000:19:00.1", "0x10de", "0x040300");
  add("0000:03:00.0", "0x1002", "0x030000");
  add("0000:05:00.0", "0x10de", "0x068000");
  add("0000:3b:00.0", "0x10de", "0x030000");
  EXPECT_EQ(count_nvidia_pci_devices(root), 2);
  std::filesystem::remove_all(root);
}

TEST(GatherGpuFacts, ReadsTheBusAndTheDriverFromTheFilesNamed) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / "dlprobe_fake_sys";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "pci");
  GpuFacts f = gather_gpu_facts(root / "pci", root / "nvidia_version");
  EXPECT_EQ(f.nvidia_pci_devices, 0);
  EXPECT_FALSE(f.driver_loaded);
  std::ofstream(root / "nvidia_version") << "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n";
  f = gather_gpu_facts(root / "pci", root / "nvidia_version");
  EXPECT_TRUE(f.driver_loaded);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace dlprobe::device
