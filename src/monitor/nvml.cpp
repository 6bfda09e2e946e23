#include "dlprobe/monitor/nvml.h"
#include "dlprobe/core/clock.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string_view>

#include "dlprobe/core/log.h"
#include "nvml_abi.h"
#include "nvml_check.h"

namespace dlprobe::nvml {

namespace {

struct ReasonName {
  std::uint64_t bit;
  std::string_view name;
};
constexpr std::array<ReasonName, 9> kReasonNames{{
    {kClockEventGpuIdle, "gpu_idle"},
    {kClockEventApplicationsClocksSetting, "applications_clocks_setting"},
    {kClockEventSwPowerCap, "sw_power_cap"},
    {kClockEventHwSlowdown, "hw_slowdown"},
    {kClockEventSyncBoost, "sync_boost"},
    {kClockEventSwThermalSlowdown, "sw_thermal_slowdown"},
    {kClockEventHwThermalSlowdown, "hw_thermal_slowdown"},
    {kClockEventHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
    {kClockEventDisplayClockSetting, "display_clock_setting"},
}};

// Codes after which no further query on the device can succeed: they fail the whole call instead of
// leaving one field empty.
bool is_fatal(abi::Return rc) {
  return rc == abi::kErrorGpuIsLost || rc == abi::kErrorUninitialized ||
         rc == abi::kErrorDriverNotLoaded;
}

// "The GPU cannot give this" versus "the call went wrong".
Errc errc_for(abi::Return rc) {
  switch (rc) {
    case abi::kErrorNotSupported:
    case abi::kErrorNoPermission:
    case abi::kErrorFunctionNotFound:
    case abi::kErrorNoData:
      return Errc::unavailable;
    default:
      return Errc::api_error;
  }
}

std::string c_string(const char* buffer, std::size_t size) {
  return {buffer, strnlen(buffer, size)};
}

// Bounds the INSUFFICIENT_SIZE retry loop: each retry means processes started between two calls.
constexpr int kMaxListAttempts = 8;
// Room for processes that start between the size query and the fill.
constexpr unsigned kListSlack = 4;

}  // namespace

std::vector<std::string> clock_event_reason_names(std::uint64_t mask) {
  std::vector<std::string> names;
  for (const auto& reason : kReasonNames) {
    if ((mask & reason.bit) != 0) {
      names.emplace_back(reason.name);
      mask &= ~reason.bit;
    }
  }
  for (std::uint64_t bit = 1; mask != 0; bit <<= 1) {
    if ((mask & bit) != 0) {
      names.push_back(fmt::format("0x{:x}", bit));
      mask &= ~bit;
    }
  }
  return names;
}

std::uint64_t throttling_clock_events(std::uint64_t mask) {
  constexpr std::uint64_t kThrottling =
      kClockEventSwPowerCap | kClockEventHwSlowdown | kClockEventSwThermalSlowdown |
      kClockEventHwThermalSlowdown | kClockEventHwPowerBrakeSlowdown;
  return mask & kThrottling;
}

bool clock_events_throttle(std::uint64_t mask) {
  return throttling_clock_events(mask) != 0;
}

struct Library::Impl {
  std::string path;
  void* handle = nullptr;
  bool initialised = false;

  // Required: without these nothing works.
  abi::InitFn init = nullptr;
  abi::ShutdownFn shutdown = nullptr;
  abi::ErrorStringFn error_string = nullptr;
  abi::DeviceGetCountFn get_count = nullptr;
  abi::DeviceGetHandleByIndexFn get_handle = nullptr;

  // Optional: a missing one leaves its fields unavailable.
  abi::SystemGetStringFn driver_version = nullptr;
  abi::SystemGetStringFn nvml_version = nullptr;
  abi::SystemGetCudaDriverVersionFn cuda_driver_version = nullptr;
  abi::DeviceGetStringFn get_name = nullptr;
  abi::DeviceGetStringFn get_uuid = nullptr;
  abi::DeviceGetPciInfoFn get_pci_info = nullptr;
  abi::DeviceGetMemoryInfoV2Fn get_memory_v2 = nullptr;
  abi::DeviceGetMemoryInfoFn get_memory = nullptr;
  abi::DeviceGetUintFn get_enforced_power_limit = nullptr;
  abi::DeviceGetUintFn get_power_limit = nullptr;
  abi::DeviceGetUintFn get_default_power_limit = nullptr;
  abi::DeviceGetClockFn get_max_clock = nullptr;
  abi::DeviceGetClockFn get_clock = nullptr;
  abi::DeviceGetCudaComputeCapabilityFn get_cc = nullptr;
  abi::DeviceGetEnableStatePairFn get_ecc_mode = nullptr;
  abi::DeviceGetUintPairFn get_mig_mode = nullptr;
  abi::DeviceGetEnableStateFn get_persistence_mode = nullptr;
  abi::DeviceGetUintFn get_pcie_gen = nullptr;
  abi::DeviceGetUintFn get_pcie_width = nullptr;
  abi::DeviceGetUtilizationRatesFn get_utilization = nullptr;
  abi::DeviceGetUintFn get_power_usage = nullptr;
  abi::DeviceGetUllFn get_energy = nullptr;
  abi::DeviceGetTemperatureFn get_temperature = nullptr;
  abi::DeviceGetUllFn get_clock_events = nullptr;
  const char* clock_events_name = "nvmlDeviceGetCurrentClocksEventReasons";
  abi::DeviceGetPcieThroughputFn get_pcie_throughput = nullptr;
  // The _v3/_v2 entry points fill ProcessInfoV2; the unsuffixed ones ProcessInfoV1.
  abi::DeviceGetProcessesV2Fn compute_processes_v2 = nullptr;
  abi::DeviceGetProcessesV1Fn compute_processes_v1 = nullptr;
  const char* compute_processes_name = "nvmlDeviceGetComputeRunningProcesses";
  abi::DeviceGetProcessesV2Fn graphics_processes_v2 = nullptr;
  abi::DeviceGetProcessesV1Fn graphics_processes_v1 = nullptr;
  abi::DeviceGetProcessUtilizationFn get_process_utilization = nullptr;
  abi::DeviceGetTopologyCommonAncestorFn get_common_ancestor = nullptr;
  abi::DeviceGetP2PStatusFn get_p2p_status = nullptr;
  abi::DeviceGetNvLinkStateFn get_nvlink_state = nullptr;

  ~Impl() {
    if (initialised) shutdown();
    if (handle != nullptr) dlclose(handle);
  }

  std::string error_text(abi::Return rc) const {
    const char* text = error_string != nullptr ? error_string(rc) : nullptr;
    return text != nullptr ? fmt::format("{} (NVML error {})", text, rc)
                           : fmt::format("NVML error {}", rc);
  }

  Status failure(std::string_view call, abi::Return rc, const char* file, int line) const {
    return api_failure("NVML", call, error_text(rc), file, line, errc_for(rc));
  }

  // The first of `names` the library exports (newest first), or nullptr; `chosen` names it.
  template <class Fn>
  Fn resolve(std::initializer_list<const char*> names, const char** chosen = nullptr) const {
    for (const char* name : names) {
      if (void* symbol = dlsym(handle, name)) {
        if (chosen != nullptr) *chosen = name;
        return reinterpret_cast<Fn>(symbol);
      }
    }
    return nullptr;
  }

  Status resolve_all() {
    struct Required {
      bool present;
      std::string_view names;
    };
    init = resolve<abi::InitFn>({"nvmlInit_v2", "nvmlInit"});
    shutdown = resolve<abi::ShutdownFn>({"nvmlShutdown"});
    error_string = resolve<abi::ErrorStringFn>({"nvmlErrorString"});
    get_count = resolve<abi::DeviceGetCountFn>({"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
    get_handle = resolve<abi::DeviceGetHandleByIndexFn>(
        {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
    for (const Required& r : {
             Required{init != nullptr, "nvmlInit_v2 / nvmlInit"},
             Required{shutdown != nullptr, "nvmlShutdown"},
             Required{error_string != nullptr, "nvmlErrorString"},
             Required{get_count != nullptr, "nvmlDeviceGetCount_v2 / nvmlDeviceGetCount"},
             Required{get_handle != nullptr,
                      "nvmlDeviceGetHandleByIndex_v2 / nvmlDeviceGetHandleByIndex"},
         }) {
      if (!r.present) {
        return error(Errc::not_found,
                     fmt::format("NVML library {} lacks {}: not a usable NVML", path, r.names));
      }
    }

    driver_version = resolve<abi::SystemGetStringFn>({"nvmlSystemGetDriverVersion"});
    nvml_version = resolve<abi::SystemGetStringFn>({"nvmlSystemGetNVMLVersion"});
    cuda_driver_version = resolve<abi::SystemGetCudaDriverVersionFn>(
        {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"});
    get_name = resolve<abi::DeviceGetStringFn>({"nvmlDeviceGetName"});
    get_uuid = resolve<abi::DeviceGetStringFn>({"nvmlDeviceGetUUID"});
    get_pci_info = resolve<abi::DeviceGetPciInfoFn>({"nvmlDeviceGetPciInfo_v3"});
    get_memory_v2 = resolve<abi::DeviceGetMemoryInfoV2Fn>({"nvmlDeviceGetMemoryInfo_v2"});
    get_memory = resolve<abi::DeviceGetMemoryInfoFn>({"nvmlDeviceGetMemoryInfo"});
    get_enforced_power_limit = resolve<abi::DeviceGetUintFn>({"nvmlDeviceGetEnforcedPowerLimit"});
    get_power_limit = resolve<abi::DeviceGetUintFn>({"nvmlDeviceGetPowerManagementLimit"});
    get_default_power_limit =
        resolve<abi::DeviceGetUintFn>({"nvmlDeviceGetPowerManagementDefaultLimit"});
    get_max_clock = resolve<abi::DeviceGetClockFn>({"nvmlDeviceGetMaxClockInfo"});
    get_clock = resolve<abi::DeviceGetClockFn>({"nvmlDeviceGetClockInfo"});
    get_cc = resolve<abi::DeviceGetCudaComputeCapabilityFn>({"nvmlDeviceGetCudaComputeCapability"});
    get_ecc_mode = resolve<abi::DeviceGetEnableStatePairFn>({"nvmlDeviceGetEccMode"});
    get_mig_mode = resolve<abi::DeviceGetUintPairFn>({"nvmlDeviceGetMigMode"});
    get_persistence_mode = resolve<abi::DeviceGetEnableStateFn>({"nvmlDeviceGetPersistenceMode"});
    get_pcie_gen = resolve<abi::DeviceGetUintFn>({"nvmlDeviceGetCurrPcieLinkGeneration"});
    get_pcie_width = resolve<abi::DeviceGetUintFn>({"nvmlDeviceGetCurrPcieLinkWidth"});
    get_utilization = resolve<abi::DeviceGetUtilizationRatesFn>({"nvmlDeviceGetUtilizationRates"});
    get_power_usage = resolve<abi::DeviceGetUintFn>({"nvmlDeviceGetPowerUsage"});
    get_energy = resolve<abi::DeviceGetUllFn>({"nvmlDeviceGetTotalEnergyConsumption"});
    get_temperature = resolve<abi::DeviceGetTemperatureFn>({"nvmlDeviceGetTemperature"});
    // Renamed in CUDA 12.2's NVML; the old name stays for older drivers.
    get_clock_events = resolve<abi::DeviceGetUllFn>(
        {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
        &clock_events_name);
    get_pcie_throughput = resolve<abi::DeviceGetPcieThroughputFn>({"nvmlDeviceGetPcieThroughput"});
    compute_processes_v2 = resolve<abi::DeviceGetProcessesV2Fn>(
        {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"},
        &compute_processes_name);
    if (compute_processes_v2 == nullptr) {
      compute_processes_v1 =
          resolve<abi::DeviceGetProcessesV1Fn>({"nvmlDeviceGetComputeRunningProcesses"});
    }
    graphics_processes_v2 = resolve<abi::DeviceGetProcessesV2Fn>(
        {"nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"});
    if (graphics_processes_v2 == nullptr) {
      graphics_processes_v1 =
          resolve<abi::DeviceGetProcessesV1Fn>({"nvmlDeviceGetGraphicsRunningProcesses"});
    }
    get_process_utilization =
        resolve<abi::DeviceGetProcessUtilizationFn>({"nvmlDeviceGetProcessUtilization"});
    get_common_ancestor =
        resolve<abi::DeviceGetTopologyCommonAncestorFn>({"nvmlDeviceGetTopologyCommonAncestor"});
    get_p2p_status = resolve<abi::DeviceGetP2PStatusFn>({"nvmlDeviceGetP2PStatus"});
    get_nvlink_state = resolve<abi::DeviceGetNvLinkStateFn>({"nvmlDeviceGetNvLinkState"});
    return Status::ok();
  }

  Status initialise() {
    DLPROBE_NVML_CHECK(*this, init());
    initialised = true;
    return Status::ok();
  }

  Result<abi::Device> device(unsigned index) const {
    abi::Device dev = nullptr;
    const abi::Return rc = get_handle(index, &dev);
    if (rc == abi::kSuccess) return dev;
    if (rc == abi::kErrorInvalidArgument) {
      return error(Errc::not_found, fmt::format("NVML has no GPU {}", index));
    }
    return failure("nvmlDeviceGetHandleByIndex", rc, __FILE__, __LINE__);
  }
};

namespace {

// Reads optional fields: a missing symbol or an unsupported field leaves the field empty; a fatal
// code (GPU lost, driver gone) is kept so the whole query fails.
class FieldReader {
 public:
  explicit FieldReader(const Library::Impl& lib) : lib_(lib) {}

  template <class Fn, class... Args>
  bool call(std::string_view name, Fn fn, Args... args) {
    if (fn == nullptr) return false;
    const abi::Return rc = fn(args...);
    if (rc == abi::kSuccess) return true;
    if (is_fatal(rc)) {
      if (status_.is_ok()) status_ = lib_.failure(name, rc, __FILE__, __LINE__);
    } else if (rc != abi::kErrorNotSupported && rc != abi::kErrorNoPermission) {
      log_debug("NVML {}: {}", name, lib_.error_text(rc));
    }
    return false;
  }

  const Status& status() const { return status_; }

 private:
  const Library::Impl& lib_;
  Status status_;
};

struct MemoryReading {
  std::uint64_t total = 0;
  std::uint64_t used = 0;
  std::uint64_t free = 0;
  std::optional<std::uint64_t> reserved;
};

std::optional<MemoryReading> read_memory(const Library::Impl& lib, FieldReader& reader,
                                         abi::Device dev) {
  abi::MemoryV2 v2{};
  v2.version = abi::kMemoryV2Version;
  if (reader.call("nvmlDeviceGetMemoryInfo_v2", lib.get_memory_v2, dev, &v2)) {
    return MemoryReading{v2.total, v2.used, v2.free, v2.reserved};
  }
  abi::Memory v1{};
  if (reader.call("nvmlDeviceGetMemoryInfo", lib.get_memory, dev, &v1)) {
    return MemoryReading{v1.total, v1.used, v1.free, std::nullopt};
  }
  return std::nullopt;
}

template <class Info, class Fn>
Result<std::vector<Info>> read_list(const Library::Impl& lib, std::string_view name, Fn fn,
                                    abi::Device dev) {
  std::vector<Info> buffer;
  for (int attempt = 0; attempt < kMaxListAttempts; ++attempt) {
    auto count = static_cast<unsigned>(buffer.size());
    const abi::Return rc = fn(dev, &count, buffer.empty() ? nullptr : buffer.data());
    if (rc == abi::kSuccess) {
      buffer.resize(std::min<std::size_t>(count, buffer.size()));
      return buffer;
    }
    if (rc != abi::kErrorInsufficientSize) return lib.failure(name, rc, __FILE__, __LINE__);
    buffer.resize(std::max<std::size_t>(count, buffer.size()) + kListSlack);
  }
  return error(Errc::unavailable,
               fmt::format("NVML {}: the process list kept growing over {} attempts", name,
                           kMaxListAttempts));
}

template <class Info>
void merge_processes(std::vector<ProcessMemory>& out, const std::vector<Info>& infos,
                     bool compute) {
  for (const Info& info : infos) {
    ProcessMemory* row = nullptr;
    for (auto& existing : out) {
      if (existing.pid == info.pid) row = &existing;
    }
    if (row == nullptr) {
      row = &out.emplace_back();
      row->pid = info.pid;
    }
    if (info.usedGpuMemory != abi::kValueNotAvailable) {
      // A process with both kinds of context has one allocation total; NVML reports it in both.
      row->used_bytes = std::max<std::uint64_t>(row->used_bytes.value_or(0), info.usedGpuMemory);
    }
    (compute ? row->compute : row->graphics) = true;
  }
}

// One kind (compute or graphics) of process list through whichever entry point was resolved.
Result<bool> add_processes(const Library::Impl& lib, abi::Device dev,
                           std::vector<ProcessMemory>& out, abi::DeviceGetProcessesV2Fn v2,
                           abi::DeviceGetProcessesV1Fn v1, std::string_view name, bool compute) {
  if (v2 != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(auto infos, read_list<abi::ProcessInfoV2>(lib, name, v2, dev));
    merge_processes(out, infos, compute);
    return true;
  }
  if (v1 != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(auto infos, read_list<abi::ProcessInfoV1>(lib, name, v1, dev));
    merge_processes(out, infos, compute);
    return true;
  }
  return false;
}

// A version string of the system (driver, NVML), or nullopt where NVML does not give it.
template <class Fn>
std::optional<std::string> system_version(const Library::Impl& lib, std::string_view name, Fn fn) {
  std::array<char, abi::kSystemVersionBufferSize> buffer{};
  FieldReader reader(lib);
  if (!reader.call(name, fn, buffer.data(), static_cast<unsigned>(buffer.size()))) {
    return std::nullopt;
  }
  return c_string(buffer.data(), buffer.size());
}

}  // namespace

Library::Library(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Library::~Library() = default;

Result<std::shared_ptr<Library>> Library::open() {
  const char* env = std::getenv("DLPROBE_NVML_LIBRARY");
  return open(env != nullptr && *env != '\0' ? env : "libnvidia-ml.so.1");
}

Result<std::shared_ptr<Library>> Library::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (impl->handle == nullptr) {
    const char* why = dlerror();
    return error(Errc::not_found,
                 fmt::format("NVML library {} could not be loaded ({}): is the NVIDIA driver "
                             "installed?",
                             path, why != nullptr ? why : "unknown reason"));
  }
  DLPROBE_RETURN_IF_ERROR(impl->resolve_all());
  if (Status s = impl->initialise(); !s) {
    return error(Errc::unavailable,
                 fmt::format("NVML did not initialise, so the NVIDIA driver is not usable here: {}",
                             s.message()));
  }
  return std::shared_ptr<Library>(new Library(std::move(impl)));
}

const std::string& Library::path() const {
  return impl_->path;
}

std::optional<std::string> Library::driver_version() const {
  return system_version(*impl_, "nvmlSystemGetDriverVersion", impl_->driver_version);
}

std::optional<int> Library::cuda_driver_version() const {
  int version = 0;
  FieldReader reader(*impl_);
  if (!reader.call("nvmlSystemGetCudaDriverVersion", impl_->cuda_driver_version, &version)) {
    return std::nullopt;
  }
  return version;
}

std::optional<std::string> Library::nvml_version() const {
  return system_version(*impl_, "nvmlSystemGetNVMLVersion", impl_->nvml_version);
}

Result<unsigned> Library::device_count() const {
  unsigned count = 0;
  DLPROBE_NVML_CHECK(*impl_, impl_->get_count(&count));
  return count;
}

Result<DeviceInfo> Library::device_info(unsigned index) const {
  DLPROBE_ASSIGN_OR_RETURN(abi::Device dev, impl_->device(index));
  const Impl& lib = *impl_;
  FieldReader r(lib);
  DeviceInfo info;
  info.index = index;

  std::array<char, abi::kDeviceNameBufferSize> name{};
  if (r.call("nvmlDeviceGetName", lib.get_name, dev, name.data(),
             static_cast<unsigned>(name.size()))) {
    info.name = c_string(name.data(), name.size());
  }
  std::array<char, abi::kDeviceUuidBufferSize> uuid{};
  if (r.call("nvmlDeviceGetUUID", lib.get_uuid, dev, uuid.data(),
             static_cast<unsigned>(uuid.size()))) {
    info.uuid = c_string(uuid.data(), uuid.size());
  }
  abi::PciInfo pci{};
  if (r.call("nvmlDeviceGetPciInfo_v3", lib.get_pci_info, dev, &pci)) {
    info.pci_bus_id = c_string(pci.busId, sizeof(pci.busId));
  }
  if (auto memory = read_memory(lib, r, dev)) info.memory_total_bytes = memory->total;

  unsigned milliwatts = 0;
  if (r.call("nvmlDeviceGetEnforcedPowerLimit", lib.get_enforced_power_limit, dev, &milliwatts) ||
      r.call("nvmlDeviceGetPowerManagementLimit", lib.get_power_limit, dev, &milliwatts)) {
    info.power_limit_w = milliwatts / 1000.0;
  }
  if (r.call("nvmlDeviceGetPowerManagementDefaultLimit", lib.get_default_power_limit, dev,
             &milliwatts)) {
    info.power_default_limit_w = milliwatts / 1000.0;
  }
  unsigned mhz = 0;
  if (r.call("nvmlDeviceGetMaxClockInfo", lib.get_max_clock, dev, abi::kClockSm, &mhz)) {
    info.max_sm_clock_mhz = mhz;
  }
  if (r.call("nvmlDeviceGetMaxClockInfo", lib.get_max_clock, dev, abi::kClockMem, &mhz)) {
    info.max_mem_clock_mhz = mhz;
  }
  int major = 0;
  int minor = 0;
  if (r.call("nvmlDeviceGetCudaComputeCapability", lib.get_cc, dev, &major, &minor)) {
    info.cc_major = major;
    info.cc_minor = minor;
  }
  int current = 0;
  int pending = 0;
  if (r.call("nvmlDeviceGetEccMode", lib.get_ecc_mode, dev, &current, &pending)) {
    info.ecc_enabled = current == abi::kFeatureEnabled;
  }
  unsigned mig_current = 0;
  unsigned mig_pending = 0;
  if (r.call("nvmlDeviceGetMigMode", lib.get_mig_mode, dev, &mig_current, &mig_pending)) {
    info.mig_enabled = mig_current == abi::kFeatureEnabled;
  }
  if (r.call("nvmlDeviceGetPersistenceMode", lib.get_persistence_mode, dev, &current)) {
    info.persistence_enabled = current == abi::kFeatureEnabled;
  }
  unsigned link = 0;
  if (r.call("nvmlDeviceGetCurrPcieLinkGeneration", lib.get_pcie_gen, dev, &link)) {
    info.pcie_link_gen = link;
  }
  if (r.call("nvmlDeviceGetCurrPcieLinkWidth", lib.get_pcie_width, dev, &link)) {
    info.pcie_link_width = link;
  }
  DLPROBE_RETURN_IF_ERROR(r.status());
  return info;
}

Result<DeviceSample> Library::sample(unsigned index) const {
  return sample(index, SampleOptions{});
}

Result<DeviceSample> Library::sample(unsigned index, const SampleOptions& options) const {
  DLPROBE_ASSIGN_OR_RETURN(abi::Device dev, impl_->device(index));
  const Impl& lib = *impl_;
  FieldReader r(lib);
  DeviceSample s;
  s.timestamp_ns = steady_now_ns();

  abi::Utilization utilization{};
  if (r.call("nvmlDeviceGetUtilizationRates", lib.get_utilization, dev, &utilization)) {
    s.gpu_util_pct = utilization.gpu;
    s.mem_util_pct = utilization.memory;
  }
  if (auto memory = read_memory(lib, r, dev)) {
    s.mem_used_bytes = memory->used;
    s.mem_free_bytes = memory->free;
    s.mem_reserved_bytes = memory->reserved;
  }
  unsigned milliwatts = 0;
  if (r.call("nvmlDeviceGetPowerUsage", lib.get_power_usage, dev, &milliwatts)) {
    s.power_w = milliwatts / 1000.0;
  }
  unsigned long long millijoules = 0;
  if (options.energy_counter &&
      r.call("nvmlDeviceGetTotalEnergyConsumption", lib.get_energy, dev, &millijoules)) {
    s.energy_mj = millijoules;
  }
  unsigned value = 0;
  if (r.call("nvmlDeviceGetTemperature", lib.get_temperature, dev, abi::kTemperatureGpu, &value)) {
    s.temperature_c = value;
  }
  if (r.call("nvmlDeviceGetClockInfo", lib.get_clock, dev, abi::kClockSm, &value)) {
    s.sm_clock_mhz = value;
  }
  if (r.call("nvmlDeviceGetClockInfo", lib.get_clock, dev, abi::kClockMem, &value)) {
    s.mem_clock_mhz = value;
  }
  unsigned long long reasons = 0;
  if (r.call(lib.clock_events_name, lib.get_clock_events, dev, &reasons)) {
    s.clock_event_reasons = reasons;
  }
  if (options.pcie_throughput) {
    if (r.call("nvmlDeviceGetPcieThroughput", lib.get_pcie_throughput, dev, abi::kPcieUtilRxBytes,
               &value)) {
      s.pcie_rx_kbps = value;
    }
    if (r.call("nvmlDeviceGetPcieThroughput", lib.get_pcie_throughput, dev, abi::kPcieUtilTxBytes,
               &value)) {
      s.pcie_tx_kbps = value;
    }
  }
  DLPROBE_RETURN_IF_ERROR(r.status());
  return s;
}

Result<std::vector<ProcessMemory>> Library::processes(unsigned index) const {
  DLPROBE_ASSIGN_OR_RETURN(abi::Device dev, impl_->device(index));
  const Impl& lib = *impl_;
  std::vector<ProcessMemory> out;
  DLPROBE_ASSIGN_OR_RETURN(
      bool have_compute, add_processes(lib, dev, out, lib.compute_processes_v2,
                                       lib.compute_processes_v1, lib.compute_processes_name, true));
  if (!have_compute) {
    return error(
        Errc::unavailable,
        fmt::format("NVML library {} has no nvmlDeviceGetComputeRunningProcesses", lib.path));
  }
  // Graphics contexts only add rows; a GPU without graphics support must not lose compute rows.
  auto graphics = add_processes(lib, dev, out, lib.graphics_processes_v2, lib.graphics_processes_v1,
                                "nvmlDeviceGetGraphicsRunningProcesses", false);
  if (!graphics) log_debug("{}", graphics.status().message());
  return out;
}

Result<std::vector<ProcessUtilization>> Library::process_utilization(unsigned index,
                                                                     std::uint64_t since_us) const {
  DLPROBE_ASSIGN_OR_RETURN(abi::Device dev, impl_->device(index));
  const Impl& lib = *impl_;
  if (lib.get_process_utilization == nullptr) {
    return error(Errc::unavailable,
                 fmt::format("NVML library {} has no nvmlDeviceGetProcessUtilization", lib.path));
  }
  // NVML answers NOT_FOUND when no process has a sample newer than `since_us`.
  auto fill = [&](abi::Device d, unsigned* count, abi::ProcessUtilizationSample* samples) {
    const abi::Return rc = lib.get_process_utilization(d, samples, count, since_us);
    if (rc == abi::kErrorNotFound) *count = 0;
    return rc == abi::kErrorNotFound ? abi::kSuccess : rc;
  };
  DLPROBE_ASSIGN_OR_RETURN(auto samples, read_list<abi::ProcessUtilizationSample>(
                                             lib, "nvmlDeviceGetProcessUtilization", fill, dev));
  std::vector<ProcessUtilization> out;
  out.reserve(samples.size());
  for (const auto& sample : samples) {
    out.push_back({sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil});
  }
  return out;
}

Result<PairTopology> Library::pair_topology(unsigned a, unsigned b) const {
  auto dev_a = impl_->device(a);
  if (!dev_a) return dev_a.status();
  auto dev_b = impl_->device(b);
  if (!dev_b) return dev_b.status();
  FieldReader reader(*impl_);
  PairTopology out;
  int level = 0;
  if (reader.call("nvmlDeviceGetTopologyCommonAncestor", impl_->get_common_ancestor, *dev_a, *dev_b,
                  &level)) {
    out.common_ancestor = level;
  }
  int status = 0;
  if (reader.call("nvmlDeviceGetP2PStatus", impl_->get_p2p_status, *dev_a, *dev_b,
                  abi::kP2pCapsNvlink, &status)) {
    out.nvlink = status == abi::kP2pStatusOk;
  }
  if (reader.call("nvmlDeviceGetP2PStatus", impl_->get_p2p_status, *dev_a, *dev_b,
                  abi::kP2pCapsRead, &status)) {
    out.p2p_read = status == abi::kP2pStatusOk;
  }
  if (!reader.status()) return reader.status();
  return out;
}

Result<unsigned> Library::nvlink_active_links(unsigned index) const {
  auto dev = impl_->device(index);
  if (!dev) return dev.status();
  if (impl_->get_nvlink_state == nullptr)
    return error(Errc::unavailable, "NVML lacks nvmlDeviceGetNvLinkState");
  unsigned active = 0;
  bool any = false;
  for (unsigned link = 0; link < abi::kNvlinkMaxLinks; ++link) {
    int state = abi::kFeatureDisabled;
    const abi::Return rc = impl_->get_nvlink_state(*dev, link, &state);
    // Links past the GPU's last answer "not supported" or "invalid argument".
    if (rc != abi::kSuccess) {
      if (is_fatal(rc)) return impl_->failure("nvmlDeviceGetNvLinkState", rc, __FILE__, __LINE__);
      continue;
    }
    any = true;
    if (state == abi::kFeatureEnabled) ++active;
  }
  if (!any) return error(Errc::unavailable, fmt::format("GPU {} has no NVLink", index));
  return active;
}

Capability Library::per_process_memory(unsigned index) const {
  auto rows = processes(index);
  if (!rows) return {false, rows.status().message()};
  for (const auto& row : *rows) {
    if (!row.used_bytes) {
      return {false,
              "NVML reports processes but not their memory (NVML_VALUE_NOT_AVAILABLE): usual in a "
              "container without the host's PID namespace or under vGPU"};
    }
  }
  return {true, {}};
}

Capability Library::per_process_utilization(unsigned index) const {
  auto samples = process_utilization(index, 0);
  if (!samples) return {false, samples.status().message()};
  return {true, {}};
}

Capability Library::energy_counter(unsigned index) const {
  if (impl_->get_energy == nullptr) {
    return {false, fmt::format("NVML library {} has no nvmlDeviceGetTotalEnergyConsumption "
                               "(a driver from before 2017)",
                               impl_->path)};
  }
  auto dev = impl_->device(index);
  if (!dev) return {false, dev.status().message()};
  unsigned long long millijoules = 0;
  const abi::Return rc = impl_->get_energy(*dev, &millijoules);
  if (rc != abi::kSuccess) {
    return {
        false,
        impl_->failure("nvmlDeviceGetTotalEnergyConsumption", rc, __FILE__, __LINE__).message()};
  }
  return {true, {}};
}

}  // namespace dlprobe::nvml
