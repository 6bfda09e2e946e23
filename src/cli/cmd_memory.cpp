// dlprobe memory: where a native training step's device memory goes (breakdown at the peak, the
// layer and phase of the peak, timeline, fragmentation, NVML reconciliation), predicted beside
// measured, and the largest batch under a limit. The runs are memory::run_analysis(); this reads
// the flags and prints what comes out.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/core/command_line.h"
#include "dlprobe/core/host_memory.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/units.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/fastest_settings.h"
#include "dlprobe/doctor/versions.h"
#include "dlprobe/memory/analysis_json.h"
#include "dlprobe/memory/analysis_runs.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/results/writer.h"
#include "dlprobe/run/results.h"
#include "history_flags.h"
#include "memory_text.h"

namespace dlprobe::cli {
namespace {

// What `dlprobe --help` and `dlprobe memory --help` say the command does.
constexpr const char* kMemoryAbout =
    "Where a native training step's device memory goes: breakdown at the peak by category, the "
    "layer and phase of the peak, timeline, fragmentation, NVML reconciliation; predicted "
    "beside measured; the largest batch under a limit (--max-batch)";

struct MemoryFlags {
  WorkloadFlags workload;
  std::string batch = "32";
  ShapeFlags shape;
  DeviceFlags where;
  std::string gpu_memory = "auto";
  std::int64_t warmup = 1;
  bool predict_only = false;
  std::string device_memory;
  std::string calibration;
  std::int64_t calibration_batch = 0;  // read only when given; else the analysis picks one
  bool calibration_batch_given = false;
  std::vector<std::string> cuda_only;  // options only the CUDA backend reads, given
  // Options only a measurement reads, given: --predict-only refuses them.
  std::vector<std::string> measured_only;
  bool max_batch = false;
  std::string limit;
  std::string json;
  bool overwrite = false;
  TuningFlags tuning;
  std::string conv_engines = "deterministic";
  std::string recompute = "none";
  HistoryFlags history;
};

Status check_calibrations(const memory::AnalysisOptions& a, const std::string& file) {
  if (a.calibrations.empty()) {
    return invalid_argument(fmt::format(
        "--calibration: {} holds no measured calibration (write one with dlprobe memory --json "
        "on a device)",
        file));
  }
  // Predicting the batches without a device, the file is all there is to go on.
  if (a.session || a.max_batch_limit) return Status::ok();
  for (engine::StepConfig c = a.base; engine::Precision p : a.precisions) {
    c.precision = p;
    if (find_calibration(a.calibrations, c) == nullptr) {
      return invalid_argument(fmt::format("--calibration has no run of {} {}",
                                          model::model_name(c.model), engine::precision_name(p)));
    }
  }
  return Status::ok();
}

Result<memory::AnalysisOptions> to_options(const MemoryFlags& f) {
  memory::AnalysisOptions a;
  DLPROBE_ASSIGN_OR_RETURN(a.base.model.arch, model::parse_arch(f.workload.model, "--model"));
  DLPROBE_ASSIGN_OR_RETURN(a.base.mode,
                           for_flag("--mode", engine::parse_step_mode(f.workload.mode)));
  if (f.workload.layout != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(a.layout, parse_layout(f.workload.layout, "--layout"));
  }
  DLPROBE_ASSIGN_OR_RETURN(a.base.optimizer,
                           workload_optimizer(f.workload, a.base.mode == engine::StepMode::train));
  if (f.predict_only && !f.measured_only.empty()) {
    return invalid_argument(
        fmt::format("--predict-only measures nothing: leave out {} (only a measurement reads {})",
                    fmt::join(f.measured_only, ", "), f.measured_only.size() == 1 ? "it" : "them"));
  }
  DLPROBE_RETURN_IF_ERROR(parse_shape(f.shape, a.base.model));
  // The lists as bench reads them: an item given twice is refused, not measured twice.
  DLPROBE_ASSIGN_OR_RETURN(a.batches,
                           parse_each<std::int64_t>(f.batch, "--batch", [](const std::string& s) {
                             return parse_int(s, "--batch", 1, 1LL << 40);
                           }));
  DLPROBE_ASSIGN_OR_RETURN(
      a.precisions,
      parse_each<engine::Precision>(f.workload.precision, "--precision", [](const std::string& s) {
        return for_flag("--precision", engine::parse_precision(s));
      }));
  if (f.gpu_memory != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(
        a.gpu_memory,
        parse_each<memory::GpuMemoryOption>(f.gpu_memory, "--gpu-memory", [](const std::string& s) {
          return memory::parse_gpu_memory(s, "--gpu-memory");
        }));
  }
  a.warmup = static_cast<int>(f.warmup);
  if (!f.device_memory.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(a.device_bytes, parse_size(f.device_memory, "--device-memory"));
    if (!f.predict_only) {
      return invalid_argument(
          "--device-memory: describes a GPU you do not have, for --predict-only; on a device, "
          "give --limit to simulate a smaller one");
    }
  }
  std::optional<std::uint64_t> limit;
  if (!f.limit.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(limit, parse_size(f.limit, "--limit"));
    if (*limit == 0) return invalid_argument("--limit: must be more than 0");
  }
  if (f.max_batch) {
    if (!f.predict_only && !limit) {
      return invalid_argument("--max-batch: give --limit SIZE, the memory the process must fit");
    }
    if (f.predict_only && !limit && !a.device_bytes) {
      return invalid_argument("--max-batch --predict-only: give --device-memory SIZE");
    }
    if (limit && a.device_bytes && *limit > *a.device_bytes) {
      return invalid_argument(fmt::format("--limit: {} is more than the --device-memory {}",
                                          format_size(*limit), format_size(*a.device_bytes)));
    }
    for (const auto& g : a.gpu_memory) {
      if (g.allocator.mode != memory::Mode::growth) {
        return invalid_argument(fmt::format(
            "--gpu-memory {}: --max-batch searches under --limit; use grow or planned", g.text));
      }
    }
    a.max_batch_limit = limit ? limit : a.device_bytes;
  } else if (limit) {
    return invalid_argument("--limit: only with --max-batch (else use --gpu-memory limit:SIZE)");
  }
  a.calibration_batch = f.calibration_batch_given ? f.calibration_batch : 0;
  DLPROBE_ASSIGN_OR_RETURN(const Tuning tuning, tuning_options(f.tuning));
  DLPROBE_ASSIGN_OR_RETURN(const device::ConvEngines engines,
                           for_flag("--conv-engines", device::parse_conv_engines(f.conv_engines)));
  // The CUDA backend runs batch norm inside the convolutions only where non-deterministic engines
  // may compete (CudaBackend::fuses_conv_batch_norm); a prediction without a device plans the
  // step the device would run under the same flag.
  a.base.fuse_conv = engines == device::ConvEngines::any;
  DLPROBE_RETURN_IF_ERROR(parse_recompute(f.recompute, a.base));
  if (!f.predict_only) {
    memory::SessionOptions& so = a.session.emplace();
    DLPROBE_ASSIGN_OR_RETURN(const DeviceChoice where, noted_device_choice(f.where, "memory"));
    warn_cuda_only("memory", where.backend, f.cuda_only);
    // On the CPU the search runs in this machine's memory: a larger limit would answer for memory
    // it does not have.
    if (where.device.kind == DeviceKind::cpu && a.max_batch_limit) {
      const std::optional<std::uint64_t> host = host_memory_available();
      if (host && *a.max_batch_limit > *host) {
        return invalid_argument(
            fmt::format("--limit: {} is more than the {} this machine has available (--device cpu)",
                        format_size(*a.max_batch_limit), format_size(*host)));
      }
    }
    so.device = where.device;
    so.backend = where.backend;
    so.conv.algo = tuning.algo;
    so.conv.tuning = tuning.cache;
    so.conv.engines = engines;
  }
  if (!f.calibration.empty()) {
    Result<std::vector<memory::Calibration>> read = memory::read_calibrations(f.calibration);
    if (!read) return read.status().with_context("--calibration");
    a.calibrations = std::move(read).value();
    DLPROBE_RETURN_IF_ERROR(check_calibrations(a, f.calibration));
  }
  return a;
}

// Prints each configuration as it comes, keeps the results file current and the history's copy.
class Printer final : public memory::AnalysisObserver {
 public:
  // `predict_only`: the predictions are the answer, and a largest batch of none fails the command
  // as a measured one does; otherwise the measurement that follows each prediction decides.
  // `interrupt`: the guard's count; once it is not 0, the analysis stops after the configuration
  // being measured.
  Printer(std::optional<std::uint64_t> device_bytes, bool predict_only,
          std::unique_ptr<results::ResultsWriter> writer, results::Context context,
          const std::atomic<int>* interrupt)
      : device_bytes_(device_bytes),
        predict_only_(predict_only),
        interrupt_(interrupt),
        writer_(std::move(writer)),
        document_{std::move(context), {}, {}} {}

  void measuring(const engine::StepConfig& c, const memory::GpuMemoryOption& g,
                 bool calibrating) override {
    std::fprintf(stderr, "dlprobe memory: %s %s\n", calibrating ? "calibrating at" : "measuring",
                 describe(c, g).c_str());
  }

  Status finished(const memory::Outcome& o) override {
    print_outcome(o, device_bytes_);
    summary_.add(o);
    if (!o.failure.is_ok() || (o.max_batch && o.max_batch->found == 0)) ++failures_;
    std::optional<results::Configuration> record = memory::results_record(o);
    if (record) document_.configurations.push_back(*record);
    if (writer_ && record) {
      DLPROBE_RETURN_IF_ERROR(writer_->add(std::move(record).value()).with_context("--json"));
    }
    if (interrupt_ != nullptr && interrupt_->load() > 0) {
      interrupted_ = true;
      // Any error ends the analysis; run() tells this one from a failure by interrupted().
      return error(Errc::internal, "interrupted");
    }
    return Status::ok();
  }

  bool interrupted() const { return interrupted_; }

  void predicted(const memory::PredictedMaxBatch& r) override {
    print_predicted_max_batch(r);
    if (predict_only_ && r.largest == 0) ++failures_;
  }

  // Prints the summary, adds what was measured to the history (a prediction is no measurement),
  // gives standard output its file if asked.
  int end(const HistoryFlags& history) const {
    summary_.print();
    if (!predict_only_) store_in_history(history, document_);
    if (writer_) {
      if (Status s = writer_->finish(); !s) return report_error(s.with_context("--json"));
    }
    return failures_ > 0 ? kExitFailure : kExitOk;
  }

 private:
  std::optional<std::uint64_t> device_bytes_;
  bool predict_only_;
  const std::atomic<int>* interrupt_;
  bool interrupted_ = false;
  std::unique_ptr<results::ResultsWriter> writer_;
  results::Document document_;
  MemorySummary summary_;
  int failures_ = 0;
};

// One line on stderr of what the open choices (--layout, --gpu-memory auto) became, as bench says
// it; nothing when every choice was named.
void print_picked(const memory::AnalysisOptions& a) {
  std::vector<std::string> picked;
  if (!a.layout) {
    device::Picks layouts;
    for (engine::Precision p : a.precisions) {
      layouts.add(device::layout_flag(memory::analysis_layout(a, p)), engine::precision_name(p));
    }
    picked.push_back("layout " + layouts.text());
  }
  if (a.gpu_memory.empty()) {
    std::vector<std::string> modes;
    for (const memory::GpuMemoryOption& g : memory::fastest_gpu_memory(a)) modes.push_back(g.text);
    picked.push_back(fmt::format("gpu-memory {}", fmt::join(modes, ",")));
  }
  if (picked.empty()) return;
  std::fprintf(stderr, "picked: %s (override with --layout/--gpu-memory)\n",
               fmt::format("{}", fmt::join(picked, ", ")).c_str());
}

int run(const memory::AnalysisOptions& a, const MemoryFlags& f) {
  std::shared_ptr<nvml::Library> nvml;
  if (a.session && a.session->device.kind == DeviceKind::cuda) {
    if (auto lib = nvml::Library::open()) nvml = std::move(lib).value();
  }
  const results::Context context =
      run::results_context(own_command_line(), nvml, doctor::probe_versions());
  std::unique_ptr<results::ResultsWriter> writer;
  if (!f.json.empty()) {
    auto created = results::ResultsWriter::create(f.json, context);
    if (!created) return report_error(created.status().with_context("--json"));
    writer = std::make_unique<results::ResultsWriter>(std::move(created).value());
  }
  print_picked(a);
  // Ctrl-C, SIGTERM or SIGHUP: the configuration being measured finishes, and what was measured is
  // printed, kept in --json and added to the history.
  InterruptGuard guard;
  Printer printer(a.device_bytes, f.predict_only, std::move(writer), context, guard.flag());
  const Status s = memory::run_analysis(a, printer);
  if (printer.interrupted()) {
    const int code = printer.end(f.history);
    std::fputs("dlprobe memory: interrupted; what was measured is in the results\n", stderr);
    return code == kExitError ? code : kExitFailure;
  }
  return s.is_ok() ? printer.end(f.history) : report_error(s);
}

}  // namespace

Command add_memory_command(CLI::App& app) {
  auto f = std::make_shared<MemoryFlags>();
  CLI::App* sub = app.add_subcommand("memory", kMemoryAbout);
  add_model_flag(*sub, f->workload.model);
  option(*sub, "--batch", f->batch, "Batch sizes, e.g. 32,64,128");
  option(*sub, "--precision", f->workload.precision,
         "fp32, tf32, fp16, bf16, fp64 (cpu only); a list, e.g. fp32,fp16");
  option(*sub, "--mode", f->workload.mode, "train, grads or infer");
  option(*sub, "--layout", f->workload.layout,
         "nchw, nhwc, or auto: each precision's fastest for the device (nhwc but for fp32 on a "
         "GPU)");
  option(*sub, "--optimizer", f->workload.optimizer, "sgd or adamw");
  add_shape_flags(*sub, f->shape);
  add_device_flags(*sub, f->where, "no workspace: predictions are exact");
  option(*sub, "--gpu-memory", f->gpu_memory,
         "grow, prealloc[:FRACTION|SIZE], limit:SIZE, planned, planned+MODE; a list compares "
         "them, e.g. grow,planned; auto: the fastest for the device (planned on a GPU, grow on "
         "the CPU)");
  sub->add_option("--warmup", f->warmup, "Steps before the one followed")
      ->capture_default_str()
      ->transform(decimal_integer(0, 100));
  sub->add_flag("--predict-only", f->predict_only,
                "Predict without a device (from the plan over the allocator's policy)");
  sub->add_option("--device-memory", f->device_memory,
                  "With --predict-only: the memory of the GPU to predict for, e.g. 16GiB");
  sub->add_option("--calibration", f->calibration,
                  "A results file of an earlier dlprobe memory run on a GPU: its workspace and "
                  "CUDA context figures go into the prediction");
  CLI::Option* calibration_batch =
      sub->add_option(
             "--calibration-batch", f->calibration_batch,
             "The batch measured first, whose workspace and context figures predict the others "
             "(default: the smallest of --batch; 32 for --max-batch)")
          ->transform(decimal_integer(1, std::int64_t{1} << 40));
  sub->add_flag("--max-batch", f->max_batch,
                "Find the largest batch that completes a training step under --limit: "
                "predicted, then verified by measured runs");
  sub->add_option("--limit", f->limit,
                  "With --max-batch: the memory the whole process must fit, e.g. 16GiB");
  sub->add_option("--json", f->json,
                  "Write the results file (dlprobe.results/1) here ('-': standard output)");
  add_overwrite_flag(*sub, f->overwrite);
  add_history_flags(*sub, f->history);
  add_tuning_flags(*sub, f->tuning);
  option(
      *sub, "--conv-engines", f->conv_engines,
      "CUDA: which convolution engines compete: deterministic (the same workspaces every run), "
      "exact, or any (also non-deterministic, FFT, Winograd and reduced-precision ones, as bench)");
  add_recompute_flag(*sub, f->recompute);
  return {sub, [f, sub, calibration_batch] {
            f->calibration_batch_given = calibration_batch->count() > 0;
            f->cuda_only = given_options(*sub, {"--conv-algo"});
            f->measured_only =
                given_options(*sub, {"--device", "--backend", "--warmup", "--calibration-batch",
                                     "--conv-algo", "--tuning-cache"});
            f->workload.optimizer_given = sub->count("--optimizer") > 0;
            if (Status s = prepare_outputs({{"--json", f->json}}, f->overwrite,
                                           {{"--calibration", f->calibration},
                                            {"--tuning-cache", f->tuning.cache},
                                            history_input(f->history)});
                !s) {
              return report_error(s);
            }
            if (Status s = check_history(f->history); !s) return report_error(s);
            Result<memory::AnalysisOptions> options = to_options(*f);
            return options ? run(*options, *f) : report_error(options.status());
          }};
}

}  // namespace dlprobe::cli
