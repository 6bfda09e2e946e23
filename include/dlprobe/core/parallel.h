// Splitting a flat host loop over the machine's cores.
#pragma once

#include <cstdint>
#include <functional>

namespace dlprobe {

// The CPUs this process may run on: its affinity mask (a container's or taskset's share, not the
// machine's), else the machine's count; at least 1.
int usable_cores();

// Runs body(begin, end) over [0, n) cut into contiguous ranges, one per thread, on up to
// usable_cores() threads, each range at least `grain` long (one range, on the calling thread,
// when n < 2 * grain). Returns when every range is done; ranges whose thread could not be started
// run on the calling thread, so it never fails. For the host loops over whole
// tensors that a benchmark's start-up would otherwise wait on one core for (its random images,
// the initial weights, their conversion and layout): flat, even loops, for which std::thread is
// enough; the CPU backend's ops keep oneDNN's own threading.
void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

}  // namespace dlprobe
