// Splitting a flat host loop over the machine's cores.
#pragma once

#include <cstdint>
#include <functional>

namespace dlprobe {

// Runs body(begin, end) over [0, n) cut into contiguous ranges, one per thread, on up to the
// machine's hardware threads, each range at least `grain` long (one range, on the calling
// thread, when n < 2 * grain). Returns when every range is done. For the host loops over whole
// tensors that a benchmark's start-up would otherwise wait on one core for (its random images,
// the initial weights, their conversion and layout): flat, even loops, for which std::thread is
// enough; the CPU backend's ops keep oneDNN's own threading.
void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

}  // namespace dlprobe
