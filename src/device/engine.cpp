#include "dlprobe/device/engine.h"

#include <fmt/format.h>

#include "backends.h"
#include "dlprobe/device/open_backend.h"

namespace dlprobe::device {

Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::open(const Device& device, BackendKind backend,
                                             const ConvOptions& conv, DType compute,
                                             const memory::AllocatorOptions& allocation) {
  DLPROBE_RETURN_IF_ERROR(backend_runs_on(backend, device));
  DLPROBE_RETURN_IF_ERROR(detail::check_compute(backend, compute));
  std::unique_ptr<Engine> e(new Engine());
  e->device_ = device;
  e->kind_ = backend;
  e->compute_ = compute;
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<memory::MemorySource> source,
                           open_memory_source(device));
  if (device.kind == DeviceKind::cuda) e->cc_ = detail::cuda_compute_capability(device.index);
  DLPROBE_ASSIGN_OR_RETURN(e->allocator_,
                           memory::CachingAllocator::create(std::move(source), allocation));
  DLPROBE_ASSIGN_OR_RETURN(e->backend_,
                           open_backend(device, backend, *e->allocator_, conv, compute));
  return e;
}

Status Engine::supports(engine::Precision precision) const {
  using engine::Precision;
  DLPROBE_RETURN_IF_ERROR(backend_supports(kind_, precision));
  if ((precision == Precision::fp64) != (compute_ == DType::fp64)) {
    return invalid_argument(fmt::format("precision {} needs an {} engine",
                                        engine::precision_name(precision),
                                        precision == Precision::fp64 ? "fp64" : "fp32"));
  }
  // bf16 tensor cores (and cuDNN's bf16 convolutions) start with Ampere.
  if (precision == Precision::bf16 && cc_ && cc_->first < 8) {
    return error(Errc::unsupported,
                 fmt::format("precision bf16 needs compute capability 8.0 or newer; {} has {}.{}",
                             device_name(device_), cc_->first, cc_->second));
  }
  return Status::ok();
}

}  // namespace dlprobe::device
