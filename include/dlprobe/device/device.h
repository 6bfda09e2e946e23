// Where a step runs: the CPU or one CUDA device, as `--device` names it ("cpu", "cuda", "cuda:N").
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"

namespace dlprobe::device {

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // the CUDA device; 0 on the CPU
};

// "cpu", "cuda" (cuda:0) or "cuda:N". The error names the value and what is accepted, never a
// flag: the caller knows which flag it came from.
Result<Device> parse_device(std::string_view text);
// "cpu" or "cuda:N": what parse_device reads back.
std::string device_name(const Device& device);

// The PCI bus id of CUDA device `index` ("0000:19:00.0"), to find it in NVML; nullopt without
// CUDA or without that device.
std::optional<std::string> cuda_pci_bus_id(int index);

}  // namespace dlprobe::device
