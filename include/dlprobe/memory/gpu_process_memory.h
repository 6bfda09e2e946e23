// This process's device memory as the driver sees it (NVML), beside the caching allocator's: what
// a limit that counts the whole process (`--gpu-memory limit:SIZE`) subtracts for the CUDA
// context, library handles and lazily loaded kernels, and what memory analysis reconciles with.
//
// NVML reports used memory per process by pid. Inside a container with its own pid namespace it
// may not list our pid; the fallback is the device's used memory less what it used before this
// process made its CUDA context, which is right when nothing else starts on the GPU meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"

namespace dlprobe::nvml {
class Library;
}

namespace dlprobe::memory {

// NVML's used memory of process `pid` on device `index`; Errc::not_found when NVML does not list
// the pid there, Errc::unavailable when it lists it without a figure.
Result<std::int64_t> nvml_process_used_bytes(const nvml::Library& nvml, unsigned index,
                                             unsigned pid);

struct ProcessReading {
  std::int64_t bytes = 0;
  std::string source;  // "process" (NVML's figure for this pid) or "device" (the fallback)
};

class GpuProcessMemory {
 public:
  // Opens NVML (or takes `nvml`) and notes every device's used memory. Open it before the process
  // makes its CUDA context, so the fallback starts from the right point. Errc::not_found or
  // unavailable when there is no NVML.
  static Result<GpuProcessMemory> open(std::shared_ptr<nvml::Library> nvml = nullptr);

  // Finds CUDA device `cuda_device` among NVML's by PCI bus id (the two may number GPUs
  // differently) and names it. Errc::unavailable in a build without CUDA, not_found when NVML does
  // not have the device.
  Status attach(int cuda_device);
  // Binds NVML device `index` directly (tests, and callers that know it).
  void attach_nvml_index(unsigned index);

  // The process's bytes on the attached device now; none when neither figure can be read.
  std::optional<ProcessReading> read() const;
  const std::string& gpu_name() const { return gpu_name_; }

 private:
  explicit GpuProcessMemory(std::shared_ptr<nvml::Library> nvml) : nvml_(std::move(nvml)) {}
  std::shared_ptr<nvml::Library> nvml_;
  std::vector<std::optional<std::uint64_t>> used_before_;  // per NVML device, at open()
  std::optional<unsigned> index_;
  std::string gpu_name_;
};

// Limit mode: reads what the process holds outside `allocator` (the reading less the reserved
// bytes) and makes it the limit's overhead, returning it. Fails as set_overhead_bytes() does when
// the limit no longer leaves what is reserved, and with Errc::unavailable when nothing can be read.
Result<std::int64_t> update_limit_overhead(CachingAllocator& allocator,
                                           const GpuProcessMemory& process);

}  // namespace dlprobe::memory
