// The CUDA runtime and cuBLAS(Lt) families of DLPROBE_API_CHECK, for doctor's CUDA sources.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "dlprobe/core/check.h"

#define DLPROBE_CUDA_CHECK(call) \
  DLPROBE_API_CHECK("CUDA", call, rc_ == cudaSuccess, cudaGetErrorString(rc_))
#define DLPROBE_CUBLAS_CHECK(call) \
  DLPROBE_API_CHECK("cuBLASLt", call, rc_ == CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString(rc_))
