// NVML, loaded at run time with dlopen (nvml.h is not needed to build, and a machine without the
// NVIDIA driver still runs dlprobe). One Library object per process; every query returns either a
// value or "unavailable" (std::nullopt) with the reason kept, never a 0 that could be read as data.
//
// DLPROBE_NVML_LIBRARY=PATH loads another library through the same path (the tests' fake NVML).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe::nvml {

// Clock-event ("throttle") reasons, NVML's bit values (nvmlClocksEventReason*).
enum ClockEventReason : std::uint64_t {
  kClockEventGpuIdle = 0x1,
  kClockEventApplicationsClocksSetting = 0x2,
  kClockEventSwPowerCap = 0x4,
  kClockEventHwSlowdown = 0x8,
  kClockEventSyncBoost = 0x10,
  kClockEventSwThermalSlowdown = 0x20,
  kClockEventHwThermalSlowdown = 0x40,
  kClockEventHwPowerBrakeSlowdown = 0x80,
  kClockEventDisplayClockSetting = 0x100,
};
// Names of the bits set in `mask` ("sw_power_cap", "hw_thermal_slowdown", …); unknown bits as hex.
std::vector<std::string> clock_event_reason_names(std::uint64_t mask);
// True when a set bit means the GPU runs slower than it could for power or heat (idle is not).
bool clock_events_throttle(std::uint64_t mask);
// The bits of `mask` that slow the GPU down (power, thermal, hardware slowdown): not "idle" or an
// application-clock setting.
std::uint64_t throttling_clock_events(std::uint64_t mask);

// What does not change while a process runs.
struct DeviceInfo {
  unsigned index = 0;
  std::string name;
  std::string uuid;
  std::string pci_bus_id;
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<double> power_limit_w;          // enforced limit
  std::optional<double> power_default_limit_w;  // the board's default
  std::optional<unsigned> max_sm_clock_mhz;
  std::optional<unsigned> max_mem_clock_mhz;
  std::optional<int> cc_major;
  std::optional<int> cc_minor;
  std::optional<bool> ecc_enabled;
  std::optional<bool> mig_enabled;
  std::optional<bool> persistence_enabled;
  std::optional<unsigned> pcie_link_gen;
  std::optional<unsigned> pcie_link_width;
};

// One reading of the changing state.
struct DeviceSample {
  std::int64_t timestamp_ns = 0;  // steady clock of this process
  std::optional<unsigned> gpu_util_pct;
  std::optional<unsigned> mem_util_pct;
  std::optional<std::uint64_t> mem_used_bytes;
  std::optional<std::uint64_t> mem_free_bytes;
  std::optional<std::uint64_t> mem_reserved_bytes;  // held by the driver (nvmlMemory_v2 only)
  std::optional<double> power_w;
  std::optional<std::uint64_t> energy_mj;  // total energy since the driver loaded
  std::optional<unsigned> temperature_c;
  std::optional<unsigned> sm_clock_mhz;
  std::optional<unsigned> mem_clock_mhz;
  std::optional<std::uint64_t> clock_event_reasons;  // ClockEventReason bits
  std::optional<unsigned> pcie_rx_kbps;              // only with SampleOptions::pcie_throughput
  std::optional<unsigned> pcie_tx_kbps;
};

// What sample() reads beyond the default fields.
struct SampleOptions {
  // nvmlDeviceGetPcieThroughput counts bytes over 20 ms per direction inside the call, so it is
  // off unless asked for: it would take longer than a 10 ms sampling interval.
  bool pcie_throughput = false;
  // nvmlDeviceGetTotalEnergyConsumption takes about 4 ms per call on an H200 with driver 580,
  // a thousand times any other field, so a fast sampler reads it only now and then.
  bool energy_counter = true;
};

// A process with a context on the GPU.
struct ProcessMemory {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_bytes;  // unavailable under some drivers and in containers
  bool compute = false;
  bool graphics = false;
};

// NVML's per-process utilisation sample (nvmlDeviceGetProcessUtilization).
struct ProcessUtilization {
  unsigned pid = 0;
  std::uint64_t timestamp_us = 0;  // NVML's clock, for the `since` of the next call
  unsigned sm_util_pct = 0;
  unsigned mem_util_pct = 0;
};

// How two GPUs connect (NVML indices); a field NVML cannot give is empty.
struct PairTopology {
  std::optional<int> common_ancestor;  // nvmlGpuTopologyLevel_t: 0 same board .. 50 across CPUs
  std::optional<bool> nvlink;          // NVML's P2P status over NVLink is OK
  std::optional<bool> p2p_read;        // peer reads work over whatever path
};

// Which measurements work on this driver and GPU, and why not where they do not.
struct Capability {
  bool available = false;
  std::string why_not;  // empty when available
};

class Library {
 public:
  // Loads NVML (DLPROBE_NVML_LIBRARY, else libnvidia-ml.so.1) and initialises it. Fails with
  // Errc::not_found when the library is absent and Errc::unavailable when init fails (no driver).
  static Result<std::shared_ptr<Library>> open();
  static Result<std::shared_ptr<Library>> open(const std::string& path);

  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  const std::string& path() const;
  std::optional<std::string> driver_version() const;
  std::optional<int> cuda_driver_version() const;  // e.g. 13000
  std::optional<std::string> nvml_version() const;

  Result<unsigned> device_count() const;
  Result<DeviceInfo> device_info(unsigned index) const;
  Result<DeviceSample> sample(unsigned index) const;
  Result<DeviceSample> sample(unsigned index, const SampleOptions& options) const;
  Result<std::vector<ProcessMemory>> processes(unsigned index) const;
  // Samples newer than `since_us` (0 = whatever NVML keeps); unavailable on GPUs without it.
  Result<std::vector<ProcessUtilization>> process_utilization(unsigned index,
                                                              std::uint64_t since_us) const;

  Result<PairTopology> pair_topology(unsigned a, unsigned b) const;
  // Active NVLink links of the GPU; unavailable where it has none or NVML cannot tell.
  Result<unsigned> nvlink_active_links(unsigned index) const;

  Capability per_process_memory(unsigned index) const;
  Capability per_process_utilization(unsigned index) const;
  Capability energy_counter(unsigned index) const;

  struct Impl;

 private:
  explicit Library(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlprobe::nvml
