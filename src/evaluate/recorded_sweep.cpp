#include "dlprobe/evaluate/recorded_sweep.h"

#include "dlprobe/run/results.h"

namespace dlprobe::evaluate {

RecordedSweep record_sweep(const bench::Sweep& sweep, const bench::SweepEnvironment& environment,
                           bench::Outputs& outputs, std::vector<results::Finding> findings,
                           const bench::SweepCallbacks& callbacks) {
  bench::SweepCallbacks recording = callbacks;
  recording.done = [&](const std::vector<results::Configuration>& configurations,
                       std::size_t planned) {
    if (callbacks.done) DLPROBE_RETURN_IF_ERROR(callbacks.done(configurations, planned));
    return outputs.write(configurations);
  };
  RecordedSweep r;
  r.outcome = bench::run_sweep(sweep, environment, recording);
  r.findings = std::move(findings);
  for (const diagnosis::Finding& f : r.outcome.findings) {
    r.findings.push_back(run::to_results_finding(f));
  }
  r.status = r.outcome.status;
  if (!r.findings.empty()) {
    if (Status s = outputs.add_findings(r.findings); !s && r.status) r.status = s;
  }
  if (Status s = outputs.finish(); !s && r.status) r.status = s;
  return r;
}

}  // namespace dlprobe::evaluate
