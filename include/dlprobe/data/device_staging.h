// A host-made batch's way to the GPU beside a running step: a page-locked host buffer the caller
// fills, copied on a stream of its own into one of two device buffers that take turns. From
// pageable memory a copy runs at a fraction of the link's speed and through the CPU (the 154 MB
// fp32 batch of ResNet-50 at 256: about 19 ms at the 8 GB/s `dlprobe doctor` measured on an
// H200 machine), and a step's set_input makes it after the step before has ended, so the GPU
// waits for it; from page-locked memory on its own stream it overlaps the step before.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "dlprobe/core/status.h"

namespace dlprobe::data {

class DeviceStaging {
 public:
  // `bytes` of page-locked host memory and two device buffers as large on CUDA device `device`.
  // A build without CUDA, or a machine without the device, gets a one-line error.
  static Result<std::unique_ptr<DeviceStaging>> open(int device, std::size_t bytes);
  virtual ~DeviceStaging() = default;

  // The host buffer: free to fill whenever upload() is not running.
  virtual std::span<std::byte> host() = 0;
  // Copies host() into the next device buffer and returns when the copy is done (a step running
  // on the device meanwhile goes on). The buffer returned stays as it is through the next
  // upload(), so that a step may still copy from it while the next batch goes up.
  virtual Result<const void*> upload() = 0;
};

}  // namespace dlprobe::data
