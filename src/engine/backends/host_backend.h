// What the backends on host memory (oneDNN, reference) share: their tensors live in ordinary
// memory, so the device is the CPU and moving data to or from it is a copy.
#pragma once

#include <cstring>

#include "dlprobe/engine/backend.h"

namespace dlprobe {

class HostBackend : public Backend {
 public:
  DeviceKind device() const override { return DeviceKind::cpu; }
  // TF32 is a tensor-core format with no CPU counterpart: fp32 always runs strict on the host.
  void set_math_mode(MathMode /*mode*/) override {}

  Status upload(void* dst, const void* src, std::size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status download(void* dst, const void* src, std::size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status copy(void* dst, const void* src, std::size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
};

}  // namespace dlprobe
