// dlprobe bench: throughput, step-time statistics, memory and GPU telemetry of the native ResNet
// step, for one configuration or every combination of list-valued flags. docs/bench.md.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/bench/sweep.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/run/results.h"

namespace dlprobe::cli {
namespace {

struct BenchFlags {
  std::string model = "resnet50";
  std::string batch = "256";
  std::string precision = "fp32";
  std::string mode = "train";
  std::string layout = "nchw";
  std::string steps = "30";
  std::string min_time = "2s";
  std::string warmup = "5";
  std::string warmup_time = "1s";
  std::string repeat = "1";
  std::string device = "cuda:0";
  std::string backend = "auto";
  std::string image_size = "224";
  std::string classes = "1000";
  std::string optimizer = "sgd";
  std::string weights;
  TuningFlags tuning;
  std::string conv_engines = "any";
  std::string gpu_memory = "grow";
  bool graph = false;
  std::string profile = "0";
  std::string batch_start = "16";
  std::string batch_limit = "4096";
  std::string json;
  std::string csv;
  std::string md;
  bool no_ceiling = false;
  bool quiet = false;
};

// A comma list, each item parsed by `parse`, none twice.
template <class T, class Parse>
Result<std::vector<T>> parse_each(const std::string& text, std::string_view flag, Parse parse) {
  DLPROBE_ASSIGN_OR_RETURN(std::vector<std::string> items, parse_list(text, flag));
  std::vector<T> out;
  std::set<std::string> seen;
  for (const std::string& item : items) {
    if (!seen.insert(item).second) {
      return invalid_argument(fmt::format("{}: '{}' is given twice", flag, item));
    }
    DLPROBE_ASSIGN_OR_RETURN(T value, parse(item));
    out.push_back(value);
  }
  return out;
}

Result<double> parse_seconds(const std::string& text, std::string_view flag) {
  DLPROBE_ASSIGN_OR_RETURN(const std::chrono::nanoseconds d, parse_duration(text, flag));
  if (d.count() < 0) return invalid_argument(fmt::format("{}: must not be negative", flag));
  return std::chrono::duration<double>(d).count();
}

struct Plan {
  bench::Sweep sweep;
  bool single = false;  // one configuration: detailed output, errors as errors
};

Result<Plan> plan_from(const BenchFlags& f) {
  Plan p;
  bench::SweepAxes axes;
  DLPROBE_ASSIGN_OR_RETURN(axes.models,
                           parse_each<model::Arch>(f.model, "--model", [](const std::string& s) {
                             return model::parse_arch(s, "--model");
                           }));
  DLPROBE_ASSIGN_OR_RETURN(
      axes.precisions,
      parse_each<engine::Precision>(f.precision, "--precision", [](const std::string& s) {
        return for_flag("--precision", engine::parse_precision(s));
      }));
  DLPROBE_ASSIGN_OR_RETURN(axes.modes,
                           parse_each<engine::StepMode>(f.mode, "--mode", [](const std::string& s) {
                             return for_flag("--mode", engine::parse_step_mode(s));
                           }));
  DLPROBE_ASSIGN_OR_RETURN(axes.layouts,
                           parse_each<Layout>(f.layout, "--layout", [](const std::string& s) {
                             return parse_layout(s, "--layout");
                           }));
  if (f.batch == "auto") {
    axes.auto_batch = true;
  } else {
    DLPROBE_ASSIGN_OR_RETURN(
        axes.batches, parse_each<std::int64_t>(f.batch, "--batch", [](const std::string& s) {
          return parse_int(s, "--batch (a batch size, a comma list, or auto)", 1, 1LL << 40);
        }));
  }
  DLPROBE_ASSIGN_OR_RETURN(axes.base.model.image_size,
                           parse_int(f.image_size, "--image-size", 1, 1 << 16));
  DLPROBE_ASSIGN_OR_RETURN(axes.base.model.classes, parse_int(f.classes, "--classes", 1, 1 << 24));
  DLPROBE_ASSIGN_OR_RETURN(axes.base.optimizer,
                           for_flag("--optimizer", engine::parse_optimizer(f.optimizer)));
  DLPROBE_ASSIGN_OR_RETURN(const memory::GpuMemoryOption memory,
                           memory::parse_gpu_memory(f.gpu_memory, "--gpu-memory"));
  axes.base.memory_plan =
      memory.planned ? engine::MemoryPlan::planned : engine::MemoryPlan::dynamic;
  axes.base.graph = f.graph;
  if (f.graph && !memory.planned) {
    return invalid_argument(
        "--graph: needs --gpu-memory planned (a graph replays fixed addresses)");
  }
  if (f.graph && std::find(axes.modes.begin(), axes.modes.end(), engine::StepMode::train) !=
                     axes.modes.end()) {
    return invalid_argument("--graph: replays modes grads and infer, not train");
  }

  bench::Sweep& s = p.sweep;
  s.allocation = memory.allocator;
  s.gpu_memory = memory.text;
  DLPROBE_ASSIGN_OR_RETURN(s.device, bench::parse_device(f.device, "--device"));
  DLPROBE_ASSIGN_OR_RETURN(s.backend, bench::parse_backend(f.backend, s.device, "--backend"));
  for (const engine::Precision precision : axes.precisions) {
    const Status ok = bench::backend_supports(s.backend, precision);
    if (!ok) return ok.with_context("--precision");
  }
  DLPROBE_ASSIGN_OR_RETURN(s.protocol.min_steps, parse_int(f.steps, "--steps", 1, 1'000'000));
  DLPROBE_ASSIGN_OR_RETURN(s.protocol.min_seconds, parse_seconds(f.min_time, "--min-time"));
  DLPROBE_ASSIGN_OR_RETURN(s.protocol.warmup_steps, parse_int(f.warmup, "--warmup", 0, 1'000'000));
  DLPROBE_ASSIGN_OR_RETURN(s.protocol.warmup_seconds,
                           parse_seconds(f.warmup_time, "--warmup-time"));
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t repeat, parse_int(f.repeat, "--repeat", 1, 1000));
  s.protocol.repeat = static_cast<int>(repeat);
  s.protocol.max_steps = std::max(s.protocol.max_steps, s.protocol.min_steps);
  DLPROBE_ASSIGN_OR_RETURN(s.auto_batch.start,
                           parse_int(f.batch_start, "--batch-start", 1, 1LL << 30));
  DLPROBE_ASSIGN_OR_RETURN(s.auto_batch.limit,
                           parse_int(f.batch_limit, "--batch-limit", 1, 1LL << 40));
  if (axes.auto_batch && s.auto_batch.limit < s.auto_batch.start) {
    return invalid_argument("--batch-limit: below --batch-start");
  }
  DLPROBE_ASSIGN_OR_RETURN(const Tuning tuning, tuning_options(f.tuning));
  s.conv.algo = tuning.algo;
  s.conv.tuning = tuning.cache;
  DLPROBE_ASSIGN_OR_RETURN(s.conv.engines,
                           bench::parse_conv_engines(f.conv_engines, "--conv-engines"));
  DLPROBE_ASSIGN_OR_RETURN(s.profile_steps, parse_int(f.profile, "--profile", 0, 10'000));
  s.weights = f.weights;
  s.groups = bench::expand(axes);
  p.single = !axes.auto_batch && bench::planned_configurations(s) == 1;
  if (!s.weights.empty() && axes.models.size() > 1) {
    return invalid_argument("--weights: fits one model; give a single --model");
  }
  if (s.profile_steps > 0 && !p.single) {
    return invalid_argument("--profile: profiles one configuration; drop the lists");
  }
  return p;
}

// Device time per kind of call, then the slowest calls.
void print_profile(const std::vector<bench::CallTime>& profile) {
  std::map<std::string_view, std::pair<double, int>> by_kind;
  double total = 0;
  for (const bench::CallTime& t : profile) {
    auto& [ms, count] = by_kind[engine::call_kind_name(t.kind)];
    ms += t.ms;
    ++count;
    total += t.ms;
  }
  std::vector<std::pair<std::string_view, std::pair<double, int>>> kinds(by_kind.begin(),
                                                                         by_kind.end());
  std::sort(kinds.begin(), kinds.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("profile     %.3f ms per step (median per call), by kind:\n", total);
  for (const auto& [kind, v] : kinds) {
    std::printf("  %-28s %9.3f ms %5.1f %%  %4d calls\n", std::string(kind).c_str(), v.first,
                100.0 * v.first / std::max(total, 1e-12), v.second);
  }
  std::vector<const bench::CallTime*> slowest;
  for (const bench::CallTime& t : profile) slowest.push_back(&t);
  std::sort(slowest.begin(), slowest.end(),
            [](const bench::CallTime* a, const bench::CallTime* b) { return a->ms > b->ms; });
  slowest.resize(std::min<std::size_t>(slowest.size(), 25));
  std::printf("  slowest calls:\n");
  for (const bench::CallTime* t : slowest) {
    std::printf("  %9.3f ms  %s\n", t->ms, t->name.c_str());
  }
}

std::string range_text(const std::optional<results::Range>& r, std::string_view unit) {
  if (!r) return "unknown";
  return fmt::format("{:.0f} {} (min {:.0f}, max {:.0f})", r->median, unit, r->min, r->max);
}

// One configuration in full.
void print_detail(const bench::Sweep& sweep, const results::Configuration& c,
                  const bench::BenchResult& r) {
  const engine::StepConfig& step = sweep.groups.front().step;
  const bench::Protocol& p = sweep.protocol;
  std::printf("model       %s, %lldx%lld images, %lld classes, batch %lld\n",
              c.settings.model.c_str(), static_cast<long long>(c.settings.image_size),
              static_cast<long long>(c.settings.image_size),
              static_cast<long long>(c.settings.classes), static_cast<long long>(c.settings.batch));
  std::printf("step        %s, %s, %s, %s\n", c.settings.mode.c_str(), c.settings.precision.c_str(),
              c.settings.layout.c_str(),
              step.mode == engine::StepMode::train ? c.settings.optimizer.c_str() : "no optimizer");
  std::printf(
      "device      %s, %s backend%s\n", c.settings.device.c_str(), c.settings.backend.c_str(),
      sweep.backend == bench::BackendKind::reference ? " (plain loops for correctness, not speed)"
                                                     : "");
  std::printf(
      "protocol    setup %.2f s; warm-up %lld steps in %.2f s; %d window%s of >= %lld steps "
      "and >= %.2f s\n",
      r.setup_seconds, static_cast<long long>(r.warmup_steps), r.warmup_seconds, p.repeat,
      p.repeat == 1 ? "" : "s", static_cast<long long>(p.min_steps), p.min_seconds);
  if (c.statistics) {
    const stats::Summary& s = *c.statistics;
    std::printf("timed       %zu steps, %.3f s\n", s.steps, s.total_seconds);
    std::printf("throughput  %.2f img/s (%.0f%% CI %.2f - %.2f)\n", s.throughput, s.ci_level * 100,
                s.throughput_ci.low, s.throughput_ci.high);
    const std::vector<double> windows = results::window_throughputs(c.samples);
    if (windows.size() > 1) {
      std::string each;
      for (double w : windows) each += fmt::format("{}{:.2f}", each.empty() ? "" : ", ", w);
      std::printf("windows     %s img/s\n", each.c_str());
    }
    std::printf(
        "step time   median %.3f ms, p90 %.3f ms, p99 %.3f ms, MAD %.3f ms, CV %.2f %%, "
        "%zu outliers\n",
        s.median_s * 1e3, s.p90_s * 1e3, s.p99_s * 1e3, s.mad_s * 1e3, s.cv * 100, s.outliers);
  }
  if (c.compute && c.compute->flops_per_item) {
    const results::Compute& k = *c.compute;
    std::string line = fmt::format("{:.2f} GFLOP/img", *k.flops_per_item / 1e9);
    if (k.achieved_tflops) line += fmt::format(", {:.2f} TFLOP/s", *k.achieved_tflops);
    if (k.fraction_of_ceiling && k.ceiling_tflops) {
      line += fmt::format(", {:.1f}% of the measured {} GEMM ceiling ({:.1f} TFLOP/s)",
                          *k.fraction_of_ceiling * 100, k.ceiling_dtype, *k.ceiling_tflops);
    }
    std::printf("compute     %s\n", line.c_str());
  }
  for (const results::Telemetry& t : c.telemetry) {
    std::printf("gpu %d       util %s, power %s, SM clock %s\n", t.gpu,
                range_text(t.gpu_util_pct, "%").c_str(), range_text(t.power_w, "W").c_str(),
                range_text(t.sm_clock_mhz, "MHz").c_str());
    if (t.energy_j && c.statistics) {
      std::printf("energy      %.4f J/img (%.1f J over %.2f s, %s)\n",
                  *t.energy_j / c.statistics->total_items, *t.energy_j, t.window_s,
                  t.energy_source == "counter" ? "energy counter" : "integrated power");
    }
  }
  if (!r.windows.empty()) {
    std::printf("loss        %.4f (last step%s)\n", r.last.loss,
                step.precision == engine::Precision::fp16
                    ? fmt::format(", loss scale {}", r.last.loss_scale).c_str()
                    : "");
  }
  const memory::MemoryStats& m = r.memory;
  std::printf("peak memory %s allocated, %s reserved\n",
              format_size(static_cast<std::uint64_t>(m.all.allocated_bytes_peak)).c_str(),
              format_size(static_cast<std::uint64_t>(m.reserved_bytes_peak)).c_str());
  for (const memory::Category cat : memory::kAllCategories) {
    std::printf("  %-16s %s peak, %s at the overall peak\n",
                std::string(memory::category_name(cat)).c_str(),
                format_size(static_cast<std::uint64_t>(m[cat].allocated_bytes_peak)).c_str(),
                format_size(static_cast<std::uint64_t>(
                                m.peak.allocated_by_category[static_cast<std::size_t>(cat)]))
                    .c_str());
  }
  if (!m.peak.owner.empty()) std::printf("  peak set by      %s\n", m.peak.owner.c_str());
  if (!r.profile.empty()) print_profile(r.profile);
}

// The GEMM ceilings of the precisions the sweep runs, measured as doctor does (cuBLASLt, 8192^3)
// but without the bandwidth figures.
std::map<engine::Precision, bench::Ceiling> measure_needed_ceilings(const bench::Sweep& sweep,
                                                                    ProgressLine& line) {
  CeilingOptions options;
  options.device_bandwidth = false;
  options.host_bandwidth = false;
  options.dtypes.clear();
  for (const bench::SweepGroup& g : sweep.groups) {
    const auto name = bench::ceiling_dtype(g.step.precision);
    const auto dtype = name ? parse_gemm_dtype(*name) : std::nullopt;
    if (dtype &&
        std::find(options.dtypes.begin(), options.dtypes.end(), *dtype) == options.dtypes.end()) {
      options.dtypes.push_back(*dtype);
    }
  }
  if (options.dtypes.empty()) return {};
  line.note("dlprobe bench: measuring the GEMM ceilings (--no-ceiling skips them)...");
  auto measured = measure_ceilings(sweep.device.index, options);
  if (!measured) {
    log_warn("no GEMM ceilings: {}", measured.status().message());
    return {};
  }
  return ceilings_by_precision(*measured);
}

int run_bench_command(const BenchFlags& flags) {
  Result<Plan> plan = plan_from(flags);
  if (!plan) return report_error(plan.status());
  const bench::Sweep& sweep = plan->sweep;
  ProgressLine line(flags.quiet);

  std::shared_ptr<nvml::Library> nvml;
  if (sweep.device.kind == DeviceKind::cuda) nvml = open_nvml();
  const std::optional<bench::TelemetrySource> telemetry = telemetry_for(sweep.device, nvml);
  bench::SweepEnvironment env;
  if (telemetry) env.telemetry = &*telemetry;
  auto outputs = Outputs::create(flags.json, flags.csv, flags.md,
                                 bench_context(own_command_line(), nvml, doctor::probe_versions()));
  if (!outputs) return report_error(outputs.status());
  if (sweep.device.kind == DeviceKind::cuda && !flags.no_ceiling &&
      bench::backend_built(bench::BackendKind::cuda)) {
    env.ceilings = measure_needed_ceilings(sweep, line);
  }

  InterruptGuard guard;
  env.interrupt = guard.flag();
  const std::size_t planned = bench::planned_configurations(sweep);
  bench::SweepCallbacks callbacks;
  callbacks.progress = [&](const bench::SweepProgress& p) { line.update(p); };
  callbacks.done = [&](const std::vector<results::Configuration>& configurations,
                       std::size_t now_planned) {
    line.finished(configurations.size(), now_planned, configurations.back());
    return outputs->write(configurations);
  };
  line.note(fmt::format("dlprobe bench: {}{} configuration{} on {}", planned,
                        sweep.groups.front().auto_batch ? " or fewer" : "", planned == 1 ? "" : "s",
                        bench::device_name(sweep.device)));
  bench::SweepOutcome outcome = bench::run_sweep(sweep, env, callbacks);

  std::vector<results::Finding> sweep_findings;
  for (const diagnosis::Finding& f : outcome.findings) {
    sweep_findings.push_back(run::to_results_finding(f));
  }
  Status status = outcome.status;
  if (!sweep_findings.empty()) {
    if (Status s = outputs->add_findings(sweep_findings); !s && status) status = s;
  }
  if (!outcome.configurations.empty()) {
    const results::Configuration& first = outcome.configurations.front();
    if (plan->single) {
      // A single configuration that failed is one error line below, not a report.
      if (first.status == results::RunStatus::ok ||
          first.status == results::RunStatus::interrupted) {
        print_detail(sweep, first, outcome.runs.front());
      }
    } else {
      std::fputs(configurations_text(outcome.configurations).c_str(), stdout);
    }
    std::fputs(findings_text(outcome.configurations, sweep_findings).c_str(), stdout);
    std::fflush(stdout);
  }
  if (!status) return report_error(status);
  if (outcome.interrupted) {
    line.note("dlprobe bench: interrupted; what was measured is kept");
    return kExitFailure;
  }
  if (plan->single) {
    const results::Configuration& c = outcome.configurations.front();
    if (c.status != results::RunStatus::ok) return report_error(error(Errc::internal, c.error));
    return kExitOk;
  }
  return outcome.incomplete > 0 ? kExitFailure : kExitOk;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Time the native ResNet training step: img/s with a confidence interval, step-time "
      "percentiles, memory by category, GPU telemetry, TFLOP/s. Comma lists sweep every "
      "combination (docs/bench.md)");
  sub->add_option("--model", flags->model,
                  "resnet18, resnet34, resnet50, resnet101, resnet152 (a comma list sweeps)")
      ->capture_default_str();
  sub->add_option("--batch", flags->batch,
                  "Images per step: a number, a comma list, or auto (double from --batch-start "
                  "until the first out-of-memory)")
      ->capture_default_str();
  sub->add_option("--precision", flags->precision,
                  "fp32, tf32, fp16 (mixed, loss scaling), bf16 (mixed), fp64 (reference backend "
                  "only); a comma list sweeps")
      ->capture_default_str();
  sub->add_option("--mode", flags->mode,
                  "train (forward, backward, optimizer), grads (forward, backward), infer "
                  "(forward: per-step times are the latencies); a comma list sweeps")
      ->capture_default_str();
  sub->add_option("--layout", flags->layout, "nchw or nhwc; a comma list sweeps")
      ->capture_default_str();
  sub->add_option("--steps", flags->steps, "Timed steps per window, at least")
      ->capture_default_str();
  sub->add_option("--min-time", flags->min_time, "Timed window length, at least (e.g. 2s)")
      ->capture_default_str();
  sub->add_option("--warmup", flags->warmup, "Untimed steps first, at least")
      ->capture_default_str();
  sub->add_option("--warmup-time", flags->warmup_time, "Warm-up length, at least (e.g. 1s)")
      ->capture_default_str();
  sub->add_option("--repeat", flags->repeat, "Independent timed windows per configuration")
      ->capture_default_str();
  sub->add_option("--device", flags->device, "cpu or cuda:N")->capture_default_str();
  sub->add_option("--backend", flags->backend,
                  "auto (cuda on a GPU, oneDNN on the CPU where built), cuda, onednn, or "
                  "reference (plain loops: a correctness tool, not a benchmark)")
      ->capture_default_str();
  sub->add_option("--image-size", flags->image_size, "Square image side")->capture_default_str();
  sub->add_option("--classes", flags->classes, "Output classes")->capture_default_str();
  sub->add_option("--optimizer", flags->optimizer, "sgd (momentum 0.9, wd 1e-4, lr 0.1) or adamw")
      ->capture_default_str();
  sub->add_option("--weights", flags->weights,
                  "Start from a safetensors state dict (torchvision names)");
  add_tuning_flags(*sub, flags->tuning);
  sub->add_option("--conv-engines", flags->conv_engines,
                  "Which cuDNN engines may compete: any (as cudnn.benchmark: also "
                  "non-deterministic, FFT and Winograd), deterministic, exact (deterministic "
                  "direct sums)")
      ->capture_default_str();
  sub->add_option("--gpu-memory", flags->gpu_memory,
                  "How the engine takes device memory: grow, prealloc[:FRACTION|SIZE], "
                  "limit:SIZE (the whole process within SIZE), planned (one arena laid out from "
                  "the step's lifetimes), or planned+ one of the others")
      ->capture_default_str();
  sub->add_flag("--graph", flags->graph,
                "Record the step once as a CUDA graph and replay it (needs --gpu-memory planned; "
                "modes grads and infer)");
  sub->add_option("--profile", flags->profile,
                  "After timing, N more steps with a mark around every call: device time per "
                  "kind of call and the slowest calls (one configuration only)");
  sub->add_option("--batch-start", flags->batch_start, "First batch of --batch auto")
      ->capture_default_str();
  sub->add_option("--batch-limit", flags->batch_limit, "Largest batch --batch auto tries")
      ->capture_default_str();
  sub->add_option("--json", flags->json,
                  "Write the results file (schema dlprobe.results/1), rewritten after every "
                  "configuration");
  sub->add_option("--csv", flags->csv, "Write the configuration table as CSV");
  sub->add_option("--md", flags->md, "Write the configuration table as Markdown");
  sub->add_flag("--no-ceiling", flags->no_ceiling,
                "Skip measuring the GEMM ceilings that TFLOP/s is compared with");
  sub->add_flag("-q,--quiet", flags->quiet, "No progress on stderr");
  return {sub, [flags] { return run_bench_command(*flags); }};
}

}  // namespace dlprobe::cli
