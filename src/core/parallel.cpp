#include "dlprobe/core/parallel.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace dlprobe {

void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t cores = std::max(1U, std::thread::hardware_concurrency());
  const std::int64_t ranges = std::clamp<std::int64_t>(n / grain, 1, cores);
  if (ranges == 1) {
    body(0, n);
    return;
  }
  std::vector<std::jthread> threads;
  threads.reserve(static_cast<std::size_t>(ranges - 1));
  const auto begin_of = [&](std::int64_t r) { return n * r / ranges; };
  for (std::int64_t r = 1; r < ranges; ++r) {
    threads.emplace_back([&body, b = begin_of(r), e = begin_of(r + 1)] { body(b, e); });
  }
  body(0, begin_of(1));
}

}  // namespace dlprobe
