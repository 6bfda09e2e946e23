// The NVML loader against the fake NVML libraries, loaded with dlopen as a real driver would be.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "dlprobe/monitor/nvml.h"
#include "fake_script.h"

namespace dlprobe::nvml {
namespace {

using dlprobe::testing::FakeScript;
using dlprobe::testing::kH200Script;

std::shared_ptr<Library> open_fake(const char* path = DLPROBE_FAKE_NVML) {
  auto lib = Library::open(path);
  EXPECT_TRUE(lib.has_value()) << lib.status().message();
  return lib.has_value() ? *lib : nullptr;
}

// How often the fake saw `api` called (the fake exports a counter for the tests).
unsigned long long fake_calls(const char* library, const char* api) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr);
  using CallsFn = unsigned long long (*)(const char*);
  auto calls = reinterpret_cast<CallsFn>(dlsym(handle, "dlprobe_fake_nvml_calls"));
  EXPECT_NE(calls, nullptr);
  const unsigned long long n = calls != nullptr ? calls(api) : 0;
  dlclose(handle);
  return n;
}

TEST(NvmlLoader, StaticInfoAndVersions) {
  FakeScript script(kH200Script);
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  EXPECT_EQ(lib->path(), DLPROBE_FAKE_NVML);
  EXPECT_EQ(lib->driver_version(), "580.95.05");
  EXPECT_EQ(lib->nvml_version(), "13.580.95.05");
  EXPECT_EQ(lib->cuda_driver_version(), 13000);
  EXPECT_EQ(lib->device_count().value(), 1U);

  auto info = lib->device_info(0);
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_EQ(info->name, "NVIDIA H200");
  EXPECT_EQ(info->uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(info->pci_bus_id, "00000000:19:00.0");
  EXPECT_EQ(info->memory_total_bytes, 150754820096ULL);
  EXPECT_EQ(info->power_limit_w, 700.0);
  EXPECT_EQ(info->power_default_limit_w, 700.0);
  EXPECT_EQ(info->max_sm_clock_mhz, 1980U);
  EXPECT_EQ(info->max_mem_clock_mhz, 3201U);
  EXPECT_EQ(info->cc_major, 9);
  EXPECT_EQ(info->cc_minor, 0);
  EXPECT_EQ(info->ecc_enabled, true);
  EXPECT_EQ(info->mig_enabled, false);
  EXPECT_EQ(info->persistence_enabled, true);
  EXPECT_EQ(info->pcie_link_gen, 5U);
  EXPECT_EQ(info->pcie_link_width, 16U);
  // The newest entry points were the ones used.
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlInit_v2"), 1U);
  EXPECT_GE(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetMemoryInfo_v2"), 1U);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetMemoryInfo"), 0U);
}

TEST(NvmlLoader, TopologyOfAPair) {
  FakeScript script(
      "device\nname A\nnvlink_links 18\nnvlink_active 16\ntopology 50\np2p_nvlink 0\n"
      "p2p_read 0\n"
      "device\nname B\ntopology 10\np2p_nvlink 5\np2p_read 0\n");
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto nvlinked = lib->pair_topology(0, 1);
  ASSERT_TRUE(nvlinked) << nvlinked.status().message();
  EXPECT_EQ(nvlinked->common_ancestor, 50);
  EXPECT_EQ(nvlinked->nvlink, true);
  EXPECT_EQ(nvlinked->p2p_read, true);
  auto pcie = lib->pair_topology(1, 0);
  ASSERT_TRUE(pcie) << pcie.status().message();
  EXPECT_EQ(pcie->common_ancestor, 10);
  EXPECT_EQ(pcie->nvlink, false);  // NVML_P2P_STATUS_NOT_SUPPORTED
  EXPECT_EQ(lib->nvlink_active_links(0).value(), 16U);
  // No NVLink at all: unavailable, not 0 links.
  EXPECT_EQ(lib->nvlink_active_links(1).status().code(), Errc::unavailable);
  EXPECT_EQ(lib->pair_topology(0, 7).status().code(), Errc::not_found);
}

TEST(NvmlLoader, DynamicSamplesFollowTheScript) {
  FakeScript script(kH200Script);
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto first = lib->sample(0);
  ASSERT_TRUE(first) << first.status().message();
  EXPECT_GT(first->timestamp_ns, 0);
  EXPECT_EQ(first->gpu_util_pct, 10U);
  EXPECT_EQ(first->mem_util_pct, 5U);
  EXPECT_EQ(first->mem_used_bytes, 1073741824ULL);
  EXPECT_EQ(first->mem_reserved_bytes, 536870912ULL);
  EXPECT_EQ(first->mem_free_bytes, 150754820096ULL - 536870912ULL - 1073741824ULL);
  EXPECT_EQ(first->power_w, 100.0);
  EXPECT_EQ(first->energy_mj, 1000000ULL);
  EXPECT_EQ(first->temperature_c, 40U);
  EXPECT_EQ(first->sm_clock_mhz, 1980U);
  EXPECT_EQ(first->mem_clock_mhz, 3201U);
  EXPECT_EQ(first->clock_event_reasons, 0x1ULL);
  // PCIe throughput is read only when asked for.
  EXPECT_FALSE(first->pcie_rx_kbps);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetPcieThroughput"), 0U);

  auto second = lib->sample(0, SampleOptions{.pcie_throughput = true, .energy_counter = false});
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->energy_mj);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetTotalEnergyConsumption"), 1U);
  EXPECT_EQ(second->gpu_util_pct, 90U);
  EXPECT_EQ(second->power_w, 300.0);
  EXPECT_EQ(second->clock_event_reasons, 0x44ULL);
  EXPECT_EQ(second->pcie_rx_kbps, 1000U);
  EXPECT_EQ(second->pcie_tx_kbps, 2000U);
  EXPECT_GE(second->timestamp_ns, first->timestamp_ns);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetCurrentClocksEventReasons"), 2U);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetCurrentClocksThrottleReasons"), 0U);
}

TEST(NvmlLoader, UnsupportedFieldsAreEmptyNotZero) {
  FakeScript script(R"(
device
name G
gpu_util 0
mem_util 0
power_mw 0
temperature 0
fail nvmlDeviceGetPowerUsage 3
fail nvmlDeviceGetTemperature 4
fail nvmlDeviceGetTotalEnergyConsumption 3
)");
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto s = lib->sample(0);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->gpu_util_pct, 0U);  // a real zero stays a zero
  EXPECT_FALSE(s->power_w);        // NOT_SUPPORTED
  EXPECT_FALSE(s->temperature_c);  // NO_PERMISSION
  EXPECT_FALSE(s->energy_mj);
  EXPECT_FALSE(s->mem_used_bytes);  // the script gives no memory
  EXPECT_FALSE(s->sm_clock_mhz);
  auto info = lib->device_info(0);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->name, "G");
  EXPECT_TRUE(info->uuid.empty());
  EXPECT_FALSE(info->memory_total_bytes);
  EXPECT_FALSE(info->power_limit_w);
  EXPECT_FALSE(info->ecc_enabled);
  EXPECT_FALSE(info->cc_major);
  auto energy = lib->energy_counter(0);
  EXPECT_FALSE(energy.available);
  EXPECT_NE(energy.why_not.find("Not Supported"), std::string::npos) << energy.why_not;
}

TEST(NvmlLoader, LostGpuFailsTheWholeSample) {
  FakeScript script("device\ngpu_util 1\nmem_util 1\nfail nvmlDeviceGetPowerUsage 15\n");
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto s = lib->sample(0);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Errc::api_error);
  EXPECT_NE(s.status().message().find("nvmlDeviceGetPowerUsage"), std::string::npos);
  EXPECT_NE(s.status().message().find("GPU is lost"), std::string::npos) << s.status().message();
}

TEST(NvmlLoader, LegacyLibraryFallsBackOrReportsUnavailable) {
  FakeScript script(kH200Script);
  auto lib = open_fake(DLPROBE_FAKE_NVML_LEGACY);
  ASSERT_TRUE(lib);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML_LEGACY, "nvmlInit"), 1U);
  EXPECT_EQ(lib->device_count().value(), 1U);
  auto s = lib->sample(0);
  ASSERT_TRUE(s) << s.status().message();
  // nvmlMemory_t (v1) has no reservation and counts it as used.
  EXPECT_FALSE(s->mem_reserved_bytes);
  EXPECT_EQ(s->mem_used_bytes, 1073741824ULL + 536870912ULL);
  EXPECT_FALSE(s->energy_mj);
  EXPECT_EQ(s->clock_event_reasons, 0x1ULL);
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML_LEGACY, "nvmlDeviceGetCurrentClocksThrottleReasons"), 1U);
  EXPECT_EQ(lib->cuda_driver_version(), 13000);

  auto energy = lib->energy_counter(0);
  EXPECT_FALSE(energy.available);
  EXPECT_NE(energy.why_not.find("nvmlDeviceGetTotalEnergyConsumption"), std::string::npos);

  auto processes = lib->processes(0);
  ASSERT_TRUE(processes) << processes.status().message();
  ASSERT_EQ(processes->size(), 2U);
  EXPECT_EQ((*processes)[0].pid, 4242U);
  EXPECT_EQ((*processes)[0].used_bytes, 1073741824ULL);
  EXPECT_TRUE((*processes)[0].compute);
  EXPECT_FALSE((*processes)[1].used_bytes);

  auto putil = lib->process_utilization(0, 0);
  ASSERT_FALSE(putil);
  EXPECT_EQ(putil.status().code(), Errc::unavailable);
  EXPECT_FALSE(lib->per_process_utilization(0).available);
}

TEST(NvmlLoader, ProcessesThroughV3WithValueNotAvailable) {
  FakeScript script(kH200Script);
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto processes = lib->processes(0);
  ASSERT_TRUE(processes) << processes.status().message();
  ASSERT_EQ(processes->size(), 2U);
  EXPECT_EQ((*processes)[0].pid, 4242U);
  EXPECT_EQ((*processes)[0].used_bytes, 1073741824ULL);
  EXPECT_EQ((*processes)[1].pid, 4343U);
  EXPECT_FALSE((*processes)[1].used_bytes);  // NVML_VALUE_NOT_AVAILABLE
  EXPECT_GE(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetComputeRunningProcesses_v3"), 2U);
  auto capability = lib->per_process_memory(0);
  EXPECT_FALSE(capability.available);
  EXPECT_NE(capability.why_not.find("NVML_VALUE_NOT_AVAILABLE"), std::string::npos);
}

TEST(NvmlLoader, ProcessListRetriesOnInsufficientSize) {
  FakeScript script(
      "device\nprocess 1 100\nprocess 2 200\nprocess 3 300\nprocess_insufficient 3\n");
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  // The fake library stays loaded between tests of one process, and so do its counts.
  const auto before = fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetComputeRunningProcesses_v3");
  auto processes = lib->processes(0);
  ASSERT_TRUE(processes) << processes.status().message();
  ASSERT_EQ(processes->size(), 3U);
  EXPECT_EQ((*processes)[2].pid, 3U);
  EXPECT_EQ((*processes)[2].used_bytes, 300U);
  // The size query, three refused fills, then the fill that succeeds.
  EXPECT_EQ(fake_calls(DLPROBE_FAKE_NVML, "nvmlDeviceGetComputeRunningProcesses_v3") - before, 5U);
  EXPECT_TRUE(lib->per_process_memory(0).available);
}

TEST(NvmlLoader, ProcessListThatNeverSettlesIsAnError) {
  FakeScript script("device\nprocess 1 100\nprocess_insufficient 1000\n");
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto processes = lib->processes(0);
  ASSERT_FALSE(processes);
  EXPECT_EQ(processes.status().code(), Errc::unavailable);
  EXPECT_NE(processes.status().message().find("kept growing"), std::string::npos);
}

TEST(NvmlLoader, ProcessUtilizationSinceTimestamp) {
  FakeScript script(kH200Script);
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto all = lib->process_utilization(0, 0);
  ASSERT_TRUE(all) << all.status().message();
  ASSERT_EQ(all->size(), 1U);
  EXPECT_EQ((*all)[0].pid, 4242U);
  EXPECT_EQ((*all)[0].sm_util_pct, 77U);
  EXPECT_EQ((*all)[0].mem_util_pct, 12U);
  EXPECT_EQ((*all)[0].timestamp_us, 5000U);
  auto newer = lib->process_utilization(0, 5000);
  ASSERT_TRUE(newer) << newer.status().message();
  EXPECT_TRUE(newer->empty());
  EXPECT_TRUE(lib->per_process_utilization(0).available);
}

TEST(NvmlLoader, FailedInitIsUnavailableWithNvmlText) {
  FakeScript script("init_error 9\ndevice\n");
  auto lib = Library::open(DLPROBE_FAKE_NVML);
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.status().code(), Errc::unavailable);
  EXPECT_NE(lib.status().message().find("Driver Not Loaded"), std::string::npos)
      << lib.status().message();
}

TEST(NvmlLoader, MissingLibraryIsNotFound) {
  auto lib = Library::open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.status().code(), Errc::not_found);
  EXPECT_NE(lib.status().message().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos);
}

TEST(NvmlLoader, LibraryWithoutNvmlSymbolsIsNotFound) {
  // Any shared library that is not NVML: the C library is always there.
  auto lib = Library::open("libc.so.6");
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.status().code(), Errc::not_found);
  EXPECT_NE(lib.status().message().find("nvmlInit_v2"), std::string::npos);
}

TEST(NvmlLoader, EnvironmentPicksTheLibrary) {
  FakeScript script(kH200Script);
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  auto lib = Library::open();
  unsetenv("DLPROBE_NVML_LIBRARY");
  ASSERT_TRUE(lib) << lib.status().message();
  EXPECT_EQ((*lib)->path(), DLPROBE_FAKE_NVML);
}

TEST(NvmlLoader, BadDeviceIndexIsNotFound) {
  FakeScript script(kH200Script);
  auto lib = open_fake();
  ASSERT_TRUE(lib);
  auto s = lib->sample(3);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Errc::not_found);
}

TEST(ClockEvents, NamesAndThrottling) {
  EXPECT_TRUE(clock_event_reason_names(0).empty());
  EXPECT_EQ(clock_event_reason_names(0x44),
            (std::vector<std::string>{"sw_power_cap", "hw_thermal_slowdown"}));
  EXPECT_EQ(clock_event_reason_names(0x1 | 0x1000),
            (std::vector<std::string>{"gpu_idle", "0x1000"}));
  EXPECT_EQ(clock_event_reason_names(kClockEventHwPowerBrakeSlowdown),
            (std::vector<std::string>{"hw_power_brake_slowdown"}));
  EXPECT_FALSE(clock_events_throttle(kClockEventGpuIdle | kClockEventApplicationsClocksSetting));
  EXPECT_TRUE(clock_events_throttle(kClockEventSwPowerCap));
  EXPECT_TRUE(clock_events_throttle(kClockEventHwThermalSlowdown | kClockEventGpuIdle));
}

}  // namespace
}  // namespace dlprobe::nvml
