#include "dlprobe/data/cuda_queues.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "dlprobe/core/process_env.h"

namespace dlprobe::data {

bool widen_cuda_queues() {
  return set_default_env(kCudaQueuesVariable, std::to_string(kGpuDecodeQueues));
}

std::optional<int> narrow_cuda_queues() {
  if (set_by_dlprobe(kCudaQueuesVariable)) return std::nullopt;
  const char* value = std::getenv(std::string(kCudaQueuesVariable).c_str());
  if (value == nullptr) return std::nullopt;
  const std::string_view text(value);
  int queues = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), queues);
  // A value that is not a count is not judged: what CUDA makes of it is not documented.
  if (ec != std::errc() || end != text.data() + text.size() || queues < 1 ||
      queues >= kGpuDecodeQueues) {
    return std::nullopt;
  }
  return queues;
}

}  // namespace dlprobe::data
