// A fixed protocol in one call, for the tests: the warm-up and window fields in their order.
#pragma once

#include <cstdint>

#include "dlprobe/bench/runner.h"

namespace dlprobe::bench {

inline Protocol fixed_protocol(std::int64_t warmup_steps, double warmup_seconds,
                               std::int64_t min_steps, double min_seconds, int windows,
                               std::int64_t max_steps) {
  Protocol p;
  p.warmup_steps = warmup_steps;
  p.warmup_seconds = warmup_seconds;
  p.min_steps = min_steps;
  p.min_seconds = min_seconds;
  p.repeat = windows;
  p.max_steps = max_steps;
  return p;
}

}  // namespace dlprobe::bench
