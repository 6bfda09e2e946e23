#include "timed_choice.h"

#include <algorithm>
#include <cmath>

namespace dlprobe::cuda {

std::optional<std::size_t> choose_timed_config(std::span<const TimedConfig> timed) {
  std::optional<std::size_t> fastest;
  std::optional<std::size_t> fastest_free;  // the fastest without workspace
  for (std::size_t i = 0; i < timed.size(); ++i) {
    if (!std::isfinite(timed[i].ms)) continue;
    if (!fastest || timed[i].ms < timed[*fastest].ms) fastest = i;
    if (timed[i].workspace_bytes == 0 && (!fastest_free || timed[i].ms < timed[*fastest_free].ms)) {
      fastest_free = i;
    }
  }
  if (fastest && fastest_free && timed[*fastest].workspace_bytes > 0 &&
      timed[*fastest_free].ms <= timed[*fastest].ms * (1.0 + kWorkspaceFreeTolerance)) {
    return fastest_free;
  }
  return fastest;
}

std::int64_t timed_workspace_cap(TimedConvMath math, std::int64_t cap, std::int64_t fp32_cap) {
  const bool large = math.fp32_tensors && (math.tf32 || math.transforms);
  return large ? std::max(cap, fp32_cap) : cap;
}

}  // namespace dlprobe::cuda
