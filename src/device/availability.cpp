#include "dlprobe/device/availability.h"

#include <fmt/format.h>

#include <fstream>
#include <string_view>
#include <system_error>

#include "backends.h"
#include "dlprobe/core/build_info.h"

namespace dlprobe::device {

namespace {

// CUDA's version numbers (12040) as users read them (12.4).
std::string cuda_version_text(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

std::string first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

GpuAvailability explain_gpus(const GpuFacts& f) {
  if (f.cuda_devices > 0) return {f.cuda_devices, ""};
  GpuAvailability a;
  if (f.nvidia_pci_devices == 0 && !f.driver_loaded) {
    a.why_none = "this machine has no NVIDIA GPU (none on its PCI bus)";
  } else if (!f.driver_loaded && f.cuda_driver == 0) {
    a.why_none = "no NVIDIA driver is loaded";
  } else if (!f.cuda_built) {
    a.why_none = "this build of dlprobe has no CUDA backend (configured without DLPROBE_WITH_CUDA)";
  } else if (f.cuda_driver > 0 && f.cuda_driver < f.cuda_runtime) {
    a.why_none = fmt::format(
        "the NVIDIA driver is too old for CUDA {} (it serves CUDA {} at most; update the driver)",
        cuda_version_text(f.cuda_runtime), cuda_version_text(f.cuda_driver));
  } else {
    a.why_none = fmt::format("CUDA finds no usable GPU ({})",
                             f.cuda_error.empty() ? "no device visible" : f.cuda_error);
  }
  return a;
}

std::optional<int> count_nvidia_pci_devices(const std::filesystem::path& sys_pci_devices) {
  std::error_code ec;
  std::filesystem::directory_iterator it(sys_pci_devices, ec);
  if (ec) return std::nullopt;
  int count = 0;
  for (const auto& entry : it) {
    // Vendor 0x10de is NVIDIA; class 0x03xxxx a display or 3D controller (its NVSwitches and
    // audio functions are other classes).
    if (first_line(entry.path() / "vendor") != "0x10de") continue;
    if (first_line(entry.path() / "class").starts_with("0x03")) ++count;
  }
  return count;
}

GpuFacts gather_gpu_facts(const std::filesystem::path& sys_pci_devices,
                          const std::filesystem::path& proc_driver) {
  GpuFacts f;
  f.nvidia_pci_devices = count_nvidia_pci_devices(sys_pci_devices);
  std::error_code ec;
  f.driver_loaded = std::filesystem::exists(proc_driver, ec);
  f.cuda_built = build_info().with_cuda;
  detail::add_cuda_facts(f);
  return f;
}

Device default_device(const GpuAvailability& gpus) {
  return gpus.devices > 0 ? Device{DeviceKind::cuda, 0} : Device{DeviceKind::cpu, 0};
}

Status check_device(const Device& device, const GpuAvailability& gpus) {
  if (device.kind == DeviceKind::cpu) return Status::ok();
  if (gpus.devices == 0) {
    return error(Errc::unavailable,
                 fmt::format("{}: no usable GPU: {}; run on the CPU instead with --device cpu",
                             device_name(device), gpus.why_none));
  }
  if (device.index >= gpus.devices) {
    return error(
        Errc::not_found,
        fmt::format("{}: this machine has {} usable GPU{} (cuda:0{})", device_name(device),
                    gpus.devices, gpus.devices == 1 ? "" : "s",
                    gpus.devices == 1 ? "" : fmt::format(" to cuda:{}", gpus.devices - 1)));
  }
  return Status::ok();
}

}  // namespace dlprobe::device
