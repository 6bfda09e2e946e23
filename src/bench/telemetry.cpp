#include "dlprobe/bench/telemetry.h"

#include "dlprobe/core/log.h"
#include "dlprobe/doctor/doctor.h"

namespace dlprobe::bench {

std::shared_ptr<nvml::Library> open_nvml() {
  auto lib = nvml::Library::open();
  if (!lib) {
    log_warn("no GPU telemetry: {}", lib.status().message());
    return nullptr;
  }
  return *lib;
}

std::optional<TelemetrySource> telemetry_for(const device::Device& device,
                                             const std::shared_ptr<nvml::Library>& nvml) {
  if (device.kind != DeviceKind::cuda || !nvml) return std::nullopt;
  if (const auto bus = device::cuda_pci_bus_id(device.index)) {
    const std::string want = doctor::normalize_pci_bus_id(*bus);
    const unsigned count = nvml->device_count().value_or(0);
    for (unsigned i = 0; i < count; ++i) {
      auto info = nvml->device_info(i);
      if (info && doctor::normalize_pci_bus_id(info->pci_bus_id) == want) {
        TelemetrySource source;
        source.nvml = nvml;
        source.gpu = i;
        return source;
      }
    }
  }
  log_warn("no GPU telemetry: NVML does not list {}", device::device_name(device));
  return std::nullopt;
}

}  // namespace dlprobe::bench
