// How much a finding matters: one scale for doctor's verdicts, the diagnosis rules and the results
// file, so that a finding passes from one to the other unchanged.
#pragma once

#include <string_view>

namespace dlprobe {

enum class Severity { info, warning, error };

// "info", "warning", "error": the word reports print and the results file stores.
constexpr std::string_view severity_name(Severity severity) {
  switch (severity) {
    case Severity::info:
      return "info";
    case Severity::warning:
      return "warning";
    case Severity::error:
      return "error";
  }
  return "info";
}

}  // namespace dlprobe
