// A memory analysis over a grid of configurations, every batch, precision and memory mode of one
// step: measured on a device beside what one calibration predicts for each, predicted without a
// device, or the largest batch under a limit, predicted and then verified by measured runs.
//
// Each configuration goes to an AnalysisObserver as soon as it is done, so a long analysis shows
// and keeps what it has while it runs; results_record() makes the results file's configuration
// of any of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/core/status.h"
#include "dlprobe/memory/max_batch.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/session.h"
#include "dlprobe/results/results.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::memory {

// The batch whose measured step calibrates a max-batch search unless one is chosen (batch 1 where
// it does not fit the limit).
inline constexpr std::int64_t kMaxBatchCalibrationBatch = 32;

struct AnalysisOptions {
  // Model, mode and optimizer; batch, precision, layout and memory plan are set per configuration.
  engine::StepConfig base;
  std::vector<std::int64_t> batches;  // not used by the max-batch search
  std::vector<engine::Precision> precisions;
  // None: each precision in the fastest layout the engine knows for the device
  // (device::fastest_settings; a GPU's when predicting).
  std::optional<Layout> layout;
  // Empty: the fastest memory plan for the device, over a growing allocator (fastest_gpu_memory()).
  std::vector<GpuMemoryOption> gpu_memory;
  int warmup = 1;  // steps before the one followed
  // Measured earlier (read_calibrations()): the one of a configuration's model and precision
  // predicts it in place of one measured here. A prediction without any is of the allocator's
  // own categories only.
  std::vector<Calibration> calibrations;
  // The batch measured first for each precision and memory mode, whose calibration predicts the
  // others; 0: the smallest of `batches`, or kMaxBatchCalibrationBatch for the max-batch search.
  std::int64_t calibration_batch = 0;
  // Where to measure; its allocator is replaced by each memory mode's. None: predict only.
  std::optional<SessionOptions> session;
  // Predicting only: the memory of the device predicted for (preallocated fractions are of it),
  // and then also the largest batch that fits it for each precision and memory mode.
  std::optional<std::uint64_t> device_bytes;
  // Instead of the batches, the largest batch whose process fits this many bytes, for each
  // precision and memory mode: the modes' plans count, their allocator modes do not (the
  // allocator runs in limit mode).
  std::optional<std::uint64_t> max_batch_limit;
};

// One configuration as it came out.
struct Outcome {
  engine::StepConfig step;
  GpuMemoryOption gpu_memory;
  std::string device;   // the results file's device setting: "cpu", "cuda:N" or "predicted"
  std::string backend;  // "cuda", "onednn", "reference"; "" when predicted
  // Not ok: the configuration ran out of memory or failed to run, and nothing below is set.
  Status failure;
  std::optional<Measurement> measured;
  std::optional<Prediction> predicted;
  std::optional<Calibration> calibration;  // the one the prediction used
  bool calibration_run = false;            // measured at the calibration's batch
  // Measured, but predicted not to fit as the device ran it: the out-of-memory report; then
  // `predicted` holds the figures in growth mode.
  std::string misfit;
  // The max-batch search; its measurement at the batch found is the configuration's.
  std::optional<MaxBatchResult> max_batch;
};

// The largest batch predicted, without a device, to fit `limit_bytes`.
struct PredictedMaxBatch {
  engine::StepConfig step;
  GpuMemoryOption gpu_memory;
  std::uint64_t limit_bytes = 0;
  std::int64_t largest = 0;
  bool calibrated = false;  // with a calibration's workspace and outside-allocator bytes
  std::optional<std::int64_t> recomputed;  // predict_max_batch_recomputed()
};

class AnalysisObserver {
 public:
  virtual ~AnalysisObserver() = default;
  // Before a step is measured; `calibrating`: the one whose calibration predicts the others.
  virtual void measuring(const engine::StepConfig& step, const GpuMemoryOption& gpu_memory,
                         bool calibrating) = 0;
  // An error stops the analysis.
  virtual Status finished(const Outcome& outcome) = 0;
  virtual void predicted(const PredictedMaxBatch& max_batch) = 0;
};

// The device kind the analysis runs on or predicts for: a GPU unless it measures on the CPU.
DeviceKind analysis_device_kind(const AnalysisOptions& options);

// The memory modes of an analysis with an empty `gpu_memory`: the plans device::fastest_settings
// names for the device and its precisions ("planned" on a GPU, "grow" on the CPU).
std::vector<GpuMemoryOption> fastest_gpu_memory(const AnalysisOptions& options);

// The layout a configuration of precision `p` runs in.
Layout analysis_layout(const AnalysisOptions& options, engine::Precision p);

// Runs the grid in order: each memory mode, then each precision, then each batch. A configuration
// that fails is an outcome; an error of the analysis itself (a device that does not open, a
// calibration of another model) ends it.
Status run_analysis(const AnalysisOptions& options, AnalysisObserver& observer);

// The calibration among `calibrations` of `step`'s model and precision; null where none is.
const Calibration* find_calibration(const std::vector<Calibration>& calibrations,
                                    const engine::StepConfig& step);

// The results file's configuration of an outcome: settings, status (a failure is oom or failed,
// with its message) and memory (memory.analysis is to_json(AnalysisRecord)). None for a max-batch
// search under which not even batch 1 ran.
std::optional<results::Configuration> results_record(const Outcome& outcome);

}  // namespace dlprobe::memory
