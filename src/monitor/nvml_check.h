// DLPROBE_NVML_CHECK: a failed NVML call becomes a Status with NVML's own error text
// (nvmlErrorString, through the loaded library `lib`, an nvml::Library::Impl).
#pragma once

#include "dlprobe/core/check.h"
#include "nvml_abi.h"

#define DLPROBE_NVML_CHECK(lib, call) \
  DLPROBE_API_CHECK("NVML", call, rc_ == ::dlprobe::nvml::abi::kSuccess, (lib).error_text(rc_))
