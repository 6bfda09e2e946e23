// Internal to the report: the memory timeline of `dlprobe memory` configurations (memory.analysis
// in the results file), one chart per configuration, stacked by category over the step.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "dlprobe/results/results.h"

namespace dlprobe::report {

struct MemoryTimelineInput {
  std::string label;  // the configuration as the report names it
  const results::Configuration* config = nullptr;
};

// A heading and one <canvas id="chart-memory-timeline-N"> per configuration whose memory.analysis
// holds a measured (else predicted) timeline, their specifications appended to `charts`; "" when
// none does.
std::string memory_timeline_section(const std::vector<MemoryTimelineInput>& inputs,
                                    nlohmann::json& charts);

}  // namespace dlprobe::report
