// bench's timing flags: --steps, --min-time, --warmup (auto: until steady, or a step count),
// --warmup-time, --windows and --repeat (runs from scratch), into a bench::Protocol and the runs.
#pragma once

#include <cstdint>
#include <string>

#include "dlprobe/bench/runner.h"
#include "dlprobe/core/status.h"

namespace CLI {
class App;
}

namespace dlprobe::cli {

// The most steps a command takes: a run keeps each step's time (bench) or loss (step).
inline constexpr std::int64_t kMaxSteps = 1'000'000;

struct ProtocolFlags {
  std::string steps = "30";
  std::string min_time = "2s";
  std::string warmup = "auto";
  std::string warmup_time;  // empty: 30 s at most until steady, none beside fixed steps
  std::string windows = "1";
  std::string repeat = "1";
};
void add_protocol_flags(CLI::App& sub, ProtocolFlags& flags);
// Each value in range, or a one-line error naming its flag.
Status parse_protocol(const ProtocolFlags& flags, bench::Protocol& protocol, int& runs);

}  // namespace dlprobe::cli
