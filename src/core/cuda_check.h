// DLPROBE_CUDA_CHECK(call): a failed CUDA runtime call becomes a Status naming the call, CUDA's
// error name and text, and file:line. Only sources built with DLPROBE_WITH_CUDA include this.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "dlprobe/core/check.h"

#define DLPROBE_CUDA_CHECK(call)                      \
  DLPROBE_API_CHECK("CUDA", call, rc_ == cudaSuccess, \
                    std::string(::cudaGetErrorName(rc_)) + ": " + ::cudaGetErrorString(rc_))
