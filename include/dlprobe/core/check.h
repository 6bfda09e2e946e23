// The generic API check behind the per-family macros (DLPROBE_CUDA_CHECK, DLPROBE_CUDNN_CHECK,
// DLPROBE_CUBLAS_CHECK, DLPROBE_NVML_CHECK): a failed call becomes a Status naming the API family,
// the call as written, the library's own error text and file:line, and is logged to stderr at debug
// level (the caller decides whether the user sees it).
#pragma once

#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

Status api_failure(std::string_view family, std::string_view call, std::string_view detail,
                   const char* file, int line, Errc code = Errc::api_error);

}  // namespace dlprobe

// `ok` is the boolean success test over the call's return value `rc_`; `detail` turns `rc_` into
// text.
#define DLPROBE_API_CHECK(family, call, ok, detail)                                        \
  do {                                                                                     \
    auto rc_ = (call);                                                                     \
    if (!(ok)) return ::dlprobe::api_failure(family, #call, (detail), __FILE__, __LINE__); \
  } while (0)
