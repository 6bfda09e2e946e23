// The CUDA runtime's view of the GPUs, for run_doctor (built only with DLPROBE_WITH_CUDA).
#pragma once

#include <string>
#include <vector>

#include "dlprobe/doctor/doctor.h"

namespace dlprobe::doctor {

struct CudaGpus {
  std::vector<GpuReport> gpus;  // CUDA fields filled, NVML fields left for the caller
  std::string why_none;         // the runtime's reason when there are none
};

CudaGpus query_cuda_gpus();

}  // namespace dlprobe::doctor
