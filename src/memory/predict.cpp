// Prediction: the step planned on the dry backend over fake addresses, so the caching allocator's
// own policy gives its figures for any batch and precision; and the max-batch search over it.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dlprobe/core/batch_search.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/memory/max_batch.h"
#include "dlprobe/memory/prediction.h"
#include "dry_backend.h"
#include "step_follower.h"

namespace dlprobe::memory {

std::optional<std::int64_t> Prediction::process_bytes() const {
  if (!outside_allocator_bytes) return std::nullopt;
  return step.reserved_peak_bytes + *outside_allocator_bytes;
}

Result<StepMemory> simulate_step(const SimulationOptions& o, const Calibration* calibration,
                                 std::string* workspace_model) {
  FakeMemoryConfig source;
  // An unbounded device has no free-memory figure worth printing in an out-of-memory report.
  source.report_memory_info = o.device_bytes > 0;
  if (o.device_bytes > 0) source.capacity_bytes = o.device_bytes;
  // Destroyed in reverse: the step and the workspace give their blocks back before the allocator
  // goes.
  DLPROBE_ASSIGN_OR_RETURN(
      std::unique_ptr<CachingAllocator> allocator,
      CachingAllocator::create(std::make_unique<FakeMemorySource>(source), o.allocator));
  // Planned as the calibrated backend plans; without a calibration, as the CUDA backend does by
  // default (batch norm inside the convolutions in NHWC, where the step's fuse_conv allows it, and
  // the stem's backward in one call).
  const bool fuses_conv = calibration != nullptr ? calibration->fused_conv
                                                 : o.step.precision != engine::Precision::fp64 &&
                                                       o.step.layout == Layout::nhwc;
  // The stem's backward in one call: the CUDA backend's default in NHWC but for fp64.
  const bool fuses_pool_backward = calibration != nullptr
                                       ? calibration->fused_pool_backward
                                       : o.step.precision != engine::Precision::fp64;
  const std::unique_ptr<Backend> backend =
      make_dry_backend(calibration == nullptr || calibration->fused, fuses_conv,
                       calibration == nullptr || calibration->recomputed_pool, fuses_pool_backward);
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<engine::TrainingStep> step,
                           engine::TrainingStep::create(o.step, *backend, *allocator));
  // The calibration's workspace: per call where its profile was measured on this call list, else
  // its peak held through the step (an upper bound).
  std::uint64_t held = o.workspace_bytes;
  std::vector<std::int64_t> scratch;
  std::string model = "none";
  if (calibration != nullptr && calibration->workspace_bytes > 0) {
    const std::vector<engine::Call>& calls = step->calls();
    const std::vector<std::size_t> computing = computing_calls(calls);
    if (calibration->calls == computing.size()) {
      model = "per call";
      held =
          static_cast<std::uint64_t>(std::max<std::int64_t>(calibration->workspace_held_bytes, 0));
      scratch.assign(calls.size(), 0);
      for (const auto& [k, bytes] : calibration->workspace_by_call) {
        if (k < computing.size()) scratch[computing[k]] = bytes;
      }
    } else {
      model = "held";
      held = static_cast<std::uint64_t>(calibration->workspace_bytes);
    }
  } else if (held > 0) {
    model = "held";
  }
  if (workspace_model != nullptr) *workspace_model = model;
  // After the step's long-lived state, as a backend takes its workspace at the first call that
  // needs one.
  DeviceBuffer workspace;
  if (held > 0) {
    DLPROBE_ASSIGN_OR_RETURN(
        workspace, allocator->allocate_buffer(held, Category::workspace, "workspace (calibrated)"));
  }
  // One pass first, so the followed one meets a warm cache as a measured step does.
  DLPROBE_RETURN_IF_ERROR(run_calls(*step, *allocator, scratch));
  return follow_calls(*step, *allocator, scratch);
}

Result<Prediction> predict(const engine::StepConfig& step, const Calibration* calibration,
                           const AllocatorOptions& allocator, std::uint64_t device_bytes) {
  SimulationOptions o;
  o.step = step;
  o.allocator = allocator;
  o.device_bytes = device_bytes;
  Prediction p;
  if (calibration != nullptr) {
    const std::string model = model::model_name(step.model);
    const std::string_view precision = engine::precision_name(step.precision);
    if (calibration->model != model || calibration->precision != precision) {
      return invalid_argument(fmt::format(
          "the calibration was measured with {} {}, not {} {}: workspaces differ between them",
          calibration->model, calibration->precision, model, precision));
    }
    p.workspace_bytes = calibration->workspace_bytes;
    p.calibrated = true;
    p.outside_allocator_bytes = calibration->outside_allocator_bytes;
    if (o.allocator.mode == Mode::limit && o.allocator.overhead_bytes == 0) {
      o.allocator.overhead_bytes = static_cast<std::uint64_t>(
          std::max<std::int64_t>(calibration->outside_allocator_bytes.value_or(0), 0));
    }
  }
  DLPROBE_ASSIGN_OR_RETURN(p.step, simulate_step(o, calibration, &p.workspace_model));
  return p;
}

Result<std::int64_t> search_largest(std::int64_t guess, std::int64_t upper,
                                    const std::function<Result<bool>(std::int64_t)>& fits,
                                    std::vector<std::pair<std::int64_t, bool>>* probes) {
  if (upper < 1) return invalid_argument(fmt::format("search bound {} is below 1", upper));
  BatchSearchOptions options;
  options.guess = guess;
  options.upper = upper;
  BatchSearch search(options);
  while (const std::optional<std::int64_t> batch = search.next()) {
    DLPROBE_ASSIGN_OR_RETURN(const bool ok, fits(*batch));
    if (probes != nullptr) probes->emplace_back(*batch, ok);
    search.report(*batch, ok);
  }
  return search.largest_passed().value_or(0);
}

std::int64_t max_batch_bound(const engine::StepConfig& step, std::uint64_t limit_bytes) {
  const auto per_sample =
      static_cast<std::uint64_t>(3 * step.model.image_size * step.model.image_size) * sizeof(float);
  return std::max<std::int64_t>(static_cast<std::int64_t>(limit_bytes / per_sample), 1);
}

Result<std::int64_t> predict_max_batch(const engine::StepConfig& step, std::uint64_t limit_bytes,
                                       const Calibration* calibration,
                                       std::optional<std::int64_t> upper) {
  Calibration none;
  if (calibration != nullptr) none = *calibration;
  const std::int64_t outside = none.outside_allocator_bytes.value_or(0);
  SimulationOptions o;
  o.step = step;
  o.allocator.mode = Mode::limit;
  o.allocator.limit_bytes = limit_bytes;
  o.allocator.overhead_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(outside, 0));

  if (o.allocator.overhead_bytes >= limit_bytes) {
    return invalid_argument(
        fmt::format("a limit of {} leaves nothing after the {} the process "
                    "holds outside the allocator",
                    format_size(limit_bytes), format_size(o.allocator.overhead_bytes)));
  }
  auto simulate = [&](std::int64_t batch) -> Result<StepMemory> {
    SimulationOptions at = o;
    at.step.batch = batch;
    return simulate_step(at, calibration);
  };
  auto fits = [&](std::int64_t batch) -> Result<bool> {
    Result<StepMemory> r = simulate(batch);
    log_debug("max batch: simulated batch {}: {}", batch,
              r ? format_size(static_cast<std::uint64_t>(r->reserved_peak_bytes)) + " reserved"
                : r.status().message());
    if (r) return true;
    if (r.status().code() == Errc::out_of_memory) return false;
    return r.status();
  };
  // The first guess from a straight line through two unlimited simulations: memory grows with the
  // batch by the activations and temporaries, on top of what does not. Batches 8 and 16, not 1:
  // on small images batch norm in training needs more than one value per channel.
  SimulationOptions free_run = o;
  free_run.allocator = {};
  free_run.step.batch = 8;
  DLPROBE_ASSIGN_OR_RETURN(const StepMemory at8, simulate_step(free_run, calibration));
  free_run.step.batch = 16;
  DLPROBE_ASSIGN_OR_RETURN(const StepMemory at16, simulate_step(free_run, calibration));
  // Allocated bytes, which move with every sample: reserved ones move in whole segments, and an
  // unlimited allocator reserves more than a limit lets it (a planned step's arena at batch 8 may
  // pass a limit under which batch 64 runs). The guess only starts the search; at least 2, for
  // the same reason as batch 8: a step at batch 1 may fail for want of values, not memory, and
  // end the search, where from 2 it goes down to 1 only when 2 does not fit.
  std::int64_t guess = 8;
  if (at16.peak.allocated_bytes > at8.peak.allocated_bytes) {
    const double per_sample =
        static_cast<double>(at16.peak.allocated_bytes - at8.peak.allocated_bytes) / 8.0;
    const double room = static_cast<double>(limit_bytes) - static_cast<double>(outside) -
                        static_cast<double>(at8.peak.allocated_bytes);
    guess = std::max<std::int64_t>(8 + static_cast<std::int64_t>(std::floor(room / per_sample)), 2);
  }
  return search_largest(guess, upper.value_or(max_batch_bound(step, limit_bytes)), fits);
}

}  // namespace dlprobe::memory
