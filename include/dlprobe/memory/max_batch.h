// The largest batch that completes a full training step under a process limit. search_largest()
// finds the largest batch that a monotone "fits" test accepts, from a first guess, and checks the
// next batch fails; predict_max_batch() runs it on simulations, and find_max_batch() verifies the
// prediction with Session::measure() runs under the allocator's limit mode.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/session.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::memory {

// The largest batch in [1, upper] for which `fits` holds, starting from `guess` and assuming that
// fits is monotone (true up to some batch, false above): core's BatchSearch, which probes upward or
// downward from the guess by steps of 1, 2, 4..., then bisects. Returns 0 when batch 1 does not
// fit. Only batches between the largest seen to fit and the smallest seen to fail are probed, so
// the answer was seen to fit and its next batch to fail (unless it is `upper`) even where fits is
// not monotone. Each probe is recorded in `probes` (batch, fitted) when given. An error from `fits`
// ends the search.
Result<std::int64_t> search_largest(std::int64_t guess, std::int64_t upper,
                                    const std::function<Result<bool>(std::int64_t)>& fits,
                                    std::vector<std::pair<std::int64_t, bool>>* probes = nullptr);

// The most a search under `limit_bytes` needs to try: the batch whose input images alone (fp32, as
// the step keeps them) fill the limit. No larger batch can fit, so the bound never hides an answer.
std::int64_t max_batch_bound(const engine::StepConfig& step, std::uint64_t limit_bytes);

// The largest batch whose simulated step fits a process limit of `limit_bytes`: the allocator in
// limit mode with the calibration's outside-allocator bytes as overhead and its workspace held.
// The search goes up to `upper`, by default max_batch_bound().
Result<std::int64_t> predict_max_batch(const engine::StepConfig& step, std::uint64_t limit_bytes,
                                       const Calibration* calibration,
                                       std::optional<std::int64_t> upper = std::nullopt);

// For a training step that keeps its block outputs: the largest batch predicted with
// StepConfig::recompute_block_outputs, where that is larger (the step can recompute them); else
// nullopt.
Result<std::optional<std::int64_t>> predict_max_batch_recomputed(
    const engine::StepConfig& step, std::uint64_t limit_bytes, const Calibration* calibration,
    std::int64_t without, std::optional<std::int64_t> upper = std::nullopt);

// The largest batch predicted and then verified by measured runs.
struct MaxBatchTrial {
  std::int64_t batch = 0;
  bool fits = false;
  std::string why;  // the out-of-memory report when it did not fit
  std::optional<std::int64_t> peak_allocated_bytes;
  std::optional<std::int64_t> reserved_peak_bytes;
  std::optional<std::int64_t> nvml_process_bytes;
};
struct MaxBatchResult {
  std::uint64_t limit_bytes = 0;
  std::int64_t predicted = 0;  // from simulations; 0 when not even batch 1 fits
  // predict_max_batch_recomputed(): larger with the block outputs recomputed, where it is.
  std::optional<std::int64_t> predicted_recomputed;
  std::int64_t found = 0;             // measured: `found` ran and found + 1 did not
  bool next_fails = false;            // false only when `found` is the search's upper bound
  std::vector<MaxBatchTrial> trials;  // in the order they ran
  std::optional<Measurement> at_found;
};

// `session` must run the allocator in limit mode with `limit_bytes`; `calibration` (from a run on
// the same session) feeds the prediction. Trials that run out of memory are results, not errors.
Result<MaxBatchResult> find_max_batch(Session& session, const engine::StepConfig& step,
                                      std::uint64_t limit_bytes, const Calibration* calibration,
                                      std::optional<std::int64_t> upper = std::nullopt,
                                      int warmup = 1);

}  // namespace dlprobe::memory
