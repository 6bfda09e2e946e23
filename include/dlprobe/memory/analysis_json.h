// Memory analysis in the results file: the memory.analysis object of a configuration
// (docs/results-schema.md), and the calibrations read back from it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/memory/max_batch.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/session.h"
#include "dlprobe/memory/step_memory.h"

namespace dlprobe::memory {

nlohmann::json to_json(const StepMemory& memory);
// What the arena holds during one call: an `at_peak` / `fullest` object of memory.analysis.
nlohmann::json to_json(const ArenaMoment& arena);
nlohmann::json to_json(const Calibration& calibration);
nlohmann::json to_json(const Reconciliation& reconciliation);
nlohmann::json to_json(const Prediction& prediction);
nlohmann::json to_json(const MaxBatchResult& result);

// One configuration's memory.analysis object: every part may be absent (null).
struct AnalysisRecord {
  std::string gpu_memory;   // the memory mode as given
  std::string memory_plan;  // "dynamic" or "planned"
  const Measurement* measured = nullptr;
  const Prediction* predicted = nullptr;
  const Calibration* calibration = nullptr;  // the one the prediction used
  const MaxBatchResult* max_batch = nullptr;
};
nlohmann::json to_json(const AnalysisRecord& record);
// Reads a calibration back (from an earlier run's results file); errors name the JSON path.
Result<Calibration> calibration_from_json(const nlohmann::json& json, std::string_view path);
// Every calibration a results file holds (memory.analysis.calibration of each configuration
// measured on a device), in order; none when it holds no such configuration.
Result<std::vector<Calibration>> read_calibrations(const std::string& path);

}  // namespace dlprobe::memory
