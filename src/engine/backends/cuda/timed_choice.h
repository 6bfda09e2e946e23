// Which of a convolution's timed configurations the tuning keeps (`autotune`, `exhaustive`): plain
// C++, so the CPU tests check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace dlprobe::cuda {

// One configuration as the candidate timer saw it: alone on the GPU, on the call's own buffers.
struct TimedConfig {
  float ms = 0;
  std::int64_t workspace_bytes = 0;
};

// How much slower alone a configuration without workspace may be and still be kept over the
// fastest, which takes workspace.
inline constexpr double kWorkspaceFreeTolerance = 0.03;

// The version of these rules, named in the tuning cache's keys so that choices an older rule made
// are tuned again rather than replayed: raise it with any change to choose_timed_config, the
// tolerance or timed_workspace_cap. 2: a configuration without workspace within
// kWorkspaceFreeTolerance of the fastest. 3: TF32 convolutions under the larger cap.
inline constexpr int kTimedChoiceVersion = 3;

// What decides a timed convolution's workspace cap.
struct TimedConvMath {
  bool fp32_tensors = false;  // fp32 operands (strict fp32 or TF32), not fp16/bf16
  bool tf32 = false;          // on TF32 tensor cores
  bool transforms = false;    // FFT and Winograd engines may compete
};

// The most workspace a convolution chosen by timing may take: `fp32_cap` (if larger) for fp32
// operands where the fast engines need more than `cap`, else `cap`. A large workspace is then
// taken only where its configuration was timed fastest (choose_timed_config); a heuristic choice
// keeps `cap` (the caller's part).
// - Strict fp32 with transform engines: without tensor cores the fast engines for 3x3 layers are
//   FFT ones, whose transformed operands grow with the activations (CudaBackendOptions).
// - TF32: cuDNN's tensor-core engines for the three-channel stem's weight gradient need more than
//   256 MiB (the step's workspace 1.17 GiB at batch 256 with engine 34), and the cap left them
//   out. On an H100 (2026-12-07) that gradient took 1.96 ms with them against 3.36 ms for the best
//   engine under the cap, and ResNet-50's TF32 step ran 2.0 % faster at batch 256 (1.0 GiB more
//   at the peak); cudnn.benchmark takes such an engine for PyTorch.
std::int64_t timed_workspace_cap(TimedConvMath math, std::int64_t cap, std::int64_t fp32_cap);

// The index in `timed` of the configuration to keep: the fastest (the first of equals), unless
// it takes workspace and the fastest without any is within kWorkspaceFreeTolerance of it. Times
// that are not finite are never kept; nullopt where no time is.
//
// Why: timed alone, two configurations may tie and yet run the step differently beside the
// other stream's work. At fp16 batch 64 on an H100 (2026-12-07) the data gradient of ResNet-50's
// layer1 1x1 convolution (64 to 256 channels) took 0.050 ms alone with cuDNN's engine 63 under
// either value of its workspace knob, but the step ran 6,420 img/s with 272 bytes of workspace
// and 6,545 without (that one entry of a tuning cache swapped each way, two runs each), and which
// one autotuning kept went either way between runs: 5 of 13 fresh tunings kept one with workspace
// (engine 63 with 272 bytes three times, engine 67 with 131 bytes twice), and each ran the step
// near 6,420. Why the step runs them slower was not profiled. With this rule four of four fresh
// tunings ran batch 64 at 6,540 to 6,551 img/s; docs/performance.md has the other batches and
// precisions.
std::optional<std::size_t> choose_timed_config(std::span<const TimedConfig> timed);

}  // namespace dlprobe::cuda
