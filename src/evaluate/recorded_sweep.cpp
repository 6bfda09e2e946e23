#include "dlprobe/evaluate/recorded_sweep.h"

#include "dlprobe/run/results.h"

namespace dlprobe::evaluate {

results::Context bench_context(const std::vector<std::string>& command_line,
                               const std::shared_ptr<nvml::Library>& nvml,
                               const doctor::StackVersions& versions) {
  results::Context c = run::results_context(command_line, nvml);
  if (versions.cuda_runtime_loaded > 0) {
    c.cuda_runtime_version = doctor::decode_cuda_version(versions.cuda_runtime_loaded).str();
  }
  for (const doctor::LibraryProbe* p : {&versions.cudnn, &versions.cublas, &versions.cublaslt,
                                        &versions.nccl, &versions.cupti, &versions.onednn}) {
    c.libraries.push_back({p->name, p->loaded ? p->version : "", p->loaded ? p->path : ""});
  }
  return c;
}

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
