// GPU telemetry during a sweep: NVML, and the device's NVML index, which can differ from its CUDA
// index (the two number GPUs differently; the PCI bus id names the same one in both).
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "dlprobe/device/device.h"
#include "dlprobe/monitor/nvml.h"

namespace dlprobe::bench {

// Sampled every `interval`, with per-process rows.
struct TelemetrySource {
  std::shared_ptr<nvml::Library> nvml;
  unsigned gpu = 0;
  std::chrono::nanoseconds interval = std::chrono::milliseconds(50);
};

// NVML, or null with a warning saying why there is no GPU telemetry.
std::shared_ptr<nvml::Library> open_nvml();

// Telemetry for a CUDA device, found in NVML by its PCI bus id. Nullopt, with a warning, where
// NVML is missing or does not list the device; always on the CPU.
std::optional<TelemetrySource> telemetry_for(const device::Device& device,
                                             const std::shared_ptr<nvml::Library>& nvml);

}  // namespace dlprobe::bench
