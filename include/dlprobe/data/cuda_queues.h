// How many hardware work queues a CUDA context spreads its streams over:
// CUDA_DEVICE_MAX_CONNECTIONS, read when CUDA starts in the process, 8 where unset. Streams beyond
// that share a queue, and work on one queue starts in the order it was queued: a GPU decoder's copy
// or event queued behind a training step's CUDA graph waits for the whole step. On an H200 (fp16
// ResNet-50 bs256, nvJPEG's hardware engine, two decoders) each decoder waited about 28 ms a batch
// in event syncs with 8 queues, and training from JPEGs ran at 89 to 93 % of the synthetic batch's
// throughput; with 32 those waits were gone and it ran at 98.6 % (lab/gpu/slow-calls.sh,
// lab/gpu/gpu-data.sh).
#pragma once

#include <optional>
#include <string_view>

namespace dlprobe::data {

inline constexpr std::string_view kCudaQueuesVariable = "CUDA_DEVICE_MAX_CONNECTIONS";
inline constexpr int kGpuDecodeQueues = 32;  // CUDA's most

// For a process that will decode on the GPU beside a training step: kGpuDecodeQueues queues
// unless the user's environment sets the variable. Call before the process's first CUDA call.
// Workloads started through run::ChildProcess go without it (dlprobe/core/process_env.h); bench's
// --repeat-process children are dlprobe itself and inherit it. Returns whether it set it.
bool widen_cuda_queues();

// The queues the user's environment asks for where they are fewer than kGpuDecodeQueues (the GPU
// path's finding names them as a cause); nullopt otherwise.
std::optional<int> narrow_cuda_queues();

}  // namespace dlprobe::data
