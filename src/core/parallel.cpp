#include "dlprobe/core/parallel.h"

#include <sched.h>

#include <algorithm>
#include <system_error>
#include <thread>
#include <vector>

namespace dlprobe {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
}

void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  if (n / grain < 2) {
    // Most calls (small tensors) end here, without asking the kernel for the affinity mask.
    body(0, n);
    return;
  }
  const std::int64_t ranges = std::min<std::int64_t>(n / grain, usable_cores());
  const auto begin_of = [&](std::int64_t r) { return n * r / ranges; };
  std::vector<std::jthread> threads;
  threads.reserve(static_cast<std::size_t>(ranges - 1));
  std::int64_t r = 1;
  try {
    for (; r < ranges; ++r) {
      threads.emplace_back([&body, b = begin_of(r), e = begin_of(r + 1)] { body(b, e); });
    }
  } catch (const std::system_error&) {
    // No more threads to be had (a process or container limit): the rest runs here.
  }
  body(0, begin_of(1));
  for (; r < ranges; ++r) body(begin_of(r), begin_of(r + 1));
}

}  // namespace dlprobe
