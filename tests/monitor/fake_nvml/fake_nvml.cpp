// A fake libnvidia-ml for tests: exports the NVML entry points dlprobe resolves, with values read
// from a script file named by DLPROBE_FAKE_NVML_SCRIPT when nvmlInit runs. Built twice: the full
// variant exports the newest entry points (nvmlInit_v2, *_v3 process lists, energy, clock events),
// the FAKE_NVML_LEGACY variant only the old names, so the loader's fallbacks are exercised through
// dlopen exactly as against a real driver.
//
// Script: one directive per line, '#' starts a comment.
//   init_error CODE                  nvmlInit returns CODE
//   driver_version S | nvml_version S | cuda_driver_version N
//   device                           starts the next GPU; the directives below apply to it
//   name S | uuid S | pci_bus_id S
//   KEY V1 V2 ...                    numeric field; each read takes the next value, the last one
//                                    repeats (keys: see the getters below); a field without a KEY
//                                    answers NVML_ERROR_NOT_SUPPORTED
//   fail API CODE                    the NVML function API returns CODE on this GPU
//   process PID BYTES|na             a compute process (na = NVML_VALUE_NOT_AVAILABLE)
//   process_file PATH                the process list is read from PATH at every call, one
//                                    "PID BYTES|na" per line (a test rewrites it while a
//                                    workload runs, with pids it only learns then)
//   process_insufficient N           the first N process-list fills answer INSUFFICIENT_SIZE
//   putil PID SM MEM TIMESTAMP_US    a per-process utilisation sample
//   nvlink_links N / nvlink_active N this GPU has N NVLink links, the first N of them active
//   topology LEVEL / p2p_nvlink S / p2p_read S   what this GPU answers for any pair it is the
//                                    first of (nvmlGpuTopologyLevel_t, nvmlGpuP2PStatus_t)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "nvml_abi.h"

namespace abi = dlprobe::nvml::abi;

namespace {

struct Putil {
  unsigned pid;
  unsigned sm;
  unsigned mem;
  unsigned long long timestamp;
};

struct FakeDevice {
  std::map<std::string, std::string> strings;
  std::map<std::string, std::vector<unsigned long long>> values;
  std::map<std::string, std::size_t> cursor;
  std::map<std::string, int> failures;
  std::vector<abi::ProcessInfoV2> processes;
  std::string process_file;
  int process_insufficient = 0;
  std::vector<Putil> putil;
};

struct State {
  std::mutex mutex;
  int init_refs = 0;
  int init_error = 0;
  std::map<std::string, std::string> system;
  std::vector<FakeDevice> devices;
  std::map<std::string, unsigned long long> calls;
};

State& state() {
  static State s;
  return s;
}

abi::ProcessInfoV2 process_info(const std::string& text) {
  std::istringstream f(text);
  abi::ProcessInfoV2 info{};
  std::string used;
  f >> info.pid >> used;
  info.usedGpuMemory = used == "na" ? abi::kValueNotAvailable : std::stoull(used);
  info.gpuInstanceId = 0xFFFFFFFFU;
  info.computeInstanceId = 0xFFFFFFFFU;
  return info;
}

void reload_process_file(FakeDevice& d) {
  if (d.process_file.empty()) return;
  d.processes.clear();
  std::ifstream in(d.process_file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t") != std::string::npos)
      d.processes.push_back(process_info(line));
  }
}

abi::Return load_script(State& s) {
  s.system.clear();
  s.devices.clear();
  s.init_error = 0;
  const char* path = std::getenv("DLPROBE_FAKE_NVML_SCRIPT");
  if (path == nullptr) return abi::kErrorDriverNotLoaded;
  std::ifstream in(path);
  if (!in) return abi::kErrorDriverNotLoaded;
  std::string line;
  while (std::getline(in, line)) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string key;
    if (!(words >> key)) continue;
    std::string rest;
    std::getline(words >> std::ws, rest);
    if (key == "init_error") {
      s.init_error = std::atoi(rest.c_str());
    } else if (key == "driver_version" || key == "nvml_version" || key == "cuda_driver_version") {
      s.system[key] = rest;
    } else if (key == "device") {
      s.devices.emplace_back();
    } else if (s.devices.empty()) {
      std::fprintf(stderr, "fake NVML: '%s' before any 'device'\n", key.c_str());
      return abi::kErrorUnknown;
    } else if (key == "name" || key == "uuid" || key == "pci_bus_id") {
      s.devices.back().strings[key] = rest;
    } else if (key == "fail") {
      std::istringstream f(rest);
      std::string api;
      int code = 0;
      f >> api >> code;
      s.devices.back().failures[api] = code;
    } else if (key == "process") {
      s.devices.back().processes.push_back(process_info(rest));
    } else if (key == "process_file") {
      s.devices.back().process_file = rest;
    } else if (key == "process_insufficient") {
      s.devices.back().process_insufficient = std::atoi(rest.c_str());
    } else if (key == "putil") {
      std::istringstream f(rest);
      Putil p{};
      f >> p.pid >> p.sm >> p.mem >> p.timestamp;
      s.devices.back().putil.push_back(p);
    } else {
      std::istringstream f(rest);
      std::string v;
      auto& seq = s.devices.back().values[key];
      while (f >> v) seq.push_back(std::stoull(v, nullptr, 0));
    }
  }
  return abi::kSuccess;
}

FakeDevice* dev_of(abi::Device d) {
  return reinterpret_cast<FakeDevice*>(d);
}

// Counts the call and returns the scripted failure for `api`, or success.
abi::Return enter(FakeDevice* d, const char* api) {
  State& s = state();
  ++s.calls[api];
  if (s.init_refs == 0) return abi::kErrorUninitialized;
  if (d != nullptr) {
    if (auto it = d->failures.find(api); it != d->failures.end()) return it->second;
  }
  return abi::kSuccess;
}

// The next value of `key`'s sequence; false when the script does not give the key.
bool next(FakeDevice* d, const std::string& key, unsigned long long& out) {
  auto it = d->values.find(key);
  if (it == d->values.end() || it->second.empty()) return false;
  std::size_t& i = d->cursor[key];
  out = it->second[std::min(i, it->second.size() - 1)];
  ++i;
  return true;
}

bool peek(FakeDevice* d, const std::string& key, unsigned long long& out) {
  auto it = d->values.find(key);
  if (it == d->values.end() || it->second.empty()) return false;
  out = it->second.front();
  return true;
}

template <class T>
abi::Return get_value(abi::Device device, const char* api, const std::string& key, T* out) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, api); rc != abi::kSuccess) return rc;
  if (out == nullptr) return abi::kErrorInvalidArgument;
  unsigned long long v = 0;
  if (!next(d, key, v)) return abi::kErrorNotSupported;
  *out = static_cast<T>(v);
  return abi::kSuccess;
}

abi::Return copy_string(const std::string& value, char* out, unsigned length) {
  if (out == nullptr) return abi::kErrorInvalidArgument;
  if (value.size() + 1 > length) return abi::kErrorInsufficientSize;
  std::memcpy(out, value.c_str(), value.size() + 1);
  return abi::kSuccess;
}

abi::Return device_string(abi::Device device, const char* api, const char* key, char* out,
                          unsigned length) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, api); rc != abi::kSuccess) return rc;
  auto it = d->strings.find(key);
  if (it == d->strings.end()) return abi::kErrorNotSupported;
  return copy_string(it->second, out, length);
}

abi::Return system_string(const char* api, const char* key, char* out, unsigned length) {
  std::lock_guard lock(state().mutex);
  if (abi::Return rc = enter(nullptr, api); rc != abi::kSuccess) return rc;
  auto it = state().system.find(key);
  if (it == state().system.end()) return abi::kErrorNotSupported;
  return copy_string(it->second, out, length);
}

abi::Return memory(abi::Device device, const char* api, unsigned long long& total,
                   unsigned long long& reserved, unsigned long long& used) {
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, api); rc != abi::kSuccess) return rc;
  if (!peek(d, "memory_total", total) || !next(d, "mem_used", used)) {
    return abi::kErrorNotSupported;
  }
  if (!peek(d, "memory_reserved", reserved)) reserved = 0;
  return abi::kSuccess;
}

template <class Info>
abi::Return process_list(abi::Device device, const char* api, unsigned* count, Info* infos) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, api); rc != abi::kSuccess) return rc;
  if (count == nullptr) return abi::kErrorInvalidArgument;
  reload_process_file(*d);
  const auto n = static_cast<unsigned>(d->processes.size());
  // Scripted races: processes that start between the size query and the fill.
  if (*count > 0 && d->process_insufficient > 0) {
    --d->process_insufficient;
    *count = n + 1;
    return abi::kErrorInsufficientSize;
  }
  if (*count < n) {
    *count = n;
    return abi::kErrorInsufficientSize;
  }
  for (unsigned i = 0; i < n; ++i) {
    Info info{};
    info.pid = d->processes[i].pid;
    info.usedGpuMemory = d->processes[i].usedGpuMemory;
    if constexpr (sizeof(Info) == sizeof(abi::ProcessInfoV2)) {
      info.gpuInstanceId = d->processes[i].gpuInstanceId;
      info.computeInstanceId = d->processes[i].computeInstanceId;
    }
    infos[i] = info;
  }
  *count = n;
  return abi::kSuccess;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT unsigned long long dlprobe_fake_nvml_calls(const char* api) {
  std::lock_guard lock(state().mutex);
  return state().calls[api];
}

namespace {
abi::Return do_init(const char* api) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  ++s.calls[api];
  if (s.init_refs == 0) {
    if (abi::Return rc = load_script(s); rc != abi::kSuccess) return rc;
    if (s.init_error != 0) return s.init_error;
  }
  ++s.init_refs;
  return abi::kSuccess;
}

abi::Return do_count(unsigned* count) {
  std::lock_guard lock(state().mutex);
  if (abi::Return rc = enter(nullptr, "nvmlDeviceGetCount"); rc != abi::kSuccess) return rc;
  *count = static_cast<unsigned>(state().devices.size());
  return abi::kSuccess;
}

abi::Return do_handle(unsigned index, abi::Device* device) {
  std::lock_guard lock(state().mutex);
  if (abi::Return rc = enter(nullptr, "nvmlDeviceGetHandleByIndex"); rc != abi::kSuccess) return rc;
  if (index >= state().devices.size()) return abi::kErrorInvalidArgument;
  *device = reinterpret_cast<abi::Device>(&state().devices[index]);
  return abi::kSuccess;
}
}  // namespace

FAKE_EXPORT abi::Return nvmlShutdown() {
  std::lock_guard lock(state().mutex);
  if (state().init_refs == 0) return abi::kErrorUninitialized;
  --state().init_refs;
  return abi::kSuccess;
}

FAKE_EXPORT const char* nvmlErrorString(abi::Return rc) {
  switch (rc) {
    case abi::kSuccess:
      return "Success";
    case abi::kErrorUninitialized:
      return "Uninitialized";
    case abi::kErrorInvalidArgument:
      return "Invalid Argument";
    case abi::kErrorNotSupported:
      return "Not Supported";
    case abi::kErrorNoPermission:
      return "Insufficient Permissions";
    case abi::kErrorInsufficientSize:
      return "Insufficient Size";
    case abi::kErrorDriverNotLoaded:
      return "Driver Not Loaded";
    case abi::kErrorGpuIsLost:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

FAKE_EXPORT abi::Return nvmlSystemGetDriverVersion(char* out, unsigned length) {
  return system_string("nvmlSystemGetDriverVersion", "driver_version", out, length);
}
FAKE_EXPORT abi::Return nvmlSystemGetNVMLVersion(char* out, unsigned length) {
  return system_string("nvmlSystemGetNVMLVersion", "nvml_version", out, length);
}
FAKE_EXPORT abi::Return nvmlSystemGetCudaDriverVersion(int* version) {
  std::lock_guard lock(state().mutex);
  if (abi::Return rc = enter(nullptr, "nvmlSystemGetCudaDriverVersion"); rc != abi::kSuccess) {
    return rc;
  }
  auto it = state().system.find("cuda_driver_version");
  if (it == state().system.end()) return abi::kErrorNotSupported;
  *version = std::atoi(it->second.c_str());
  return abi::kSuccess;
}

FAKE_EXPORT abi::Return nvmlDeviceGetName(abi::Device d, char* out, unsigned length) {
  return device_string(d, "nvmlDeviceGetName", "name", out, length);
}
FAKE_EXPORT abi::Return nvmlDeviceGetUUID(abi::Device d, char* out, unsigned length) {
  return device_string(d, "nvmlDeviceGetUUID", "uuid", out, length);
}
FAKE_EXPORT abi::Return nvmlDeviceGetPciInfo_v3(abi::Device device, abi::PciInfo* pci) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, "nvmlDeviceGetPciInfo_v3"); rc != abi::kSuccess) return rc;
  auto it = d->strings.find("pci_bus_id");
  if (it == d->strings.end()) return abi::kErrorNotSupported;
  *pci = abi::PciInfo{};
  return copy_string(it->second, pci->busId, sizeof(pci->busId));
}
FAKE_EXPORT abi::Return nvmlDeviceGetMemoryInfo(abi::Device device, abi::Memory* m) {
  std::lock_guard lock(state().mutex);
  unsigned long long total = 0, reserved = 0, used = 0;
  if (abi::Return rc = memory(device, "nvmlDeviceGetMemoryInfo", total, reserved, used);
      rc != abi::kSuccess) {
    return rc;
  }
  // nvmlMemory_t counts the driver's reservation as used.
  *m = {total, total - reserved - used, used + reserved};
  return abi::kSuccess;
}
FAKE_EXPORT abi::Return nvmlDeviceGetEnforcedPowerLimit(abi::Device d, unsigned* mw) {
  return get_value(d, "nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw", mw);
}
FAKE_EXPORT abi::Return nvmlDeviceGetPowerManagementLimit(abi::Device d, unsigned* mw) {
  return get_value(d, "nvmlDeviceGetPowerManagementLimit", "power_limit_mw", mw);
}
FAKE_EXPORT abi::Return nvmlDeviceGetPowerManagementDefaultLimit(abi::Device d, unsigned* mw) {
  return get_value(d, "nvmlDeviceGetPowerManagementDefaultLimit", "default_power_limit_mw", mw);
}
FAKE_EXPORT abi::Return nvmlDeviceGetMaxClockInfo(abi::Device d, int type, unsigned* mhz) {
  return get_value(d, "nvmlDeviceGetMaxClockInfo",
                   type == abi::kClockMem ? "max_mem_clock" : "max_sm_clock", mhz);
}
FAKE_EXPORT abi::Return nvmlDeviceGetClockInfo(abi::Device d, int type, unsigned* mhz) {
  return get_value(d, "nvmlDeviceGetClockInfo", type == abi::kClockMem ? "mem_clock" : "sm_clock",
                   mhz);
}
FAKE_EXPORT abi::Return nvmlDeviceGetCudaComputeCapability(abi::Device d, int* major, int* minor) {
  if (abi::Return rc = get_value(d, "nvmlDeviceGetCudaComputeCapability", "cc_major", major);
      rc != abi::kSuccess) {
    return rc;
  }
  return get_value(d, "nvmlDeviceGetCudaComputeCapability", "cc_minor", minor);
}
FAKE_EXPORT abi::Return nvmlDeviceGetEccMode(abi::Device d, int* current, int* pending) {
  if (abi::Return rc = get_value(d, "nvmlDeviceGetEccMode", "ecc", current); rc != abi::kSuccess) {
    return rc;
  }
  *pending = *current;
  return abi::kSuccess;
}
FAKE_EXPORT abi::Return nvmlDeviceGetMigMode(abi::Device d, unsigned* current, unsigned* pending) {
  if (abi::Return rc = get_value(d, "nvmlDeviceGetMigMode", "mig", current); rc != abi::kSuccess) {
    return rc;
  }
  *pending = *current;
  return abi::kSuccess;
}
FAKE_EXPORT abi::Return nvmlDeviceGetPersistenceMode(abi::Device d, int* mode) {
  return get_value(d, "nvmlDeviceGetPersistenceMode", "persistence", mode);
}
FAKE_EXPORT abi::Return nvmlDeviceGetCurrPcieLinkGeneration(abi::Device d, unsigned* gen) {
  return get_value(d, "nvmlDeviceGetCurrPcieLinkGeneration", "pcie_gen", gen);
}
FAKE_EXPORT abi::Return nvmlDeviceGetCurrPcieLinkWidth(abi::Device d, unsigned* width) {
  return get_value(d, "nvmlDeviceGetCurrPcieLinkWidth", "pcie_width", width);
}
FAKE_EXPORT abi::Return nvmlDeviceGetUtilizationRates(abi::Device device, abi::Utilization* u) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, "nvmlDeviceGetUtilizationRates"); rc != abi::kSuccess) return rc;
  unsigned long long gpu = 0, mem = 0;
  if (!next(d, "gpu_util", gpu) || !next(d, "mem_util", mem)) return abi::kErrorNotSupported;
  u->gpu = static_cast<unsigned>(gpu);
  u->memory = static_cast<unsigned>(mem);
  return abi::kSuccess;
}
FAKE_EXPORT abi::Return nvmlDeviceGetPowerUsage(abi::Device d, unsigned* mw) {
  return get_value(d, "nvmlDeviceGetPowerUsage", "power_mw", mw);
}
FAKE_EXPORT abi::Return nvmlDeviceGetTemperature(abi::Device d, int sensor, unsigned* c) {
  if (sensor != abi::kTemperatureGpu) return abi::kErrorInvalidArgument;
  return get_value(d, "nvmlDeviceGetTemperature", "temperature", c);
}
FAKE_EXPORT abi::Return nvmlDeviceGetCurrentClocksThrottleReasons(abi::Device d,
                                                                  unsigned long long* reasons) {
  return get_value(d, "nvmlDeviceGetCurrentClocksThrottleReasons", "clock_events", reasons);
}

FAKE_EXPORT abi::Return nvmlDeviceGetNvLinkState(abi::Device device, unsigned link, int* active) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, "nvmlDeviceGetNvLinkState"); rc != abi::kSuccess) return rc;
  unsigned long long links = 0, up = 0;
  if (!peek(d, "nvlink_links", links)) return abi::kErrorNotSupported;
  if (link >= links || active == nullptr) return abi::kErrorInvalidArgument;
  if (!peek(d, "nvlink_active", up)) up = 0;
  *active = link < up ? abi::kFeatureEnabled : abi::kFeatureDisabled;
  return abi::kSuccess;
}
FAKE_EXPORT abi::Return nvmlDeviceGetTopologyCommonAncestor(abi::Device a, abi::Device,
                                                            int* level) {
  return get_value(a, "nvmlDeviceGetTopologyCommonAncestor", "topology", level);
}
FAKE_EXPORT abi::Return nvmlDeviceGetP2PStatus(abi::Device a, abi::Device, int caps, int* status) {
  return get_value(a, "nvmlDeviceGetP2PStatus",
                   caps == abi::kP2pCapsNvlink ? "p2p_nvlink" : "p2p_read", status);
}

#ifdef FAKE_NVML_LEGACY

FAKE_EXPORT abi::Return nvmlInit() {
  return do_init("nvmlInit");
}
FAKE_EXPORT abi::Return nvmlDeviceGetCount(unsigned* count) {
  return do_count(count);
}
FAKE_EXPORT abi::Return nvmlDeviceGetHandleByIndex(unsigned index, abi::Device* device) {
  return do_handle(index, device);
}
FAKE_EXPORT abi::Return nvmlDeviceGetComputeRunningProcesses(abi::Device d, unsigned* count,
                                                             abi::ProcessInfoV1* infos) {
  return process_list(d, "nvmlDeviceGetComputeRunningProcesses", count, infos);
}

#else

FAKE_EXPORT abi::Return nvmlInit_v2() {
  return do_init("nvmlInit_v2");
}
FAKE_EXPORT abi::Return nvmlDeviceGetCount_v2(unsigned* count) {
  return do_count(count);
}
FAKE_EXPORT abi::Return nvmlDeviceGetHandleByIndex_v2(unsigned index, abi::Device* device) {
  return do_handle(index, device);
}
FAKE_EXPORT abi::Return nvmlSystemGetCudaDriverVersion_v2(int* version) {
  return nvmlSystemGetCudaDriverVersion(version);
}
FAKE_EXPORT abi::Return nvmlDeviceGetMemoryInfo_v2(abi::Device device, abi::MemoryV2* m) {
  std::lock_guard lock(state().mutex);
  if (m->version != abi::kMemoryV2Version) return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  unsigned long long total = 0, reserved = 0, used = 0;
  if (abi::Return rc = memory(device, "nvmlDeviceGetMemoryInfo_v2", total, reserved, used);
      rc != abi::kSuccess) {
    return rc;
  }
  m->total = total;
  m->reserved = reserved;
  m->used = used;
  m->free = total - reserved - used;
  return abi::kSuccess;
}
FAKE_EXPORT abi::Return nvmlDeviceGetTotalEnergyConsumption(abi::Device d, unsigned long long* mj) {
  return get_value(d, "nvmlDeviceGetTotalEnergyConsumption", "energy_mj", mj);
}
FAKE_EXPORT abi::Return nvmlDeviceGetCurrentClocksEventReasons(abi::Device d,
                                                               unsigned long long* reasons) {
  return get_value(d, "nvmlDeviceGetCurrentClocksEventReasons", "clock_events", reasons);
}
FAKE_EXPORT abi::Return nvmlDeviceGetPcieThroughput(abi::Device d, int counter, unsigned* kbps) {
  return get_value(d, "nvmlDeviceGetPcieThroughput",
                   counter == abi::kPcieUtilRxBytes ? "pcie_rx" : "pcie_tx", kbps);
}
FAKE_EXPORT abi::Return nvmlDeviceGetComputeRunningProcesses_v3(abi::Device d, unsigned* count,
                                                                abi::ProcessInfoV2* infos) {
  return process_list(d, "nvmlDeviceGetComputeRunningProcesses_v3", count, infos);
}
FAKE_EXPORT abi::Return nvmlDeviceGetProcessUtilization(abi::Device device,
                                                        abi::ProcessUtilizationSample* samples,
                                                        unsigned* count, unsigned long long since) {
  std::lock_guard lock(state().mutex);
  FakeDevice* d = dev_of(device);
  if (abi::Return rc = enter(d, "nvmlDeviceGetProcessUtilization"); rc != abi::kSuccess) {
    return rc;
  }
  std::vector<abi::ProcessUtilizationSample> fresh;
  for (const Putil& p : d->putil) {
    if (p.timestamp > since) fresh.push_back({p.pid, p.timestamp, p.sm, p.mem, 0, 0});
  }
  if (fresh.empty()) return abi::kErrorNotFound;
  if (samples == nullptr || *count < fresh.size()) {
    *count = static_cast<unsigned>(fresh.size());
    return abi::kErrorInsufficientSize;
  }
  std::copy(fresh.begin(), fresh.end(), samples);
  *count = static_cast<unsigned>(fresh.size());
  return abi::kSuccess;
}

#endif
