// The monotonic clock that timestamps samples, steps and windows: std::chrono::steady_clock
// (CLOCK_MONOTONIC on Linux), so that readings of different modules line up within one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

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

// The wall-clock time now in UTC, through strftime's `format` ("%Y-%m-%dT%H:%M:%SZ").
inline std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[64];
  return std::string(text, std::strftime(text, sizeof text, format, &utc));
}

// The UTC time an ISO-8601 text names as dlprobe writes it: "2026-03-01", then optionally
// "THH", ":MM", ":SS" (60: a leap second) and fractional digits, then, after a time, optionally
// "Z". None where the text is not one (a month 13, February 30, an hour 99, anything after): the
// history's filters compare dates as instants and the report's trend places them on a time axis,
// and a value that is no date would select everything or nothing, or a point nowhere.
std::optional<std::chrono::sys_time<std::chrono::milliseconds>> parse_utc_time(
    std::string_view text);

}  // namespace dlprobe
