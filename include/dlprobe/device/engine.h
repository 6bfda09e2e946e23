// A device's backend and caching allocator, opened together. A sweep keeps one across its
// configurations, so that the CUDA backend's convolution plans (chosen once per shape) are reused.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/dtype.h"
#include "dlprobe/step/step_config.h"

namespace dlprobe::device {

class Engine {
 public:
  // open_memory_source and open_backend, with the allocator in `allocation`'s mode (a limit makes
  // a small device of a large one). `compute` as open_backend takes it.
  static Result<std::unique_ptr<Engine>> open(const Device& device, BackendKind backend,
                                              const ConvOptions& conv = {},
                                              DType compute = DType::fp32,
                                              const memory::AllocatorOptions& allocation = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Backend& backend() { return *backend_; }
  memory::CachingAllocator& allocator() { return *allocator_; }
  const Device& device() const { return device_; }
  BackendKind kind() const { return kind_; }

  // Whether `precision` can run here, checked before anything is allocated: backend_supports(),
  // an engine of the right compute type, and compute capability 8.0 for bf16 on the GPU.
  Status supports(engine::Precision precision) const;

 private:
  Engine() = default;
  Device device_;
  BackendKind kind_ = BackendKind::reference;
  DType compute_ = DType::fp32;
  std::optional<std::pair<int, int>> cc_;  // CUDA: the compute capability
  // The allocator first: the backend gives its scratch memory back to it when destroyed.
  std::unique_ptr<memory::CachingAllocator> allocator_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace dlprobe::device
