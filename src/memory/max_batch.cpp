// The largest batch under a limit: predicted from simulations, then verified by measured steps.
#include <fmt/format.h>

#include "dlprobe/core/log.h"
#include "dlprobe/memory/max_batch.h"

namespace dlprobe::memory {

Result<std::optional<std::int64_t>> predict_max_batch_recomputed(
    const engine::StepConfig& step, std::uint64_t limit_bytes, const Calibration* calibration,
    std::int64_t without, std::optional<std::int64_t> upper) {
  if (step.recompute_block_outputs || step.mode == engine::StepMode::infer || step.streams > 1) {
    return std::optional<std::int64_t>();
  }
  engine::StepConfig again = step;
  again.recompute_block_outputs = true;
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t largest,
                           predict_max_batch(again, limit_bytes, calibration, upper));
  return largest > without ? std::optional(largest) : std::nullopt;
}

Result<MaxBatchResult> find_max_batch(Session& session, const engine::StepConfig& step,
                                      std::uint64_t limit_bytes, const Calibration* calibration,
                                      std::optional<std::int64_t> upper, int warmup) {
  const AllocatorOptions& o = session.allocator().options();
  if (o.mode != Mode::limit || o.limit_bytes != limit_bytes) {
    return invalid_argument(
        "max batch: the session's allocator must run in limit mode with the same limit");
  }
  MaxBatchResult r;
  r.limit_bytes = limit_bytes;
  DLPROBE_ASSIGN_OR_RETURN(r.predicted, predict_max_batch(step, limit_bytes, calibration, upper));
  DLPROBE_ASSIGN_OR_RETURN(
      r.predicted_recomputed,
      predict_max_batch_recomputed(step, limit_bytes, calibration, r.predicted, upper));
  auto fits = [&](std::int64_t batch) -> Result<bool> {
    engine::StepConfig at = step;
    at.batch = batch;
    log_info("max batch: measuring batch {}", batch);
    Result<Measurement> m = session.measure(at, warmup);
    MaxBatchTrial t;
    t.batch = batch;
    if (!m) {
      if (m.status().code() != Errc::out_of_memory) return m.status();
      t.why = m.status().message();
      r.trials.push_back(std::move(t));
      return false;
    }
    t.fits = true;
    t.peak_allocated_bytes = m->memory.peak.allocated_bytes;
    t.reserved_peak_bytes = m->memory.reserved_peak_bytes;
    if (m->reconciliation) t.nvml_process_bytes = m->reconciliation->nvml_process_bytes;
    r.trials.push_back(std::move(t));
    if (!r.at_found || r.at_found->step.batch < batch) r.at_found = std::move(m).value();
    return true;
  };
  DLPROBE_ASSIGN_OR_RETURN(
      r.found, search_largest(std::max<std::int64_t>(r.predicted, 2),
                              upper.value_or(max_batch_bound(step, limit_bytes)), fits));
  for (const MaxBatchTrial& t : r.trials) {
    if (t.batch == r.found + 1 && !t.fits) r.next_fails = true;
  }
  return r;
}

}  // namespace dlprobe::memory
