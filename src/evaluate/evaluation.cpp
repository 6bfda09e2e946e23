#include "dlprobe/evaluate/evaluation.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <span>
#include <string_view>

#include "dlprobe/bench/ceilings.h"
#include "dlprobe/bench/outputs.h"
#include "dlprobe/bench/telemetry.h"
#include "dlprobe/core/clock.h"
#include "dlprobe/core/files.h"
#include "dlprobe/evaluate/summary.h"
#include "dlprobe/report/html.h"
#include "dlprobe/run/results.h"

namespace dlprobe::evaluate {
namespace {

// doctor's errors that stop GPU work alone.
constexpr std::array<std::string_view, 7> kGpuStackErrors = {"no_driver",
                                                             "runtime_newer_than_driver",
                                                             "cuda_unusable",
                                                             "architecture_not_built",
                                                             "cudnn_major_mismatch",
                                                             "cudnn_cuda_major_mismatch",
                                                             "cublas_cuda_major_mismatch"};

}  // namespace

std::vector<results::Finding> doctor_findings(const doctor::Report& report,
                                              const bench::Sweep& sweep,
                                              const std::optional<device::Device>& device_asked) {
  const bool cpu_by_choice =
      sweep.device.kind == DeviceKind::cpu &&
      ((device_asked && device_asked->kind == DeviceKind::cpu) || !report.gpu_found);
  std::vector<results::Finding> out;
  for (const doctor::Finding& f : report.findings) {
    results::Finding r;
    r.severity = f.severity;
    r.id = "doctor." + f.id;
    r.message = f.message;
    r.fix = f.fix;
    if (cpu_by_choice && f.severity == Severity::error &&
        std::find(kGpuStackErrors.begin(), kGpuStackErrors.end(), f.id) != kGpuStackErrors.end()) {
      r.severity = Severity::info;
      r.message += " (no matter here: this evaluation runs on the CPU)";
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string default_folder() {
  return utc_now("dlprobe-evaluate-%Y%m%d-%H%M%S");
}

Status prepare_folder(const std::filesystem::path& dir, bool overwrite,
                      std::span<const NamedOutput> inputs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return error(Errc::io_error, fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  }
  // tuning.json is not among them: a cache, it is meant to be found again.
  const std::array<NamedOutput, 3> outputs = {{{"results.json", dir / "results.json"},
                                               {"report.html", dir / "report.html"},
                                               {"doctor.json", dir / "doctor.json"}}};
  DLPROBE_RETURN_IF_ERROR(check_not_inputs(outputs, inputs));
  for (const NamedOutput& output : outputs) {
    DLPROBE_RETURN_IF_ERROR(check_writable(output.path, overwrite));
  }
  return Status::ok();
}

Result<Plan> plan_evaluation(EvaluateOptions options,
                             const std::function<void(const std::string&)>& note) {
  Plan plan;
  // Without a tuning cache of its own the folder keeps one: the engine chosen per convolution
  // shape, which a later run given that file runs again.
  if (!options.conv.tuning) {
    DLPROBE_ASSIGN_OR_RETURN(options.conv.tuning,
                             ConvTuningCache::open(options.folder / "tuning.json"));
  }
  doctor::DoctorOptions doctor_options;
  // The ceilings come from the GPU that runs the sweep.
  if (options.device && options.device->kind == DeviceKind::cuda) {
    doctor_options.ceilings_device = options.device->index;
  }
  if (options.quick) {
    doctor_options.ceiling_options.repetitions = 3;
    doctor_options.ceiling_options.host_bandwidth = false;
  }
  if (note) note("dlprobe evaluate: doctor (stack, GPU state, measured ceilings)...");
  DLPROBE_ASSIGN_OR_RETURN(plan.report, doctor::run_doctor(doctor_options));
  DLPROBE_RETURN_IF_ERROR(
      write_file_atomic(options.folder / "doctor.json", doctor::render_json(plan.report)));
  DLPROBE_ASSIGN_OR_RETURN(plan.chosen,
                           machine_sweep(plan.report, options.device, options.quick, options.conv));
  if (options.data) {
    if (options.data->gpu_decode && plan.chosen.sweep.device.kind != DeviceKind::cuda) {
      return invalid_argument(
          "--data-decode gpu: this evaluation runs on the CPU; use --data-decode cpu");
    }
    plan.chosen.sweep.data = options.data;
    plan.chosen.why +=
        fmt::format("; each also from {} JPEGs decoded on the {}",
                    options.data->dataset.samples.size(), options.data->gpu_decode ? "GPU" : "CPU");
  }
  plan.options = std::move(options);
  return plan;
}

Result<Evaluation> run_evaluation(const Plan& plan, const std::vector<std::string>& command_line,
                                  const bench::SweepCallbacks& callbacks,
                                  const std::atomic<int>* interrupt) {
  const bench::Sweep& sweep = plan.chosen.sweep;
  const std::filesystem::path& dir = plan.options.folder;
  std::shared_ptr<nvml::Library> nvml;
  if (sweep.device.kind == DeviceKind::cuda) nvml = bench::open_nvml();
  const std::optional<bench::TelemetrySource> telemetry = bench::telemetry_for(sweep.device, nvml);
  bench::SweepEnvironment env;
  if (telemetry) env.telemetry = &*telemetry;
  if (plan.report.ceilings) env.ceilings = bench::ceilings_by_precision(*plan.report.ceilings);
  env.interrupt = interrupt;
  DLPROBE_ASSIGN_OR_RETURN(
      bench::Outputs outputs,
      bench::Outputs::create((dir / "results.json").string(), "", "",
                             run::results_context(command_line, nvml, plan.report.versions)));
  Evaluation e;
  e.run = record_sweep(sweep, env, outputs,
                       doctor_findings(plan.report, sweep, plan.options.device), callbacks);
  e.status = e.run.status;
  const results::NamedDocument named{"results.json", outputs.document()};
  if (Status s = write_file_atomic(dir / "report.html", report::render_html(std::span(&named, 1)));
      !s && e.status) {
    e.status = s;
  }
  e.summary =
      evaluation_summary(plan.report, sweep, e.run.outcome.configurations, e.run.findings, dir);
  return e;
}

}  // namespace dlprobe::evaluate
