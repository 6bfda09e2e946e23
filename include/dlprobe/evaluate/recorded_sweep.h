// A bench sweep run into its results files: the context they record, the files rewritten after
// every configuration, then the findings, and an output on standard output once at the end. What
// `dlprobe bench` and `dlprobe evaluate` run once their sweep is chosen.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dlprobe/bench/outputs.h"
#include "dlprobe/bench/sweep.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/results/results.h"

namespace dlprobe::evaluate {

struct RecordedSweep {
  bench::SweepOutcome outcome;
  std::vector<results::Finding> findings;  // those given, then the sweep's own
  Status status;  // what stopped the sweep, else a failure to write the findings
};

// `callbacks.done` (if any) hears of each configuration before the files are rewritten; `findings`
// (doctor's, say) are recorded ahead of the sweep's own.
RecordedSweep record_sweep(const bench::Sweep& sweep, const bench::SweepEnvironment& environment,
                           bench::Outputs& outputs, std::vector<results::Finding> findings,
                           const bench::SweepCallbacks& callbacks = {});

}  // namespace dlprobe::evaluate
