#include "protocol_flags.h"

#include <algorithm>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/core/units.h"

namespace dlprobe::cli {

void add_protocol_flags(CLI::App& sub, ProtocolFlags& f) {
  option(sub, "--steps", f.steps, "Timed steps per window, at least");
  option(sub, "--min-time", f.min_time, "Timed window length, at least (e.g. 2s)");
  option(sub, "--warmup", f.warmup,
         "auto: warm up until the step times stop falling (docs/bench.md); N: exactly N untimed "
         "steps (with --warmup-time, at least that long too)");
  sub.add_option("--warmup-time", f.warmup_time,
                 "With --warmup auto the most it may take (30s when not given); with --warmup N "
                 "the least (none when not given)")
      ->type_name("DURATION");
  option(sub, "--windows", f.windows, "Timed windows per run, one after another on one engine");
  option(sub, "--repeat", f.repeat,
         "Runs of each configuration, each from scratch on a new engine; two or more give the "
         "spread between runs beside the interval within the steps");
}

Status parse_protocol(const ProtocolFlags& f, bench::Protocol& p, int& runs) {
  DLPROBE_ASSIGN_OR_RETURN(p.min_steps, parse_int(f.steps, "--steps", 1, kMaxSteps));
  DLPROBE_ASSIGN_OR_RETURN(p.min_seconds, parse_seconds(f.min_time, "--min-time"));
  p.until_steady = f.warmup == "auto";
  if (p.until_steady) {
    p.warmup_steps = 0;
  } else {
    DLPROBE_ASSIGN_OR_RETURN(p.warmup_steps,
                             parse_int(f.warmup, "--warmup (auto or a step count)", 0, 1'000'000));
    p.warmup_max_steps = std::max(p.warmup_max_steps, p.warmup_steps);
  }
  p.warmup_seconds = p.until_steady ? 30.0 : 0.0;
  if (!f.warmup_time.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.warmup_seconds, parse_seconds(f.warmup_time, "--warmup-time"));
  }
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t windows, parse_int(f.windows, "--windows", 1, 1000));
  p.repeat = static_cast<int>(windows);
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t repeat, parse_int(f.repeat, "--repeat", 1, 1000));
  runs = static_cast<int>(repeat);
  p.max_steps = std::max(p.max_steps, p.min_steps);
  return Status::ok();
}

}  // namespace dlprobe::cli
