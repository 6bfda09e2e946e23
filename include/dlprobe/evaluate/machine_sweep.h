// The sweep `dlprobe evaluate` runs on a machine. GPU: ResNet-50 forward and backward (grads mode)
// in fp32, tf32, fp16 and bf16 (tf32 and bf16 from compute capability 8.0), batch 16 to 256, each
// in the fastest settings the engine knows; no GPU: ResNet-18 training at 64x64 on the CPU backend.
#pragma once

#include <optional>
#include <string>

#include "dlprobe/bench/sweep.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"
#include "dlprobe/doctor/doctor.h"

namespace dlprobe::evaluate {

struct MachineSweep {
  bench::Sweep sweep;
  std::string why;  // one line: what runs where, and the settings picked for it
};

// `device` nullopt: the first GPU CUDA sees where the build has CUDA, else the CPU. `quick`: fewer
// batches, shorter windows.
Result<MachineSweep> machine_sweep(const doctor::Report& report,
                                   const std::optional<device::Device>& device, bool quick,
                                   const device::ConvOptions& conv);

}  // namespace dlprobe::evaluate
