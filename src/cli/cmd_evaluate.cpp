// `dlprobe evaluate`: the main job, an environment end to end. Doctor (stack, GPU state, measured
// ceilings), then a bench sweep chosen for the machine (GPU: ResNet-50 forward+backward replayed
// as CUDA graphs in fp32 NCHW, tf32, fp16 and bf16 NHWC, batch 16 to 256; no GPU: ResNet-18
// training at 64x64 on the CPU backend), the findings, and results.json, report.html, doctor.json
// and tuning.json in an output folder, with a five-line summary on stdout. docs/bench.md.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/bench/sweep.h"
#include "dlprobe/core/files.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/doctor/doctor.h"
#include "dlprobe/report/html.h"
#include "dlprobe/run/results.h"

namespace dlprobe::cli {
namespace {

struct EvaluateFlags {
  std::string out;
  bool quick = false;
  std::string device = "auto";
  TuningFlags tuning;
  bool quiet = false;
};

std::string default_out() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "dlprobe-evaluate-%Y%m%d-%H%M%S", &tm);
  return buf;
}

// The folder must be new or hold no results: evaluate never overwrites a measurement.
Status prepare_out(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir / "results.json", ec)) {
    return invalid_argument(
        fmt::format("--out: {} already holds results.json; choose another folder", dir.string()));
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return error(Errc::io_error,
                 fmt::format("--out: cannot create {}: {}", dir.string(), ec.message()));
  }
  return Status::ok();
}

struct Choice {
  bench::Sweep sweep;
  std::string why;  // a line for stderr: what runs and why
};

// What runs where. The GPU sweep is the curve users compare images by; the CPU one is small enough
// for a laptop or a CI runner.
Result<Choice> choose(const EvaluateFlags& f, const Tuning& tuning, const doctor::Report& report) {
  Choice c;
  bench::Sweep& s = c.sweep;
  bool gpu = false;
  if (f.device == "auto") {
    const bool visible = std::any_of(report.gpus.begin(), report.gpus.end(),
                                     [](const doctor::GpuReport& g) { return g.cuda_visible; });
    gpu = visible && bench::backend_built(bench::BackendKind::cuda);
    s.device = gpu ? bench::Device{DeviceKind::cuda, 0} : bench::Device{DeviceKind::cpu, 0};
  } else {
    DLPROBE_ASSIGN_OR_RETURN(s.device, bench::parse_device(f.device, "--device"));
    gpu = s.device.kind == DeviceKind::cuda;
  }
  DLPROBE_ASSIGN_OR_RETURN(s.backend, bench::parse_backend("auto", s.device, "--device"));
  s.conv.algo = tuning.algo;
  s.conv.tuning = tuning.cache;
  engine::StepConfig base;
  base.mode = engine::StepMode::train;
  base.optimizer = engine::OptimizerKind::sgd;
  if (gpu) {
    base.model.arch = model::Arch::resnet50;
    base.model.image_size = 224;
    // The article's protocol (forward and backward, no update: grads mode), each step replayed
    // as one CUDA graph over the planned arena. An eager step launches some 500 calls from the
    // host, and at batch 16 and 32 that host work set the figure: on an H200 two back-to-back
    // runs of eager training steps differed by up to 12 % there (0.3 % from batch 64 up).
    base.mode = engine::StepMode::grads;
    base.memory_plan = engine::MemoryPlan::planned;
    base.graph = true;
    DLPROBE_ASSIGN_OR_RETURN(const memory::GpuMemoryOption planned,
                             memory::parse_gpu_memory("planned"));
    s.allocation = planned.allocator;
    s.gpu_memory = planned.text;
    const std::vector<std::int64_t> batches = f.quick
                                                  ? std::vector<std::int64_t>{64, 256}
                                                  : std::vector<std::int64_t>{16, 32, 64, 128, 256};
    // Each precision in its faster layout on an H200: the tensor-core ones (tf32, fp16, bf16) in
    // NHWC, where their convolutions need no transposes (tf32 ran 3,128 img/s there against
    // 2,078 in NCHW); strict fp32 in NCHW, since cuDNN's fp32 NHWC data gradient ran 28 times
    // slower.
    const std::pair<engine::Precision, Layout> kinds[] = {{engine::Precision::fp32, Layout::nchw},
                                                          {engine::Precision::tf32, Layout::nhwc},
                                                          {engine::Precision::fp16, Layout::nhwc},
                                                          {engine::Precision::bf16, Layout::nhwc}};
    const doctor::GpuReport* g = nullptr;
    for (const auto& r : report.gpus) {
      if (r.cuda_visible && r.index == s.device.index) g = &r;
    }
    const bool ampere = g != nullptr && g->cc_major && *g->cc_major >= 8;
    for (const auto& [precision, layout] : kinds) {
      // TF32 and bf16 need Ampere or newer; leave them out rather than run them as something else.
      if (!ampere &&
          (precision == engine::Precision::tf32 || precision == engine::Precision::bf16)) {
        continue;
      }
      bench::SweepGroup group;
      group.step = base;
      group.step.precision = precision;
      group.step.layout = layout;
      group.batches = batches;
      s.groups.push_back(group);
    }
    s.protocol = f.quick ? bench::Protocol{3, 0.5, 10, 1.0, 1, 100'000}
                         : bench::Protocol{5, 1.0, 20, 3.0, 1, 100'000};
    c.why = fmt::format(
        "dlprobe evaluate: GPU sweep on {}: resnet50 forward+backward (grads mode, "
        "planned memory, CUDA graph), {} precisions x batch {}",
        bench::device_name(s.device), s.groups.size(), fmt::join(batches, ","));
  } else {
    base.model.arch = model::Arch::resnet18;
    base.model.image_size = 64;
    bench::SweepGroup group;
    group.step = base;
    group.step.precision = engine::Precision::fp32;
    group.step.layout = Layout::nchw;
    group.batches =
        f.quick ? std::vector<std::int64_t>{4, 8} : std::vector<std::int64_t>{8, 16, 32};
    s.groups.push_back(group);
    s.protocol = f.quick ? bench::Protocol{2, 0.2, 10, 0.5, 1, 100'000}
                         : bench::Protocol{3, 0.5, 10, 2.0, 1, 100'000};
    c.why = fmt::format(
        "dlprobe evaluate: {}; CPU sweep: resnet18 at 64x64, fp32 training on the "
        "{} backend, batch {}",
        report.gpu_found ? "GPU not usable here" : "no GPU", bench::backend_kind_name(s.backend),
        fmt::join(group.batches, ","));
  }
  return c;
}

results::Finding from_doctor(const doctor::Finding& f) {
  results::Finding out;
  out.severity = f.severity == doctor::Severity::error     ? results::Severity::error
                 : f.severity == doctor::Severity::warning ? results::Severity::warning
                                                           : results::Severity::info;
  out.id = "doctor." + f.id;
  out.message = f.message;
  out.fix = f.fix;
  return out;
}

// Five lines: the machine, its ceilings, the best configuration, memory, findings and files.
std::string summary(const doctor::Report& report, const bench::Sweep& sweep,
                    const std::vector<results::Configuration>& configurations,
                    const std::vector<results::Finding>& findings,
                    const std::filesystem::path& dir) {
  std::string machine;
  const doctor::StackVersions& v = report.versions;
  const auto gpu = std::find_if(report.gpus.begin(), report.gpus.end(), [&](const auto& g) {
    return g.cuda_visible && g.index == sweep.device.index;
  });
  if (sweep.device.kind == DeviceKind::cuda && gpu != report.gpus.end()) {
    const doctor::GpuReport& g = *gpu;
    machine = fmt::format(
        "{}{}{}, driver {}, CUDA runtime {}, cuDNN {}", g.name,
        g.cc_major && g.cc_minor ? fmt::format(" (cc {}.{}", *g.cc_major, *g.cc_minor) : " (",
        g.memory_total_bytes ? fmt::format(", {})", format_size(*g.memory_total_bytes)) : ")",
        v.driver.value_or("unknown"),
        v.cuda_runtime_loaded > 0 ? doctor::decode_cuda_version(v.cuda_runtime_loaded).str()
                                  : "none",
        v.cudnn.loaded ? v.cudnn.version : "not found");
  } else {
    machine = fmt::format("{} ({} threads), {}, oneDNN {}", report.host.cpu.model,
                          report.host.cpu.threads, report.host.os,
                          v.onednn.loaded ? v.onednn.version : "not found");
  }
  std::string ceilings;
  if (report.ceilings) {
    std::vector<std::string> parts;
    for (const GemmCeiling& g : report.ceilings->gemm) {
      if (g.measured) parts.push_back(fmt::format("{} {:.1f}", gemm_dtype_name(g.dtype), g.tflops));
    }
    ceilings = fmt::format("GEMM {} TFLOP/s", fmt::join(parts, ", "));
    for (const BandwidthCeiling& b : report.ceilings->bandwidth) {
      if (b.measured && b.name == "device_memcpy_d2d") {
        ceilings += fmt::format("; device memory {:.0f} GB/s", b.gbs);
      }
    }
  } else {
    ceilings = report.ceilings_note.empty() ? "not measured" : report.ceilings_note;
  }
  const results::Configuration* best = nullptr;
  const results::Configuration* peak = nullptr;
  std::optional<std::int64_t> peak_bytes;
  std::size_t ran = 0;
  for (const results::Configuration& c : configurations) {
    if (c.status == results::RunStatus::ok) ++ran;
    if (c.statistics && c.status == results::RunStatus::ok &&
        (best == nullptr || c.statistics->throughput > best->statistics->throughput)) {
      best = &c;
    }
    const auto bytes = c.memory ? results::peak_memory_bytes(*c.memory) : std::nullopt;
    if (bytes && c.status == results::RunStatus::ok && (!peak_bytes || *bytes > *peak_bytes)) {
      peak_bytes = bytes;
      peak = &c;
    }
  }
  std::string best_line = "nothing ran";
  if (best != nullptr) {
    const stats::Summary& s = *best->statistics;
    best_line =
        fmt::format("{}: {} img/s (95% CI {} - {})", results::describe(best->kind, best->settings),
                    format_grouped(s.throughput, 1), format_grouped(s.throughput_ci.low, 1),
                    format_grouped(s.throughput_ci.high, 1));
    if (best->compute && best->compute->fraction_of_ceiling) {
      best_line += fmt::format(
          ", {:.1f} TFLOP/s = {:.1f}% of the {} ceiling", *best->compute->achieved_tflops,
          *best->compute->fraction_of_ceiling * 100, best->compute->ceiling_dtype);
    }
    if (!best->telemetry.empty() && best->telemetry.front().energy_j) {
      best_line += fmt::format(", {:.3f} J/img", *best->telemetry.front().energy_j / s.total_items);
    }
  }
  std::string memory_line = fmt::format("{} of {} configurations ran", ran, configurations.size());
  if (peak != nullptr) {
    memory_line = fmt::format("peak {} allocated ({}); ",
                              format_size(static_cast<std::uint64_t>(*peak_bytes)),
                              results::describe(peak->kind, peak->settings)) +
                  memory_line;
  }
  std::size_t warnings = 0;
  std::size_t errors = 0;
  const auto count = [&](const results::Finding& f) {
    if (f.severity == results::Severity::warning) ++warnings;
    if (f.severity == results::Severity::error) ++errors;
  };
  for (const auto& f : findings) count(f);
  for (const auto& c : configurations) {
    for (const auto& f : c.findings) count(f);
  }
  return fmt::format(
      "machine   {}\nceilings  {}\nbest      {}\nmemory    {}\nfindings  {} errors, {} warnings; "
      "report {}, results {}\n",
      machine, ceilings, best_line, memory_line, errors, warnings, (dir / "report.html").string(),
      (dir / "results.json").string());
}

int run_evaluate(const EvaluateFlags& flags) {
  doctor::DoctorOptions doctor_options;
  if (flags.device != "auto") {
    // Bad input is refused before anything is measured, and the ceilings come from that GPU.
    auto device = bench::parse_device(flags.device, "--device");
    if (!device) return report_error(device.status());
    if (device->kind == DeviceKind::cuda) doctor_options.ceilings_device = device->index;
  }
  auto tuning = tuning_options(flags.tuning);
  if (!tuning) return report_error(tuning.status());
  const std::filesystem::path dir = flags.out.empty() ? default_out() : flags.out;
  if (Status s = prepare_out(dir); !s) return report_error(s);
  // Without --tuning-cache the folder keeps its own: the engine chosen per convolution shape,
  // which a later run given that file runs again.
  if (flags.tuning.cache.empty()) {
    auto own = ConvTuningCache::open(dir / "tuning.json");
    if (!own) return report_error(own.status());
    tuning->cache = std::move(own).value();
  }
  ProgressLine line(flags.quiet);

  line.note("dlprobe evaluate: doctor (stack, GPU state, measured ceilings)...");
  if (flags.quick) {
    doctor_options.ceiling_options.repetitions = 3;
    doctor_options.ceiling_options.host_bandwidth = false;
  }
  auto report = doctor::run_doctor(doctor_options);
  if (!report) return report_error(report.status());
  if (Status s = write_file_atomic(dir / "doctor.json", doctor::render_json(*report)); !s) {
    return report_error(s);
  }
  auto choice = choose(flags, *tuning, *report);
  if (!choice) return report_error(choice.status());
  const bench::Sweep& sweep = choice->sweep;
  line.note(choice->why);

  std::shared_ptr<nvml::Library> nvml;
  if (sweep.device.kind == DeviceKind::cuda) nvml = open_nvml();
  const std::optional<bench::TelemetrySource> telemetry = telemetry_for(sweep.device, nvml);
  bench::SweepEnvironment env;
  if (telemetry) env.telemetry = &*telemetry;
  if (report->ceilings) env.ceilings = ceilings_by_precision(*report->ceilings);
  auto outputs = Outputs::create((dir / "results.json").string(), "", "",
                                 bench_context(own_command_line(), nvml, report->versions));
  if (!outputs) return report_error(outputs.status());

  InterruptGuard guard;
  env.interrupt = guard.flag();
  bench::SweepCallbacks callbacks;
  callbacks.progress = [&](const bench::SweepProgress& p) { line.update(p); };
  callbacks.done = [&](const std::vector<results::Configuration>& configurations,
                       std::size_t now_planned) {
    line.finished(configurations.size(), now_planned, configurations.back());
    return outputs->write(configurations);
  };
  bench::SweepOutcome outcome = bench::run_sweep(sweep, env, callbacks);

  std::vector<results::Finding> findings;
  for (const doctor::Finding& f : report->findings) findings.push_back(from_doctor(f));
  for (const diagnosis::Finding& f : outcome.findings)
    findings.push_back(run::to_results_finding(f));
  Status status = outcome.status;
  if (Status s = outputs->add_findings(findings); !s && status) status = s;
  const results::NamedDocument named{"results.json", outputs->document()};
  if (Status s = write_file_atomic(dir / "report.html", report::render_html(std::span(&named, 1)));
      !s && status) {
    status = s;
  }
  std::fputs(summary(*report, sweep, outcome.configurations, findings, dir).c_str(), stdout);
  std::fflush(stdout);
  if (!status) return report_error(status);
  if (outcome.interrupted) {
    line.note("dlprobe evaluate: interrupted; what was measured is in the results and report");
    return kExitFailure;
  }
  return outcome.incomplete > 0 ? kExitFailure : kExitOk;
}

}  // namespace

Command add_evaluate_command(CLI::App& app) {
  auto flags = std::make_shared<EvaluateFlags>();
  CLI::App* sub = app.add_subcommand(
      "evaluate",
      "Evaluate this machine end to end: doctor, a bench sweep chosen for it, findings, and "
      "report.html + results.json in a folder, with a five-line summary");
  sub->add_option("-o,--out", flags->out,
                  "Folder for results.json, report.html and doctor.json (default: "
                  "dlprobe-evaluate-<UTC date>-<time>; never overwrites results)");
  sub->add_flag("--quick", flags->quick, "A shorter sweep (about a minute on a GPU)");
  sub->add_option("--device", flags->device,
                  "auto (the first GPU when there is one, else the CPU), cpu or cuda:N")
      ->capture_default_str();
  add_tuning_flags(*sub, flags->tuning);
  sub->add_flag("-q,--quiet", flags->quiet, "No progress on stderr");
  return {sub, [flags] { return run_evaluate(*flags); }};
}

}  // namespace dlprobe::cli
