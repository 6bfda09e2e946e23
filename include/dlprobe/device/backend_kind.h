// Which engine backend runs the step, and what each one runs:
// - cuda: cuDNN, cuBLASLt and dlprobe's kernels on a CUDA device (built with DLPROBE_WITH_CUDA);
// - onednn: the CPU backend on oneDNN (built with DLPROBE_WITH_ONEDNN), what the CPU runs;
// - reference: plain loops on the CPU, correct and slow, run only when named.
#pragma once

#include <cstdint>
#include <string_view>

#include "dlprobe/core/status.h"
#include "dlprobe/device/device.h"
#include "dlprobe/step/step_config.h"

namespace dlprobe::device {

enum class BackendKind : std::uint8_t { cuda, onednn, reference };
std::string_view backend_kind_name(BackendKind kind);

// Whether this build has the backend (the reference backend always).
bool backend_built(BackendKind kind);

// What a device runs unless a backend is named: cuda on a GPU, oneDNN on the CPU where built,
// else the reference loops.
BackendKind default_backend(const Device& device);

// "auto" (default_backend), "cuda", "onednn" or "reference". A backend that does not run on
// `device` is Errc::invalid_argument, one this build lacks Errc::unavailable; the errors name the
// value, never a flag.
Result<BackendKind> parse_backend(std::string_view text, const Device& device);

// Whether a backend runs on a device at all: cuda on cuda:N, onednn and reference on the CPU.
Status backend_runs_on(BackendKind kind, const Device& device);

// Whether a backend runs `precision` at all: fp64 needs the reference backend, tf32 the GPU, and
// the oneDNN backend has no fp16. (Engine::supports adds what depends on the device.)
Status backend_supports(BackendKind kind, engine::Precision precision);

}  // namespace dlprobe::device
