// `dlprobe run`'s measurements in the shared results schema (dlprobe.results/1), so that
// `dlprobe report` and `dlprobe compare` read an external workload like a native benchmark; the
// context (host, software, GPUs) and the findings also serve the other commands' results files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dlprobe/doctor/versions.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/results/results.h"
#include "dlprobe/run/runner.h"

namespace dlprobe::run {

// Host, software and GPUs as they were at the start; GPU parts only where NVML is open; the CUDA
// runtime and the libraries as doctor probed them (`versions`), so that every command's results
// from one machine and stack name it alike.
results::Context results_context(const std::vector<std::string>& command_line,
                                 const std::shared_ptr<nvml::Library>& nvml,
                                 const doctor::StackVersions& versions);

// One configuration: kind external, the command template and sweep values as settings.
results::Configuration to_configuration(const RunResult& result, const std::string& command);

// A diagnosis finding as the results schema holds it, its text made valid UTF-8.
results::Finding to_results_finding(const diagnosis::Finding& finding);

}  // namespace dlprobe::run
