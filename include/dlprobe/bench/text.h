// A bench sweep's results as terminal text: what `dlprobe bench` and `dlprobe evaluate` print.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/bench/runner.h"
#include "dlprobe/bench/sweep.h"
#include "dlprobe/results/results.h"

namespace dlprobe::bench {

// The results as a table (configuration, status, img/s and CI, median and p99 step time, CV, peak
// memory, TFLOP/s and share of the ceiling, J/image, GPU util, power, SM clock), then the errors
// of the configurations that did not finish.
std::string configurations_text(const std::vector<results::Configuration>& configurations);

// Every finding, configuration by configuration, then the sweep's own; a warning that several
// configurations share is printed once, with each one's numbers. Empty without findings.
std::string findings_text(const std::vector<results::Configuration>& configurations,
                          const std::vector<results::Finding>& sweep_findings);

// One configuration of `sweep` in full: model, step, device, protocol and warm-up, throughput and
// its interval within the steps, the runs and their spread (--repeat), step times, compute,
// telemetry, energy, and the first run's loss, memory by category and profile.
std::string detail_text(const Sweep& sweep, const results::Configuration& configuration,
                        const std::vector<BenchResult>& runs);

// What a sweep found: with `detailed`, its one configuration in full (nothing for one that did
// not finish: its error says it), else the table; then the findings. Empty when nothing ran.
std::string outcome_text(const Sweep& sweep, const SweepOutcome& outcome,
                         const std::vector<results::Finding>& findings, bool detailed);

// The throughput of each of a configuration's runs and the interval and spread between them:
// "a, b, c img/s; between <what> 95% t interval lo - hi, spread min - max" (what: "runs",
// "processes"). Empty without a run spread.
std::string run_spread_text(const results::Configuration& configuration, std::string_view what);

// Device time per kind of call, then the slowest calls.
std::string profile_text(const std::vector<results::CallTime>& profile);

}  // namespace dlprobe::bench
