// What `dlprobe memory` prints: each configuration as memory::run_analysis() hands it over, and
// the summary at the end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/memory/analysis_runs.h"

namespace dlprobe::cli {

// "resnet50 bs32 fp32 train NCHW sgd, --gpu-memory grow"
std::string describe(const engine::StepConfig& step, const memory::GpuMemoryOption& gpu_memory);

// A failure in one line; else a heading and the breakdown at the peak, measured beside predicted
// (with `device_bytes`, predicting for a GPU of that memory: whether the step fits it), or the
// max-batch search with its trials.
void print_outcome(const memory::Outcome& outcome, std::optional<std::uint64_t> device_bytes);
void print_predicted_max_batch(const memory::PredictedMaxBatch& max_batch);

// The configurations measured beside their predictions in a table, or the largest batch each
// max-batch search found against the first's: gathered outcome by outcome, printed at the end.
class MemorySummary {
 public:
  void add(const memory::Outcome& outcome);
  void print() const;

 private:
  struct Row {
    engine::StepConfig step;
    std::string gpu_memory;
    std::int64_t predicted = 0;
    std::int64_t measured = 0;
    std::int64_t reserved = 0;
    std::optional<std::int64_t> nvml;
    bool calibration = false;
  };
  struct Found {
    engine::Precision precision = engine::Precision::fp32;
    std::string gpu_memory;
    std::int64_t batch = 0;
    std::uint64_t limit_bytes = 0;
  };
  std::vector<Row> rows_;
  std::vector<Found> found_;
};

}  // namespace dlprobe::cli
