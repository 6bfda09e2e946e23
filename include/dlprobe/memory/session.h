// Measuring a step's memory on a device. A Session holds one device (backend, allocator and, on a
// GPU, NVML) for many runs, so that one out-of-memory run leaves the process usable for the next:
// each measure() plans the step, warms it up, follows one step, reconciles the allocator with
// NVML's figure for this process, then frees the step and empties the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/step_memory.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::nvml {
class Library;
}

namespace dlprobe::memory {

struct SessionOptions {
  // Where the step runs and on which backend: the vocabulary of `--device` and `--backend`
  // (device::parse_device, device::parse_backend). The reference backend computes fp64 steps too.
  device::Device device;
  device::BackendKind backend = device::BackendKind::reference;
  // growth, preallocate or limit. In limit mode overhead_bytes is measured by the session (on a
  // GPU: NVML's figure for the process less the allocator's reserved bytes) and kept current.
  AllocatorOptions allocator;
  // CUDA: how convolution engines are chosen (as `dlprobe bench`); deterministic ones unless
  // asked, so that two measurements of one step take the same workspaces.
  device::ConvOptions conv = {ConvEngineChoice::autotune, device::ConvEngines::deterministic,
                              nullptr};
  // NVML for the reconciliation; the session opens it itself on a GPU when null. Tests pass the
  // fake NVML here.
  std::shared_ptr<nvml::Library> nvml;
};

// NVML's view of the process beside the allocator's, read together after a measured step.
struct Reconciliation {
  std::int64_t allocated_peak_bytes = 0;  // in the step, workspace included
  std::int64_t workspace_peak_bytes = 0;
  std::int64_t reserved_bytes = 0;  // when NVML was read
  // What the process held outside the allocator right after the backend was made: the CUDA
  // context and the cuDNN/cuBLAS handles.
  std::int64_t context_bytes = 0;
  std::int64_t nvml_process_bytes = 0;
  // "process": NVML's used memory of this pid; "device": the device's used memory less what it
  // used before this process made its context (NVML does not list this pid, e.g. in a container
  // with its own pid namespace).
  std::string nvml_source;
  // What CUDA and the libraries took since start-up (kernels loaded on first launch, library
  // buffers): NVML's figure less the reserved bytes and the context.
  std::int64_t lazy_bytes() const { return nvml_process_bytes - reserved_bytes - context_bytes; }
};

struct Measurement {
  engine::StepConfig step;
  StepMemory memory;
  MemoryStats stats;  // the allocator's over the followed step
  Calibration calibration;
  std::optional<Reconciliation> reconciliation;
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> open(const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Plans `step`, runs `warmup` steps, follows one more, reconciles. Out of memory (the
  // allocator's report; under a limit on a GPU also NVML seeing the process above the limit) is
  // Errc::out_of_memory, and the session stays usable: the step and the cache are freed whatever
  // happens.
  Result<Measurement> measure(const engine::StepConfig& step, int warmup = 1);

  std::string device_name() const;  // "cuda:0 (NVIDIA H200)", "cpu (reference)"
  CachingAllocator& allocator();

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlprobe::memory
