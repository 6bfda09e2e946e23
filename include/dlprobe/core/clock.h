// The monotonic clock that timestamps samples, steps and windows: std::chrono::steady_clock
// (CLOCK_MONOTONIC on Linux), so that readings of different modules line up within one process.
#pragma once

#include <chrono>
#include <cstdint>

namespace dlprobe {

// Nanoseconds on the steady clock, from its arbitrary epoch.
inline std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds elapsed since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace dlprobe
