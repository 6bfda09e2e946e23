#include "gpu_cuda.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "dlprobe/doctor/gpu_arch.h"

namespace dlprobe::doctor {

CudaGpus query_cuda_gpus() {
  CudaGpus out;
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    out.why_none =
        fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(rc), cudaGetErrorName(rc));
    return out;
  }
  if (count == 0) {
    out.why_none = "the CUDA runtime sees no device";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    GpuReport g;
    g.index = i;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      g.name = "unknown (cudaGetDeviceProperties failed)";
      out.gpus.push_back(std::move(g));
      continue;
    }
    g.name = p.name;
    g.pci_bus_id = fmt::format("{:08X}:{:02X}:{:02X}.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    std::string uuid = "GPU-";
    for (int b = 0; b < 16; ++b) {
      if (b == 4 || b == 6 || b == 8 || b == 10) uuid += '-';
      uuid += fmt::format("{:02x}", static_cast<unsigned char>(p.uuid.bytes[b]));
    }
    g.uuid = uuid;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.sm_count = p.multiProcessorCount;
    g.memory_total_bytes = p.totalGlobalMem;
    g.l2_bytes = p.l2CacheSize;
    g.memory_bus_width_bits = p.memoryBusWidth;
    // CUDA 13 dropped clockRate and memoryClockRate from cudaDeviceProp; the attributes remain.
    int clock_khz = 0, mem_khz = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, i) == cudaSuccess && clock_khz > 0)
      g.max_sm_clock_mhz = clock_khz / 1000.0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, i) == cudaSuccess &&
        mem_khz > 0)
      g.max_mem_clock_mhz = mem_khz / 1000.0;
    if (g.max_sm_clock_mhz) g.clock_source = "cuda";
    g.tensor_core_dtypes = tensor_core_dtypes(p.major, p.minor);
    out.gpus.push_back(std::move(g));
  }
  return out;
}

}  // namespace dlprobe::doctor
