// The CUDA parts of the device module, in a build with DLPROBE_WITH_CUDA.
#include <cuda_runtime.h>

#include "backends.h"
#include "dlprobe/device/device.h"
#include "dlprobe/engine/cuda_backend.h"

namespace dlprobe::device {

std::optional<std::string> cuda_pci_bus_id(int index) {
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, index) == cudaSuccess) return std::string(bus);
  return std::nullopt;
}

namespace detail {

Result<std::unique_ptr<Backend>> open_cuda_backend(int index, memory::CachingAllocator& allocator,
                                                   const ConvOptions& conv) {
  CudaBackendOptions cuda;
  cuda.conv_engine = conv.algo;
  cuda.tuning = conv.tuning;
  cuda.deterministic = conv.engines != ConvEngines::any;
  cuda.transform_engines = conv.engines == ConvEngines::any;
  cuda.reduced_precision_reductions = conv.engines == ConvEngines::any;
  cuda.conv_sums = conv.sums;
  set_prologue_routes(conv.prologue, cuda);
  cuda.fused_stem_backward = conv.fused_stem_backward;
  return make_cuda_backend(index, allocator, cuda);
}

void add_cuda_facts(GpuFacts& facts) {
  facts.cuda_runtime = CUDART_VERSION;
  int version = 0;
  if (cudaDriverGetVersion(&version) == cudaSuccess) facts.cuda_driver = version;
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaSuccess) {
    facts.cuda_devices = count;
  } else {
    facts.cuda_error = cudaGetErrorString(rc);
    // The error stays with the runtime until read; a later call must not report it as its own.
    (void)cudaGetLastError();
  }
}

std::optional<std::pair<int, int>> cuda_compute_capability(int index) {
  int major = 0;
  int minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
    return std::nullopt;
  }
  return std::make_pair(major, minor);
}

}  // namespace detail
}  // namespace dlprobe::device
