// Internal to the report: the memory timeline of `dlprobe memory` configurations (memory.analysis
// in the results file), one chart per configuration, stacked by category over the step.
#pragma once

#include <string>
#include <vector>

#include "dlprobe/results/results.h"

namespace dlprobe::report {

struct MemoryTimelineInput {
  std::string label;  // the configuration as the report names it
  const results::Configuration* config = nullptr;
};

// A heading and one <svg class="chart" id="chart-memory-timeline-N"> per configuration whose
// memory.analysis holds a measured (else predicted) timeline; "" when none does.
std::string memory_timeline_section(const std::vector<MemoryTimelineInput>& inputs);

// A coordinate or length in an SVG: two decimals, enough below a pixel. Every number of a chart's
// geometry goes through here: a value from a hand-edited or hostile file can fall off any scale
// (1e308 items/s times the axis' headroom is inf), and SVG parsers refuse "inf" and "nan" and drop
// the element. Such a coordinate is clamped to far outside the drawing (nan to its origin).
std::string svg_number(double v);

}  // namespace dlprobe::report
