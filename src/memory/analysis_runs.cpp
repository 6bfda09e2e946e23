// A memory analysis over a grid of configurations: the calibration per precision and memory mode,
// measured beside predicted, predicted only, and the max-batch search; and the results record of
// each configuration.
#include "dlprobe/memory/analysis_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "dlprobe/device/fastest_settings.h"
#include "dlprobe/memory/analysis_json.h"

namespace dlprobe::memory {
namespace {

results::Settings settings_of(const engine::StepConfig& c, const GpuMemoryOption& g,
                              const std::string& device, const std::string& backend) {
  results::Settings s;
  s.model = std::string(model::arch_name(c.model.arch));
  s.batch = c.batch;
  s.precision = std::string(engine::precision_name(c.precision));
  s.mode = std::string(engine::step_mode_name(c.mode));
  // As the flags and bench's results spell it; layout_name() is the display name.
  s.layout = std::string(device::layout_flag(c.layout));
  s.device = device;
  s.backend = backend;
  s.optimizer = c.mode == engine::StepMode::train ? std::string(engine::optimizer_name(c.optimizer))
                                                  : std::string("none");
  s.gpu_memory = g.text;
  s.image_size = c.model.image_size;
  s.classes = c.model.classes;
  s.width = c.model.width;
  s.recompute = c.recompute_block_outputs ? "block-outputs" : "";
  return s;
}

class Analysis {
 public:
  Analysis(const AnalysisOptions& options, AnalysisObserver& observer)
      : o_(options),
        gpu_memory_(o_.gpu_memory.empty() ? fastest_gpu_memory(o_) : o_.gpu_memory),
        observer_(observer),
        device_(o_.session ? device::device_name(o_.session->device) : std::string("predicted")),
        backend_(o_.session ? std::string(device::backend_kind_name(o_.session->backend))
                            : std::string()) {}

  Status run() {
    if (o_.max_batch_limit) {
      return o_.session ? measure_max_batches(*o_.max_batch_limit)
                        : predict_max_batches(*o_.max_batch_limit);
    }
    return o_.session ? measure_all() : predict_all();
  }

 private:
  engine::StepConfig config_at(std::int64_t batch, engine::Precision p,
                               const GpuMemoryOption& g) const {
    engine::StepConfig c = o_.base;
    c.batch = batch;
    c.precision = p;
    c.layout = analysis_layout(o_, p);
    c.memory_plan = g.planned ? engine::MemoryPlan::planned : engine::MemoryPlan::dynamic;
    return c;
  }

  Outcome outcome_of(const engine::StepConfig& c, const GpuMemoryOption& g) const {
    Outcome out;
    out.step = c;
    out.gpu_memory = g;
    out.device = device_;
    out.backend = backend_;
    return out;
  }

  // An error of the analysis, named by its configuration.
  Status in(const engine::StepConfig& c, const GpuMemoryOption& g, const Status& s) const {
    return s.with_context(
        results::describe(results::Kind::native, settings_of(c, g, device_, backend_)));
  }

  Status failed(const engine::StepConfig& c, const GpuMemoryOption& g, Status why) {
    Outcome out = outcome_of(c, g);
    out.failure = std::move(why);
    return observer_.finished(out);
  }

  // The calibration that predicts a precision and memory mode: one given of its model and
  // precision, else the one measured here.
  Calibration calibration_for(const Measurement& measured) const {
    const Calibration* given = find_calibration(o_.calibrations, measured.step);
    return given != nullptr ? *given : measured.calibration;
  }

  Result<std::unique_ptr<Session>> open(const AllocatorOptions& allocator) const {
    SessionOptions so = *o_.session;
    so.allocator = allocator;
    return Session::open(so);
  }

  Result<Measurement> measure(Session& session, const engine::StepConfig& c,
                              const GpuMemoryOption& g, bool calibrating) {
    observer_.measuring(c, g, calibrating);
    return session.measure(c, o_.warmup);
  }

  Status predict_all() {
    for (const GpuMemoryOption& g : gpu_memory_) {
      for (engine::Precision p : o_.precisions) {
        for (std::int64_t b : o_.batches) {
          const engine::StepConfig c = config_at(b, p, g);
          const Calibration* cal = find_calibration(o_.calibrations, c);
          Result<Prediction> predicted = predict(c, cal, g.allocator, o_.device_bytes.value_or(0));
          if (!predicted && predicted.status().code() == Errc::out_of_memory) {
            DLPROBE_RETURN_IF_ERROR(failed(c, g, predicted.status()));
            continue;
          }
          if (!predicted) return in(c, g, predicted.status());
          Outcome out = outcome_of(c, g);
          out.predicted = std::move(predicted).value();
          if (cal != nullptr) out.calibration = *cal;
          DLPROBE_RETURN_IF_ERROR(observer_.finished(out));
        }
        if (o_.device_bytes) DLPROBE_RETURN_IF_ERROR(predict_max_batch_of(p, g, *o_.device_bytes));
      }
    }
    return Status::ok();
  }

  Status predict_max_batches(std::uint64_t limit) {
    for (const GpuMemoryOption& g : gpu_memory_) {
      for (engine::Precision p : o_.precisions) {
        DLPROBE_RETURN_IF_ERROR(predict_max_batch_of(p, g, limit));
      }
    }
    return Status::ok();
  }

  Status predict_max_batch_of(engine::Precision p, const GpuMemoryOption& g, std::uint64_t limit) {
    PredictedMaxBatch r;
    r.step = config_at(1, p, g);
    r.gpu_memory = g;
    r.limit_bytes = limit;
    const Calibration* cal = find_calibration(o_.calibrations, r.step);
    r.calibrated = cal != nullptr;
    DLPROBE_ASSIGN_OR_RETURN(r.largest, predict_max_batch(r.step, limit, cal));
    DLPROBE_ASSIGN_OR_RETURN(r.recomputed,
                             predict_max_batch_recomputed(r.step, limit, cal, r.largest));
    observer_.predicted(r);
    return Status::ok();
  }

  Status measure_all() {
    const std::int64_t cal_batch = o_.calibration_batch > 0
                                       ? o_.calibration_batch
                                       : *std::min_element(o_.batches.begin(), o_.batches.end());
    for (const GpuMemoryOption& g : gpu_memory_) {
      DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, open(g.allocator));
      for (engine::Precision p : o_.precisions) {
        const engine::StepConfig cal_config = config_at(cal_batch, p, g);
        const Result<Measurement> cal = measure(*session, cal_config, g, true);
        if (!cal) {
          DLPROBE_RETURN_IF_ERROR(failed(cal_config, g, cal.status()));
          continue;
        }
        const Calibration calibration = calibration_for(*cal);
        for (std::int64_t b : o_.batches) {
          const engine::StepConfig c = config_at(b, p, g);
          Result<Measurement> m =
              b == cal_batch ? Result<Measurement>(*cal) : measure(*session, c, g, false);
          DLPROBE_RETURN_IF_ERROR(m ? measured(*session, c, g, std::move(m).value(), calibration)
                                    : failed(c, g, m.status()));
        }
      }
    }
    return Status::ok();
  }

  // One configuration measured, with what `calibration` predicts for it as the device ran it.
  Status measured(Session& session, const engine::StepConfig& c, const GpuMemoryOption& g,
                  Measurement m, const Calibration& calibration) {
    Outcome out = outcome_of(c, g);
    std::uint64_t device_bytes = 0;
    if (auto info = session.allocator().source().memory_info()) device_bytes = info->total_bytes;
    Result<Prediction> predicted =
        predict(c, &calibration, session.allocator().options(), device_bytes);
    // Not fitting where the run did is a result too, given with the growth-mode figures.
    if (!predicted && predicted.status().code() == Errc::out_of_memory) {
      out.misfit = predicted.status().message();
      predicted = predict(c, &calibration);
    }
    if (!predicted) return in(c, g, predicted.status());
    out.measured = std::move(m);
    out.predicted = std::move(predicted).value();
    out.calibration = calibration;
    out.calibration_run = calibration.batch == c.batch;
    return observer_.finished(out);
  }

  Status measure_max_batches(std::uint64_t limit) {
    AllocatorOptions limited;
    limited.mode = Mode::limit;
    limited.limit_bytes = limit;
    DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, open(limited));
    for (const GpuMemoryOption& g : gpu_memory_) {
      for (engine::Precision p : o_.precisions) {
        // The calibration (workspace, what the process holds outside the allocator) from one
        // measured step under the limit; half the batch while it does not fit. Halving, not
        // batch 1 at once: small images cannot train at batch 1 (batch norm needs more than one
        // value a channel), where batches up to the answer would.
        engine::StepConfig c = config_at(
            o_.calibration_batch > 0 ? o_.calibration_batch : kMaxBatchCalibrationBatch, p, g);
        Result<Measurement> cal = measure(*session, c, g, true);
        while (!cal && cal.status().code() == Errc::out_of_memory && c.batch > 1) {
          c.batch /= 2;
          cal = measure(*session, c, g, true);
        }
        if (!cal) {
          DLPROBE_RETURN_IF_ERROR(failed(c, g, cal.status()));
          continue;
        }
        const Calibration calibration = calibration_for(*cal);
        Outcome out = outcome_of(c, g);
        DLPROBE_ASSIGN_OR_RETURN(out.max_batch, find_max_batch(*session, c, limit, &calibration,
                                                               std::nullopt, o_.warmup));
        DLPROBE_RETURN_IF_ERROR(observer_.finished(out));
      }
    }
    return Status::ok();
  }

  const AnalysisOptions& o_;
  const std::vector<GpuMemoryOption> gpu_memory_;
  AnalysisObserver& observer_;
  const std::string device_;
  const std::string backend_;
};

}  // namespace

DeviceKind analysis_device_kind(const AnalysisOptions& options) {
  return options.session ? options.session->device.kind : DeviceKind::cuda;
}

std::vector<GpuMemoryOption> fastest_gpu_memory(const AnalysisOptions& options) {
  std::vector<GpuMemoryOption> modes;
  for (engine::Precision p : options.precisions) {
    const bool planned = device::fastest_settings(analysis_device_kind(options), p).planned;
    if (std::none_of(modes.begin(), modes.end(),
                     [&](const GpuMemoryOption& g) { return g.planned == planned; })) {
      GpuMemoryOption g;
      g.planned = planned;
      g.text = planned ? "planned" : "grow";
      modes.push_back(std::move(g));
    }
  }
  return modes;
}

Layout analysis_layout(const AnalysisOptions& options, engine::Precision p) {
  return options.layout ? *options.layout
                        : device::fastest_settings(analysis_device_kind(options), p).layout;
}

Status run_analysis(const AnalysisOptions& options, AnalysisObserver& observer) {
  if (!options.max_batch_limit && options.batches.empty()) {
    return invalid_argument("no batch to analyse");
  }
  return Analysis(options, observer).run();
}

const Calibration* find_calibration(const std::vector<Calibration>& calibrations,
                                    const engine::StepConfig& step) {
  const auto it = std::find_if(calibrations.begin(), calibrations.end(), [&](const auto& c) {
    return c.model == model::model_name(step.model) &&
           c.precision == engine::precision_name(step.precision);
  });
  return it != calibrations.end() ? &*it : nullptr;
}

std::optional<results::Configuration> results_record(const Outcome& o) {
  const Measurement* measured = o.measured ? &*o.measured : nullptr;
  if (o.max_batch && o.max_batch->at_found) measured = &*o.max_batch->at_found;
  if (o.failure.is_ok() && measured == nullptr && !o.predicted) return std::nullopt;
  results::Configuration out;
  out.kind = results::Kind::native;
  out.settings =
      settings_of(measured != nullptr ? measured->step : o.step, o.gpu_memory, o.device, o.backend);
  if (!o.failure.is_ok()) {
    out.status = o.failure.code() == Errc::out_of_memory ? results::RunStatus::oom
                                                         : results::RunStatus::failed;
    out.error = o.failure.message();
    return out;
  }
  results::Memory memory;
  memory.source = measured != nullptr ? "allocator" : "prediction";
  memory.allocator_stats = measured != nullptr ? to_flat_json(measured->stats) : nullptr;
  if (measured != nullptr && measured->reconciliation) {
    memory.nvml_process_peak_bytes = measured->reconciliation->nvml_process_bytes;
  }
  AnalysisRecord record;
  record.gpu_memory = o.gpu_memory.text;
  record.memory_plan = std::string(engine::memory_plan_name(o.step.memory_plan));
  record.measured = measured;
  record.predicted = o.predicted ? &*o.predicted : nullptr;
  record.calibration = o.calibration ? &*o.calibration : nullptr;
  record.max_batch = o.max_batch ? &*o.max_batch : nullptr;
  memory.analysis = to_json(record);
  out.memory = std::move(memory);
  return out;
}

}  // namespace dlprobe::memory
