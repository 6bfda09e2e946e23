#include "dlprobe/device/open_backend.h"

#include "backends.h"
#include "dlprobe/engine/reference_backend.h"

namespace dlprobe::device {

Status detail::check_compute(BackendKind kind, DType compute) {
  if (compute != DType::fp32 && compute != DType::fp64) {
    return invalid_argument("a backend computes in fp32 or fp64");
  }
  if (compute == DType::fp64 && kind != BackendKind::reference) {
    return invalid_argument("fp64 compute runs on the reference backend only");
  }
  return Status::ok();
}

Result<std::unique_ptr<memory::MemorySource>> open_memory_source(const Device& device) {
  if (device.kind == DeviceKind::cuda) return memory::make_cuda_memory_source(device.index);
  return std::unique_ptr<memory::MemorySource>(std::make_unique<memory::HostMemorySource>());
}

Result<std::unique_ptr<Backend>> open_backend(const Device& device, BackendKind kind,
                                              memory::CachingAllocator& allocator,
                                              const ConvOptions& conv, DType compute) {
  DLPROBE_RETURN_IF_ERROR(backend_runs_on(kind, device));
  DLPROBE_RETURN_IF_ERROR(detail::check_compute(kind, compute));
  switch (kind) {
    case BackendKind::reference:
      return make_reference_backend(compute);
    case BackendKind::onednn:
      return detail::open_onednn_backend(allocator);
    case BackendKind::cuda:
      return detail::open_cuda_backend(device.index, allocator, conv);
  }
  return invalid_argument("unknown backend");
}

}  // namespace dlprobe::device
