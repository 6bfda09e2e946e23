// `dlprobe evaluate`'s five lines: the machine, its ceilings, the best configuration, memory and
// how many configurations ran, the findings and the files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "dlprobe/bench/sweep.h"
#include "dlprobe/doctor/doctor.h"
#include "dlprobe/results/results.h"

namespace dlprobe::evaluate {

std::string evaluation_summary(const doctor::Report& report, const bench::Sweep& sweep,
                               const std::vector<results::Configuration>& configurations,
                               const std::vector<results::Finding>& findings,
                               const std::filesystem::path& folder);

}  // namespace dlprobe::evaluate
