#include "dlprobe/memory/gpu_process_memory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "dlprobe/device/device.h"
#include "dlprobe/doctor/doctor.h"
#include "dlprobe/monitor/nvml.h"

namespace dlprobe::memory {

Result<std::int64_t> nvml_process_used_bytes(const nvml::Library& nvml, unsigned index,
                                             unsigned pid) {
  DLPROBE_ASSIGN_OR_RETURN(std::vector<nvml::ProcessMemory> processes, nvml.processes(index));
  for (const nvml::ProcessMemory& p : processes) {
    if (p.pid != pid) continue;
    if (!p.used_bytes) {
      return error(Errc::unavailable,
                   fmt::format("NVML lists process {} on GPU {} without its memory", pid, index));
    }
    return static_cast<std::int64_t>(*p.used_bytes);
  }
  return error(Errc::not_found, fmt::format("NVML does not list process {} on GPU {}", pid, index));
}

Result<GpuProcessMemory> GpuProcessMemory::open(std::shared_ptr<nvml::Library> nvml) {
  if (!nvml) {
    DLPROBE_ASSIGN_OR_RETURN(nvml, nvml::Library::open());
  }
  GpuProcessMemory p(std::move(nvml));
  DLPROBE_ASSIGN_OR_RETURN(const unsigned count, p.nvml_->device_count());
  for (unsigned i = 0; i < count; ++i) {
    Result<nvml::DeviceSample> s = p.nvml_->sample(i);
    p.used_before_.push_back(s ? s->mem_used_bytes : std::nullopt);
  }
  return p;
}

Status GpuProcessMemory::attach(int cuda_device) {
  const std::optional<std::string> bus = device::cuda_pci_bus_id(cuda_device);
  if (!bus) {
    return error(Errc::unavailable, fmt::format("CUDA device {} cannot be queried", cuda_device));
  }
  const std::string want = doctor::normalize_pci_bus_id(*bus);
  DLPROBE_ASSIGN_OR_RETURN(const unsigned count, nvml_->device_count());
  for (unsigned i = 0; i < count; ++i) {
    Result<nvml::DeviceInfo> info = nvml_->device_info(i);
    if (info && doctor::normalize_pci_bus_id(info->pci_bus_id) == want) {
      index_ = i;
      gpu_name_ = info->name;
      return Status::ok();
    }
  }
  return error(Errc::not_found,
               fmt::format("NVML has no GPU at PCI {} (CUDA device {})", *bus, cuda_device));
}

void GpuProcessMemory::attach_nvml_index(unsigned index) {
  index_ = index;
  if (Result<nvml::DeviceInfo> info = nvml_->device_info(index)) gpu_name_ = info->name;
}

std::optional<ProcessReading> GpuProcessMemory::read() const {
  if (!index_) return std::nullopt;
  Result<std::int64_t> used =
      nvml_process_used_bytes(*nvml_, *index_, static_cast<unsigned>(getpid()));
  if (used) return ProcessReading{*used, "process"};
  if (*index_ >= used_before_.size() || !used_before_[*index_]) return std::nullopt;
  Result<nvml::DeviceSample> sample = nvml_->sample(*index_);
  if (!sample || !sample->mem_used_bytes) return std::nullopt;
  return ProcessReading{static_cast<std::int64_t>(*sample->mem_used_bytes) -
                            static_cast<std::int64_t>(*used_before_[*index_]),
                        "device"};
}

Result<std::int64_t> update_limit_overhead(CachingAllocator& allocator,
                                           const GpuProcessMemory& process) {
  const std::optional<ProcessReading> reading = process.read();
  if (!reading) {
    return error(Errc::unavailable, "NVML cannot tell this process's memory on the GPU");
  }
  const std::int64_t outside =
      std::max<std::int64_t>(reading->bytes - allocator.stats().reserved_bytes, 0);
  DLPROBE_RETURN_IF_ERROR(allocator.set_overhead_bytes(static_cast<std::uint64_t>(outside)));
  return outside;
}

}  // namespace dlprobe::memory
