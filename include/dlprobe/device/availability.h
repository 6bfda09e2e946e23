// Whether this machine can run a step on a GPU, and when it cannot, why in plain words: bench,
// memory and step run on the first usable GPU unless told otherwise, else on the CPU, and a GPU
// asked for that is not there is refused with the reason and what to run instead.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "dlprobe/core/status.h"
#include "dlprobe/device/device.h"

namespace dlprobe::device {

// What the machine says about its NVIDIA GPUs, gathered by gather_gpu_facts(); a plain struct so
// that each machine a user may have is a test case.
struct GpuFacts {
  // NVIDIA display and 3D controllers on the PCI bus; nullopt when the bus cannot be read (a
  // container may hide it).
  std::optional<int> nvidia_pci_devices;
  bool driver_loaded = false;  // the NVIDIA kernel driver (/proc/driver/nvidia/version)
  bool cuda_built = false;     // this build has the CUDA backend
  int cuda_driver = 0;         // the newest CUDA the driver serves (e.g. 12040); 0: unknown
  int cuda_runtime = 0;        // the CUDA runtime dlprobe carries; 0 without CUDA
  int cuda_devices = 0;        // the devices the runtime can use
  std::string cuda_error;      // the runtime's own words when it found none
};

struct GpuAvailability {
  int devices = 0;       // usable CUDA devices: cuda:0 .. cuda:devices-1
  std::string why_none;  // when there are none: what is missing, in plain words
};

// The usable devices, or the first missing piece: no NVIDIA device, no driver, a build without
// CUDA, a driver too old for the runtime, then the runtime's own words.
GpuAvailability explain_gpus(const GpuFacts& facts);

// This machine's facts: the PCI bus under `sys_pci_devices`, the driver, the CUDA runtime.
GpuFacts gather_gpu_facts(const std::filesystem::path& sys_pci_devices = "/sys/bus/pci/devices",
                          const std::filesystem::path& proc_driver = "/proc/driver/nvidia/version");

// The NVIDIA display and 3D controllers under a /sys/bus/pci/devices folder; nullopt when it
// cannot be read.
std::optional<int> count_nvidia_pci_devices(const std::filesystem::path& sys_pci_devices);

// The device a command runs on when none is named: cuda:0 when a GPU is usable, else the CPU.
Device default_device(const GpuAvailability& gpus);

// Whether `device` can run here: the CPU always; cuda:N when the machine has it, else an error
// naming the device, what is missing, and what to run instead (--device cpu).
Status check_device(const Device& device, const GpuAvailability& gpus);

}  // namespace dlprobe::device
