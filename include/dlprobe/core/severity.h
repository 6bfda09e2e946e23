// How much a finding matters: one scale for doctor's verdicts, the diagnosis rules and the results
// file, so that a finding passes from one to the other unchanged.
#pragma once

#include <string_view>

#include "dlprobe/core/named.h"

namespace dlprobe {

enum class Severity { info, warning, error };

// "info", "warning", "error": the words reports print and the results file stores.
inline constexpr Named<Severity> kSeverities[] = {
    {Severity::info, "info"}, {Severity::warning, "warning"}, {Severity::error, "error"}};

constexpr std::string_view severity_name(Severity severity) {
  return name_of(kSeverities, severity, "info");
}

}  // namespace dlprobe
