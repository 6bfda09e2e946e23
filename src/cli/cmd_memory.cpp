// dlprobe memory: where a native training step's device memory goes (breakdown at the peak, the
// layer and phase of the peak, timeline, fragmentation, NVML reconciliation), predicted beside
// measured, and the largest batch under a limit.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/memory/analysis.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/results/results.h"
#include "dlprobe/results/writer.h"
#include "run_results.h"

namespace dlprobe::cli {
namespace {

using memory::Category;

struct MemoryFlags {
  std::string model = "resnet50";
  std::string batch = "32";
  std::string precision = "fp32";
  std::string mode = "train";
  std::string layout = "nchw";
  std::string optimizer = "sgd";
  std::int64_t image_size = 224;
  std::int64_t classes = 1000;
  std::string device = "cuda:0";
  std::string gpu_memory = "grow";
  std::int64_t warmup = 1;
  bool predict_only = false;
  std::string device_memory;
  std::string calibration;
  std::int64_t calibration_batch = 0;
  bool max_batch = false;
  std::string limit;
  std::string json;
  TuningFlags tuning;
  bool nondeterministic = false;
};

struct Options {
  engine::StepConfig base;  // batch, precision and memory plan filled per configuration
  std::vector<std::int64_t> batches;
  std::vector<engine::Precision> precisions;
  std::vector<memory::GpuMemoryOption> gpu_memory;
  memory::Device device;
  int warmup = 1;
  bool predict_only = false;
  std::optional<std::uint64_t> device_memory;
  std::optional<std::uint64_t> limit;
  std::vector<memory::Calibration> calibrations;  // from --calibration
  std::int64_t calibration_batch = 0;
  bool max_batch = false;
  Tuning tuning;
  bool deterministic = true;
  std::string json;
};

// Calibrations from an earlier run's results file: memory.analysis.calibration of each
// configuration that has one.
Result<std::vector<memory::Calibration>> read_calibrations(const std::string& path) {
  DLPROBE_ASSIGN_OR_RETURN(results::Document d, results::read_file(path));
  std::vector<memory::Calibration> out;
  for (std::size_t i = 0; i < d.configurations.size(); ++i) {
    const auto& m = d.configurations[i].memory;
    if (!m || !m->analysis.is_object()) continue;
    const auto it = m->analysis.find("calibration");
    if (it == m->analysis.end() || it->is_null()) continue;
    DLPROBE_ASSIGN_OR_RETURN(
        memory::Calibration c,
        memory::calibration_from_json(
            *it, fmt::format("{}: configurations[{}].memory.analysis.calibration", path, i)));
    out.push_back(std::move(c));
  }
  if (out.empty()) {
    return invalid_argument(fmt::format(
        "--calibration: {} holds no measured calibration (write one with dlprobe memory --json "
        "on a device)",
        path));
  }
  return out;
}

Result<Options> to_options(const MemoryFlags& f) {
  Options o;
  DLPROBE_ASSIGN_OR_RETURN(o.base.model.arch, model::parse_arch(f.model, "--model"));
  DLPROBE_ASSIGN_OR_RETURN(o.base.mode, for_flag("--mode", engine::parse_step_mode(f.mode)));
  DLPROBE_ASSIGN_OR_RETURN(o.base.layout, parse_layout(f.layout, "--layout"));
  DLPROBE_ASSIGN_OR_RETURN(o.base.optimizer,
                           for_flag("--optimizer", engine::parse_optimizer(f.optimizer)));
  if (f.image_size < 1) {
    return invalid_argument(fmt::format("--image-size: must be >= 1, got {}", f.image_size));
  }
  if (f.classes < 1) {
    return invalid_argument(fmt::format("--classes: must be >= 1, got {}", f.classes));
  }
  o.base.model.image_size = f.image_size;
  o.base.model.classes = f.classes;
  DLPROBE_ASSIGN_OR_RETURN(o.batches, parse_int_list(f.batch, "--batch"));
  for (std::int64_t b : o.batches) {
    if (b < 1) return invalid_argument(fmt::format("--batch: must be >= 1, got {}", b));
  }
  DLPROBE_ASSIGN_OR_RETURN(std::vector<std::string> precisions,
                           parse_list(f.precision, "--precision"));
  for (const std::string& p : precisions) {
    DLPROBE_ASSIGN_OR_RETURN(engine::Precision parsed,
                             for_flag("--precision", engine::parse_precision(p)));
    o.precisions.push_back(parsed);
  }
  DLPROBE_ASSIGN_OR_RETURN(std::vector<std::string> modes,
                           parse_list(f.gpu_memory, "--gpu-memory"));
  for (const std::string& m : modes) {
    DLPROBE_ASSIGN_OR_RETURN(memory::GpuMemoryOption g,
                             memory::parse_gpu_memory(m, "--gpu-memory"));
    o.gpu_memory.push_back(std::move(g));
  }
  if (f.warmup < 0 || f.warmup > 100) {
    return invalid_argument(fmt::format("--warmup: must be in [0, 100], got {}", f.warmup));
  }
  o.warmup = static_cast<int>(f.warmup);
  o.predict_only = f.predict_only;
  o.max_batch = f.max_batch;
  if (!f.device_memory.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(o.device_memory, parse_size(f.device_memory, "--device-memory"));
    if (!o.predict_only) {
      return invalid_argument(
          "--device-memory: describes a GPU you do not have, for --predict-only; on a device, "
          "give --limit to simulate a smaller one");
    }
  }
  if (!f.limit.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(o.limit, parse_size(f.limit, "--limit"));
    if (*o.limit == 0) return invalid_argument("--limit: must be more than 0");
  }
  if (o.max_batch) {
    if (!o.predict_only && !o.limit) {
      return invalid_argument("--max-batch: give --limit SIZE, the memory the process must fit");
    }
    if (o.predict_only && !o.limit && !o.device_memory) {
      return invalid_argument("--max-batch --predict-only: give --device-memory SIZE");
    }
    for (const auto& g : o.gpu_memory) {
      if (g.allocator.mode != memory::Mode::growth) {
        return invalid_argument(fmt::format(
            "--gpu-memory {}: --max-batch searches under --limit; use grow or planned", g.text));
      }
    }
  } else if (o.limit) {
    return invalid_argument("--limit: only with --max-batch (else use --gpu-memory limit:SIZE)");
  }
  if (!f.calibration.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(o.calibrations, read_calibrations(f.calibration));
  }
  if (f.calibration_batch < 0) {
    return invalid_argument(
        fmt::format("--calibration-batch: must be >= 1, got {}", f.calibration_batch));
  }
  o.calibration_batch = f.calibration_batch;
  if (!o.predict_only) {
    DLPROBE_ASSIGN_OR_RETURN(o.device, memory::parse_device(f.device, "--device"));
  }
  DLPROBE_ASSIGN_OR_RETURN(o.tuning, tuning_options(f.tuning));
  o.deterministic = !f.nondeterministic;
  o.json = f.json;
  return o;
}

std::string size(std::int64_t bytes) {
  return bytes < 0 ? "-" + format_size(static_cast<std::uint64_t>(-bytes))
                   : format_size(static_cast<std::uint64_t>(bytes));
}

std::string percent_error(std::int64_t predicted, std::int64_t measured) {
  if (measured <= 0) return "n/a";
  return fmt::format("{:+.1f} %", 100.0 * static_cast<double>(predicted - measured) /
                                      static_cast<double>(measured));
}

engine::StepConfig config_for(const Options& o, std::int64_t batch, engine::Precision p,
                              const memory::GpuMemoryOption& g) {
  engine::StepConfig c = o.base;
  c.batch = batch;
  c.precision = p;
  c.memory_plan = g.planned ? engine::MemoryPlan::planned : engine::MemoryPlan::dynamic;
  return c;
}

std::string describe(const engine::StepConfig& c, const memory::GpuMemoryOption& g) {
  return fmt::format("{} bs{} {} {} {} {}, --gpu-memory {}", model::arch_name(c.model.arch),
                     c.batch, engine::precision_name(c.precision), engine::step_mode_name(c.mode),
                     layout_name(c.layout),
                     c.mode == engine::StepMode::train ? engine::optimizer_name(c.optimizer)
                                                       : std::string_view("no optimizer"),
                     g.text);
}

const memory::Calibration* find_calibration(const std::vector<memory::Calibration>& all,
                                            const engine::StepConfig& c) {
  for (const auto& cal : all) {
    if (cal.model == model::arch_name(c.model.arch) &&
        cal.precision == engine::precision_name(c.precision)) {
      return &cal;
    }
  }
  return nullptr;
}

// The breakdown at the peak, measured beside predicted where both exist.
void print_breakdown(const memory::StepMemory* measured, const memory::Prediction* predicted,
                     const memory::Reconciliation* reconciliation) {
  const memory::StepMemory& main = measured != nullptr ? *measured : predicted->step;
  const bool both = measured != nullptr && predicted != nullptr;
  auto line = [&](std::string_view name, std::int64_t m, std::optional<std::int64_t> p) {
    if (both && p) {
      std::printf("  %-26s %12s   predicted %12s\n", std::string(name).c_str(), size(m).c_str(),
                  size(*p).c_str());
    } else {
      std::printf("  %-26s %12s\n", std::string(name).c_str(), size(m).c_str());
    }
  };
  std::printf("peak        %s allocated%s at %s, %s (call %zu: %s)\n",
              size(main.peak.allocated_bytes).c_str(), measured != nullptr ? "" : " (predicted)",
              main.peak_layer.c_str(), std::string(memory::phase_name(main.peak_phase)).c_str(),
              main.peak_call, main.peak_call_name.c_str());
  for (Category c : memory::kAllCategories) {
    if (main.peak[c] == 0 && (predicted == nullptr || predicted->step.peak[c] == 0)) continue;
    std::optional<std::int64_t> p;
    if (predicted != nullptr) p = predicted->step.peak[c];
    std::string name(memory::category_name(c));
    if (c == Category::arena) name = "arena (unused here)";
    line(name, main.peak[c], p);
  }
  line("= allocated", main.peak.allocated_bytes,
       predicted != nullptr ? std::optional(predicted->step.peak.allocated_bytes) : std::nullopt);
  if (reconciliation != nullptr) {
    line("CUDA context + libraries",
         reconciliation->nvml_process_bytes - reconciliation->reserved_bytes, std::nullopt);
  } else if (predicted != nullptr && predicted->outside_allocator_bytes && measured == nullptr) {
    line("CUDA context + libraries", *predicted->outside_allocator_bytes, std::nullopt);
  }
  if (both) {
    std::printf("  %-26s %12s\n", "prediction error",
                percent_error(predicted->step.peak.allocated_bytes, measured->peak.allocated_bytes)
                    .c_str());
  }
  std::printf("reserved    %s at the peak, %s at most\n", size(main.peak.reserved_bytes).c_str(),
              size(main.reserved_peak_bytes).c_str());
  std::printf("waste       %s at the peak (allocated - requested: rounding, unsplit remainders)\n",
              size(main.peak.waste_bytes()).c_str());
  std::printf("fragmentation %.3f at the peak (1 - largest free block / free cache: %s of %s)\n",
              main.peak.fragmentation(), size(main.peak.largest_free_block_bytes).c_str(),
              size(main.peak.reserved_bytes - main.peak.allocated_bytes).c_str());
  if (main.arena) {
    std::printf("arena       %s planned; no layout can be under %s (most bytes live at one call)\n",
                format_size(main.arena->bytes).c_str(),
                format_size(main.arena->peak_live_bytes).c_str());
  }
  if (predicted != nullptr && predicted->workspace_bytes > 0) {
    std::printf("workspace   predicted from the calibration's %s (%s)\n",
                size(predicted->workspace_bytes).c_str(),
                predicted->workspace_model == "per call"
                    ? "each call's own, measured at the calibration batch"
                    : "its peak held through the step: the calibration ran another call list");
  }
  if (predicted != nullptr) {
    if (predicted->outside_allocator_bytes) {
      std::printf("predicted   %s for the process (reserved %s + %s outside the allocator)\n",
                  size(*predicted->process_bytes()).c_str(),
                  size(predicted->step.reserved_peak_bytes).c_str(),
                  size(*predicted->outside_allocator_bytes).c_str());
    } else if (measured == nullptr && !predicted->calibrated) {
      std::printf(
          "predicted   without a calibration: the allocator's own categories only (no workspace, "
          "no CUDA context or libraries); give --calibration FILE from a run on a GPU\n");
    } else if (measured == nullptr) {
      std::printf(
          "predicted   the allocator's figures only: the calibration has no NVML figure for what "
          "the process holds outside the allocator (it did not run on a GPU)\n");
    }
  }
  if (reconciliation != nullptr) {
    const memory::Reconciliation& r = *reconciliation;
    std::printf(
        "NVML        %s for this process%s = %s reserved by the allocator + %s CUDA context and "
        "library handles (at start-up) + %s loaded since (kernels on first launch, library "
        "buffers)\n",
        size(r.nvml_process_bytes).c_str(),
        r.nvml_source == "device" ? " (device-wide: NVML does not list our pid)" : "",
        size(r.reserved_bytes).c_str(), size(r.context_bytes).c_str(),
        size(r.lazy_bytes()).c_str());
  }
}

results::Configuration configuration_of(const engine::StepConfig& c,
                                        const memory::GpuMemoryOption& g,
                                        const std::string& device) {
  results::Configuration out;
  out.kind = results::Kind::native;
  out.settings.model = std::string(model::arch_name(c.model.arch));
  out.settings.batch = c.batch;
  out.settings.precision = std::string(engine::precision_name(c.precision));
  out.settings.mode = std::string(engine::step_mode_name(c.mode));
  out.settings.layout = std::string(layout_name(c.layout));
  out.settings.device = device;
  out.settings.optimizer = c.mode == engine::StepMode::train
                               ? std::string(engine::optimizer_name(c.optimizer))
                               : std::string("none");
  out.settings.gpu_memory = g.text;
  return out;
}

class MemoryCommand {
 public:
  explicit MemoryCommand(Options o) : o_(std::move(o)) {}

  int run() {
    if (!o_.json.empty()) {
      std::shared_ptr<nvml::Library> nvml;
      if (!o_.predict_only && o_.device.backend == memory::BackendKind::cuda) {
        if (auto lib = nvml::Library::open()) nvml = std::move(lib).value();
      }
      auto writer = results::ResultsWriter::create(o_.json, run_context(command_line(), nvml));
      if (!writer) return report_error(writer.status().with_context("--json"));
      writer_ = std::make_unique<results::ResultsWriter>(std::move(writer).value());
    }
    const Status s = o_.predict_only ? (o_.max_batch ? predict_max_batches() : predict_all())
                                     : (o_.max_batch ? measure_max_batches() : measure_all());
    if (!s.is_ok()) return report_error(s);
    return failures_ > 0 ? kExitFailure : kExitOk;
  }

 private:
  static std::vector<std::string> command_line() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> out;
    std::string arg;
    while (std::getline(in, arg, '\0')) out.push_back(arg);
    return out;
  }

  Status add(results::Configuration c) {
    if (!writer_) return Status::ok();
    return writer_->add(std::move(c)).with_context("--json");
  }

  std::string device_setting() const {
    return o_.predict_only ? std::string("predicted") : memory::device_name(o_.device);
  }

  Status predict_all() {
    for (const auto& g : o_.gpu_memory) {
      for (engine::Precision p : o_.precisions) {
        for (std::int64_t b : o_.batches) {
          const engine::StepConfig c = config_for(o_, b, p, g);
          const memory::Calibration* cal = find_calibration(o_.calibrations, c);
          if (!o_.calibrations.empty() && cal == nullptr) {
            return invalid_argument(fmt::format("--calibration has no run of {} {}",
                                                model::arch_name(c.model.arch),
                                                engine::precision_name(p)));
          }
          Result<memory::Prediction> predicted =
              memory::predict(c, cal, g.allocator, o_.device_memory.value_or(0));
          if (!predicted && predicted.status().code() == Errc::out_of_memory) {
            DLPROBE_RETURN_IF_ERROR(report_failed(c, g, predicted.status()));
            continue;
          }
          if (!predicted) return predicted.status().with_context(describe(c, g));
          const memory::Prediction& pred = *predicted;
          std::printf("== %s, predicted%s\n", describe(c, g).c_str(),
                      cal != nullptr
                          ? fmt::format(" (calibration: {} bs{})", cal->device, cal->batch).c_str()
                          : "");
          print_breakdown(nullptr, &pred, nullptr);
          if (o_.device_memory) {
            const std::int64_t need = pred.process_bytes().value_or(pred.step.reserved_peak_bytes);
            std::printf("fits        %s in %s\n",
                        static_cast<std::uint64_t>(need) <= *o_.device_memory ? "yes" : "no",
                        format_size(*o_.device_memory).c_str());
          }
          results::Configuration conf = configuration_of(c, g, device_setting());
          results::Memory m;
          m.source = "prediction";
          m.allocator_stats = nullptr;
          memory::AnalysisRecord record;
          record.gpu_memory = g.text;
          record.memory_plan = std::string(engine::memory_plan_name(c.memory_plan));
          record.predicted = &pred;
          record.calibration = cal;
          m.analysis = memory::to_json(record);
          conf.memory = std::move(m);
          DLPROBE_RETURN_IF_ERROR(add(std::move(conf)));
        }
        if (o_.device_memory) {
          const engine::StepConfig c = config_for(o_, 1, p, g);
          DLPROBE_ASSIGN_OR_RETURN(std::int64_t largest,
                                   memory::predict_max_batch(c, *o_.device_memory,
                                                             find_calibration(o_.calibrations, c)));
          std::printf("largest batch predicted to fit %s: %lld (%s, --gpu-memory %s)\n",
                      format_size(*o_.device_memory).c_str(), static_cast<long long>(largest),
                      std::string(engine::precision_name(p)).c_str(), g.text.c_str());
        }
      }
    }
    return Status::ok();
  }

  Status predict_max_batches() {
    const std::uint64_t limit = o_.limit.value_or(o_.device_memory.value_or(0));
    for (const auto& g : o_.gpu_memory) {
      for (engine::Precision p : o_.precisions) {
        const engine::StepConfig c = config_for(o_, 1, p, g);
        const memory::Calibration* cal = find_calibration(o_.calibrations, c);
        DLPROBE_ASSIGN_OR_RETURN(std::int64_t largest, memory::predict_max_batch(c, limit, cal));
        std::printf("largest batch predicted to fit %s: %lld (%s %s, --gpu-memory %s%s)\n",
                    format_size(limit).c_str(), static_cast<long long>(largest),
                    std::string(model::arch_name(c.model.arch)).c_str(),
                    std::string(engine::precision_name(p)).c_str(), g.text.c_str(),
                    cal != nullptr ? "" : "; no calibration: allocator categories only");
      }
    }
    return Status::ok();
  }

  Result<std::unique_ptr<memory::Session>> open_session(const memory::AllocatorOptions& a) {
    memory::SessionOptions so;
    so.device = o_.device;
    so.allocator = a;
    so.conv_algo = o_.tuning.algo;
    so.tuning = o_.tuning.cache;
    so.deterministic = o_.deterministic;
    return memory::Session::open(so);
  }

  // One configuration measured, with its prediction from `calibration`.
  Status report_measured(const engine::StepConfig& c, const memory::GpuMemoryOption& g,
                         memory::Session& session, const memory::Measurement& m,
                         const memory::Calibration& calibration) {
    std::uint64_t device_bytes = 0;
    if (auto info = session.allocator().source().memory_info()) device_bytes = info->total_bytes;
    // Predicted as the device runs it; a prediction that does not fit where the run did is a
    // result too, shown with the growth-mode figures.
    Result<memory::Prediction> predicted =
        memory::predict(c, &calibration, session.allocator().options(), device_bytes);
    if (!predicted && predicted.status().code() == Errc::out_of_memory) {
      std::printf("(predicted not to fit: %s)\n", predicted.status().message().c_str());
      predicted = memory::predict(c, &calibration);
    }
    if (!predicted) return predicted.status().with_context(describe(c, g));
    const memory::Prediction& pred = *predicted;
    std::printf("== %s, %s%s\n", describe(c, g).c_str(), session.device_name().c_str(),
                calibration.batch == c.batch ? ", the calibration run" : "");
    print_breakdown(&m.memory, &pred, m.reconciliation ? &*m.reconciliation : nullptr);
    rows_.push_back(
        {c, g.text, pred.step.peak.allocated_bytes, m.memory.peak.allocated_bytes,
         m.memory.reserved_peak_bytes,
         m.reconciliation ? std::optional(m.reconciliation->nvml_process_bytes) : std::nullopt,
         calibration.batch == c.batch});
    results::Configuration conf = configuration_of(c, g, memory::device_name(o_.device));
    results::Memory mem;
    mem.source = "allocator";
    mem.allocator_stats = memory::to_flat_json(m.stats);
    if (m.reconciliation) mem.nvml_process_peak_bytes = m.reconciliation->nvml_process_bytes;
    memory::AnalysisRecord record;
    record.gpu_memory = g.text;
    record.memory_plan = std::string(engine::memory_plan_name(c.memory_plan));
    record.measured = &m;
    record.predicted = &pred;
    record.calibration = &calibration;
    mem.analysis = memory::to_json(record);
    conf.memory = std::move(mem);
    return add(std::move(conf));
  }

  Status report_failed(const engine::StepConfig& c, const memory::GpuMemoryOption& g,
                       const Status& why) {
    std::printf("== %s: %s\n", describe(c, g).c_str(), why.message().c_str());
    ++failures_;
    results::Configuration conf = configuration_of(c, g, device_setting());
    conf.status =
        why.code() == Errc::out_of_memory ? results::RunStatus::oom : results::RunStatus::failed;
    conf.error = why.message();
    return add(std::move(conf));
  }

  Status measure_all() {
    for (const auto& g : o_.gpu_memory) {
      DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<memory::Session> session, open_session(g.allocator));
      for (engine::Precision p : o_.precisions) {
        const std::int64_t cal_batch =
            o_.calibration_batch > 0 ? o_.calibration_batch
                                     : *std::min_element(o_.batches.begin(), o_.batches.end());
        const engine::StepConfig cal_config = config_for(o_, cal_batch, p, g);
        std::fprintf(stderr, "dlprobe memory: calibrating at %s\n",
                     describe(cal_config, g).c_str());
        Result<memory::Measurement> cal = session->measure(cal_config, o_.warmup);
        if (!cal) {
          DLPROBE_RETURN_IF_ERROR(report_failed(cal_config, g, cal.status()));
          continue;
        }
        const memory::Calibration* given = find_calibration(o_.calibrations, cal_config);
        const memory::Calibration calibration = given != nullptr ? *given : cal->calibration;
        for (std::int64_t b : o_.batches) {
          const engine::StepConfig c = config_for(o_, b, p, g);
          if (b == cal_batch) {
            DLPROBE_RETURN_IF_ERROR(report_measured(c, g, *session, *cal, calibration));
            continue;
          }
          std::fprintf(stderr, "dlprobe memory: measuring %s\n", describe(c, g).c_str());
          Result<memory::Measurement> m = session->measure(c, o_.warmup);
          if (!m) {
            DLPROBE_RETURN_IF_ERROR(report_failed(c, g, m.status()));
            continue;
          }
          DLPROBE_RETURN_IF_ERROR(report_measured(c, g, *session, *m, calibration));
        }
      }
    }
    print_summary();
    return Status::ok();
  }

  void print_summary() const {
    if (rows_.size() < 2) return;
    std::printf("\n%-10s %6s %-10s %-20s %12s %12s %8s %12s %12s\n", "model", "batch", "precision",
                "gpu-memory", "predicted", "measured", "error", "reserved", "NVML");
    for (const Row& r : rows_) {
      std::printf("%-10s %6lld %-10s %-20s %12s %12s %8s %12s %12s%s\n",
                  std::string(model::arch_name(r.config.model.arch)).c_str(),
                  static_cast<long long>(r.config.batch),
                  std::string(engine::precision_name(r.config.precision)).c_str(),
                  r.gpu_memory.c_str(), size(r.predicted).c_str(), size(r.measured).c_str(),
                  percent_error(r.predicted, r.measured).c_str(), size(r.reserved).c_str(),
                  r.nvml ? size(*r.nvml).c_str() : "-", r.calibration ? "  (calibration)" : "");
    }
  }

  Status measure_max_batches() {
    memory::AllocatorOptions limited;
    limited.mode = memory::Mode::limit;
    limited.limit_bytes = *o_.limit;
    DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<memory::Session> session, open_session(limited));
    struct Found {
      engine::Precision precision;
      std::string gpu_memory;
      std::int64_t batch;
    };
    std::vector<Found> found;
    for (const auto& g : o_.gpu_memory) {
      for (engine::Precision p : o_.precisions) {
        // The calibration (workspace, what the process holds outside the allocator) from one
        // measured step under the limit; batch 1 when the chosen one does not fit.
        std::int64_t cal_batch = o_.calibration_batch > 0 ? o_.calibration_batch : 32;
        engine::StepConfig c = config_for(o_, cal_batch, p, g);
        std::fprintf(stderr, "dlprobe memory: calibrating at %s\n", describe(c, g).c_str());
        Result<memory::Measurement> cal = session->measure(c, o_.warmup);
        if (!cal && cal.status().code() == Errc::out_of_memory && cal_batch > 1) {
          c.batch = cal_batch = 1;
          cal = session->measure(c, o_.warmup);
        }
        if (!cal) {
          DLPROBE_RETURN_IF_ERROR(report_failed(c, g, cal.status()));
          continue;
        }
        const memory::Calibration* given = find_calibration(o_.calibrations, c);
        const memory::Calibration calibration = given != nullptr ? *given : cal->calibration;
        DLPROBE_ASSIGN_OR_RETURN(
            memory::MaxBatchResult r,
            memory::find_max_batch(*session, c, *o_.limit, &calibration, 1 << 16, o_.warmup));
        print_max_batch(c, g, r);
        found.push_back({p, g.text, r.found});
        if (!r.at_found) continue;
        results::Configuration conf =
            configuration_of(r.at_found->step, g, memory::device_name(o_.device));
        results::Memory mem;
        mem.source = "allocator";
        mem.allocator_stats = memory::to_flat_json(r.at_found->stats);
        if (r.at_found->reconciliation) {
          mem.nvml_process_peak_bytes = r.at_found->reconciliation->nvml_process_bytes;
        }
        memory::AnalysisRecord record;
        record.gpu_memory = g.text;
        record.memory_plan = std::string(engine::memory_plan_name(c.memory_plan));
        record.measured = &*r.at_found;
        record.max_batch = &r;
        mem.analysis = memory::to_json(record);
        conf.memory = std::move(mem);
        DLPROBE_RETURN_IF_ERROR(add(std::move(conf)));
      }
    }
    if (found.size() > 1 && found.front().batch > 0) {
      std::printf("\nlargest batch under %s, measured:\n", format_size(*o_.limit).c_str());
      for (const Found& f : found) {
        std::printf("  %-6s --gpu-memory %-10s %6lld  (%+.1f %% against %s %s)\n",
                    std::string(engine::precision_name(f.precision)).c_str(), f.gpu_memory.c_str(),
                    static_cast<long long>(f.batch),
                    100.0 * static_cast<double>(f.batch - found.front().batch) /
                        static_cast<double>(found.front().batch),
                    std::string(engine::precision_name(found.front().precision)).c_str(),
                    found.front().gpu_memory.c_str());
      }
    }
    return Status::ok();
  }

  void print_max_batch(const engine::StepConfig& c, const memory::GpuMemoryOption& g,
                       const memory::MaxBatchResult& r) {
    std::printf("== max batch under %s: %s %s, --gpu-memory %s\n",
                format_size(r.limit_bytes).c_str(),
                std::string(model::arch_name(c.model.arch)).c_str(),
                std::string(engine::precision_name(c.precision)).c_str(), g.text.c_str());
    std::printf("predicted   %lld\n", static_cast<long long>(r.predicted));
    for (const memory::MaxBatchTrial& t : r.trials) {
      if (t.fits) {
        std::printf(
            "  batch %6lld fits: peak %s allocated, %s reserved%s\n",
            static_cast<long long>(t.batch), size(*t.peak_allocated_bytes).c_str(),
            size(*t.reserved_peak_bytes).c_str(),
            t.nvml_process_bytes
                ? fmt::format(", NVML {} for the process", size(*t.nvml_process_bytes)).c_str()
                : "");
      } else {
        std::printf("  batch %6lld does not fit: %s\n", static_cast<long long>(t.batch),
                    t.why.c_str());
      }
    }
    std::optional<std::int64_t> nvml_most;
    for (const memory::MaxBatchTrial& t : r.trials) {
      if (t.fits && t.nvml_process_bytes) {
        nvml_most = std::max(nvml_most.value_or(0), *t.nvml_process_bytes);
      }
    }
    if (nvml_most) {
      std::printf("NVML        at most %s for the process in the runs that fit (limit %s)\n",
                  size(*nvml_most).c_str(), format_size(r.limit_bytes).c_str());
    }
    std::printf("found       %lld (measured: it runs a full training step%s)\n",
                static_cast<long long>(r.found),
                r.next_fails ? fmt::format(", {} does not", r.found + 1).c_str()
                             : ", at the search's upper bound");
    if (r.found == 0) ++failures_;
  }

  struct Row {
    engine::StepConfig config;
    std::string gpu_memory;
    std::int64_t predicted;
    std::int64_t measured;
    std::int64_t reserved;
    std::optional<std::int64_t> nvml;
    bool calibration;
  };

  Options o_;
  std::unique_ptr<results::ResultsWriter> writer_;
  std::vector<Row> rows_;
  int failures_ = 0;
};

}  // namespace

Command add_memory_command(CLI::App& app) {
  auto flags = std::make_shared<MemoryFlags>();
  CLI::App* sub = app.add_subcommand(
      "memory",
      "Where a native training step's device memory goes: breakdown at the peak by category, the "
      "layer and phase of the peak, timeline, fragmentation, NVML reconciliation; predicted "
      "beside measured; the largest batch under a limit (--max-batch)");
  sub->add_option("--model", flags->model, "resnet18, resnet34, resnet50, resnet101, resnet152")
      ->capture_default_str();
  sub->add_option("--batch", flags->batch, "Batch sizes, e.g. 32,64,128")->capture_default_str();
  sub->add_option("--precision", flags->precision,
                  "fp32, tf32, fp16, bf16, fp64 (cpu only); a list, e.g. fp32,fp16")
      ->capture_default_str();
  sub->add_option("--mode", flags->mode, "train, grads or infer")->capture_default_str();
  sub->add_option("--layout", flags->layout, "nchw or nhwc")->capture_default_str();
  sub->add_option("--optimizer", flags->optimizer, "sgd or adamw")->capture_default_str();
  sub->add_option("--image-size", flags->image_size, "Square image side")->capture_default_str();
  sub->add_option("--classes", flags->classes, "Output classes")->capture_default_str();
  sub->add_option("--device", flags->device, "cpu, cpu:onednn, cuda or cuda:N")
      ->capture_default_str();
  sub->add_option("--gpu-memory", flags->gpu_memory,
                  "grow, prealloc[:FRACTION|SIZE], limit:SIZE, planned, planned+MODE; a list "
                  "compares them, e.g. grow,planned")
      ->capture_default_str();
  sub->add_option("--warmup", flags->warmup, "Steps before the one followed")
      ->capture_default_str();
  sub->add_flag("--predict-only", flags->predict_only,
                "Predict without a device (from the plan over the allocator's policy)");
  sub->add_option("--device-memory", flags->device_memory,
                  "With --predict-only: the memory of the GPU to predict for, e.g. 16GiB");
  sub->add_option("--calibration", flags->calibration,
                  "A results file of an earlier dlprobe memory run on a GPU: its workspace and "
                  "CUDA context figures go into the prediction");
  sub->add_option("--calibration-batch", flags->calibration_batch,
                  "The batch measured first, whose workspace and context figures predict the "
                  "others (default: the smallest of --batch; 32 for --max-batch)");
  sub->add_flag("--max-batch", flags->max_batch,
                "Find the largest batch that completes a training step under --limit: "
                "predicted, then verified by measured runs");
  sub->add_option("--limit", flags->limit,
                  "With --max-batch: the memory the whole process must fit, e.g. 16GiB");
  sub->add_option("--json", flags->json, "Write the results file (dlprobe.results/1) here");
  add_tuning_flags(*sub, flags->tuning);
  sub->add_flag("--nondeterministic", flags->nondeterministic,
                "CUDA: let non-deterministic convolution engines compete");
  return {sub, [flags] {
            Result<Options> options = to_options(*flags);
            if (!options.has_value()) return report_error(options.status());
            return MemoryCommand(std::move(options).value()).run();
          }};
}

}  // namespace dlprobe::cli
