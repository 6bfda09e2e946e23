// Check macros for cuDNN and cuBLAS(Lt), beside the CUDA runtime's DLPROBE_CUDA_CHECK: a failed
// call returns a Status naming the call, the library's error text and file:line from the
// enclosing function (see dlprobe/check.h).
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include "core/cuda_check.h"

#define DLPROBE_CUDNN_CHECK(call) \
  DLPROBE_API_CHECK("cuDNN", call, rc_ == CUDNN_STATUS_SUCCESS, cudnnGetErrorString(rc_))
#define DLPROBE_CUBLAS_CHECK(call) \
  DLPROBE_API_CHECK("cuBLAS", call, rc_ == CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString(rc_))
// After every kernel launch: a bad launch configuration surfaces here, not at the next sync.
#define DLPROBE_CUDA_CHECK_LAUNCH() DLPROBE_CUDA_CHECK(cudaGetLastError())
