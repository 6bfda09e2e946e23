// dlprobe bench: throughput, step-time statistics, memory and GPU telemetry of the native ResNet
// step, for one configuration or every combination of list-valued flags. docs/bench.md.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/bench/ceilings.h"
#include "dlprobe/bench/outputs.h"
#include "dlprobe/bench/processes.h"
#include "dlprobe/bench/sweep.h"
#include "dlprobe/bench/telemetry.h"
#include "dlprobe/bench/text.h"
#include "dlprobe/core/command_line.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/units.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/doctor/versions.h"
#include "dlprobe/evaluate/recorded_sweep.h"
#include "dlprobe/run/results.h"
#include "history_flags.h"
#include "protocol_flags.h"

namespace dlprobe::cli {
namespace {

// What `dlprobe --help` and `dlprobe bench --help` say the command does.
constexpr const char* kBenchAbout =
    "Time the native ResNet training step: img/s with a confidence interval, step-time "
    "percentiles, memory by category, GPU telemetry, TFLOP/s. Comma lists sweep every "
    "combination (docs/bench.md)";

struct BenchFlags {
  WorkloadFlags workload;
  std::string batch = "256";
  ProtocolFlags protocol;
  DeviceFlags where;
  ShapeFlags shape;
  std::string weights;
  TuningFlags tuning;
  std::string conv_engines = "any";
  std::string conv_sums = "auto";
  std::string conv_prologue = "auto";
  std::string stem_backward = "fused";
  std::string gpu_memory = "auto";
  std::string graph = "auto";
  std::string fusion = "all";
  std::string streams = "auto";
  std::string stream_lag = "auto";
  std::string recompute = "none";
  std::string profile = "0";
  std::string batch_start = "16";
  std::string batch_limit = "4096";
  bool batch_range_given = false;      // --batch-start or --batch-limit on the command line
  std::vector<std::string> cuda_only;  // options only the CUDA backend reads, given
  std::string repeat_process;          // empty: measure in this process
  std::string json;
  std::string csv;
  std::string md;
  bool overwrite = false;
  bool no_ceiling = false;
  bool quiet = false;
  DataFlags data;
  HistoryFlags history;
};

struct BenchPlan {
  bench::Sweep sweep;
  bool single = false;  // one configuration: detailed output, errors as errors
  std::string picked;   // what the open choices became
  std::string device;   // the device picked and why, when --device was not named
};

Result<std::optional<bool>> parse_graph(const std::string& text) {
  if (text == "auto") return std::optional<bool>();
  if (text == "on") return std::optional<bool>(true);
  if (text == "off") return std::optional<bool>(false);
  return invalid_argument(
      fmt::format("--graph: unknown choice '{}' (expected auto, on or off)", text));
}

// --fusion into the step's two switches.
Status parse_fusion(const std::string& text, engine::StepConfig& step) {
  if (text == "all" || text == "batch-norm" || text == "none") {
    step.fuse = text != "none";
    step.fuse_conv = text == "all";
    return Status::ok();
  }
  return invalid_argument(
      fmt::format("--fusion: unknown choice '{}' (expected all, batch-norm or none)", text));
}

Result<BenchPlan> plan_from(const BenchFlags& f) {
  prepare_data_decode(f.data);
  BenchPlan p;
  bench::SweepAxes axes;
  DLPROBE_ASSIGN_OR_RETURN(
      axes.models, parse_each<model::Arch>(f.workload.model, "--model", [](const std::string& s) {
        return model::parse_arch(s, "--model");
      }));
  DLPROBE_ASSIGN_OR_RETURN(
      axes.precisions,
      parse_each<engine::Precision>(f.workload.precision, "--precision", [](const std::string& s) {
        return for_flag("--precision", engine::parse_precision(s));
      }));
  DLPROBE_ASSIGN_OR_RETURN(
      axes.modes, parse_each<engine::StepMode>(f.workload.mode, "--mode", [](const std::string& s) {
        return for_flag("--mode", engine::parse_step_mode(s));
      }));
  if (f.workload.layout != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(
        axes.layouts, parse_each<Layout>(f.workload.layout, "--layout", [](const std::string& s) {
          return parse_layout(s, "--layout");
        }));
  }
  if (f.batch == "auto") {
    axes.auto_batch = true;
  } else {
    DLPROBE_ASSIGN_OR_RETURN(
        axes.batches, parse_each<std::int64_t>(f.batch, "--batch", [](const std::string& s) {
          return parse_int(s, "--batch (a batch size, a comma list, or auto)", 1, 1LL << 40);
        }));
  }
  DLPROBE_RETURN_IF_ERROR(parse_shape(f.shape, axes.base.model));
  DLPROBE_ASSIGN_OR_RETURN(
      axes.base.optimizer,
      workload_optimizer(f.workload, std::find(axes.modes.begin(), axes.modes.end(),
                                               engine::StepMode::train) != axes.modes.end()));
  // Flags that would be taken and ignored without a word.
  if (f.batch_range_given && !axes.auto_batch) {
    return invalid_argument("--batch-start and --batch-limit: only with --batch auto");
  }
  if (f.gpu_memory != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(axes.memory, memory::parse_gpu_memory(f.gpu_memory, "--gpu-memory"));
  }
  DLPROBE_ASSIGN_OR_RETURN(axes.graph, parse_graph(f.graph));
  DLPROBE_RETURN_IF_ERROR(parse_fusion(f.fusion, axes.base));
  DLPROBE_RETURN_IF_ERROR(parse_recompute(f.recompute, axes.base));
  if (f.streams != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(const std::int64_t streams,
                             parse_int(f.streams, "--streams (auto, 1 or 2)", 1, 2));
    axes.streams = static_cast<int>(streams);
    if (streams > 1 && axes.memory && !axes.memory->planned) {
      return invalid_argument("--streams: 2 needs planned memory (--gpu-memory planned)");
    }
    if (streams > 1 && axes.base.recompute_block_outputs) {
      return invalid_argument(
          "--streams: 2 keeps the outputs --recompute block-outputs would save to the end of "
          "the backward pass (take --streams 1 or auto)");
    }
  }
  if (f.stream_lag != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(
        axes.stream_lag,
        parse_int(f.stream_lag, "--stream-lag (auto, or calls: 0 for no bound)", 0, 1'000'000));
    if (axes.stream_lag > 0 && axes.streams == 1) {
      return invalid_argument(
          "--stream-lag bounds the second stream: it needs --streams 2 or auto");
    }
  }

  bench::Sweep& s = p.sweep;
  DLPROBE_ASSIGN_OR_RETURN(const DeviceChoice where, device_choice(f.where));
  s.device = where.device;
  s.backend = where.backend;
  p.device = where.picked;
  for (const engine::Precision precision : axes.precisions) {
    const Status ok = device::backend_supports(s.backend, precision);
    if (!ok) return ok.with_context("--precision");
  }
  // expand() judges the graph, the streams and the memory together: its refusal names what was
  // asked of them.
  std::vector<std::string> asked;
  for (const auto& [flag, value, open] : {std::tuple{"--graph", f.graph, "auto"},
                                          {"--streams", f.streams, "auto"},
                                          {"--stream-lag", f.stream_lag, "auto"},
                                          {"--gpu-memory", f.gpu_memory, "auto"},
                                          {"--recompute", f.recompute, "none"}}) {
    if (value != open) asked.push_back(fmt::format("{} {}", flag, value));
  }
  if (f.workload.optimizer_given) asked.push_back("--optimizer " + f.workload.optimizer);
  DLPROBE_ASSIGN_OR_RETURN(
      bench::Expanded expanded,
      for_flag(asked.empty() ? fmt::format("--device {}", device::device_name(s.device))
                             : fmt::format("{}", fmt::join(asked, ", ")),
               bench::expand(axes, s.device.kind)));
  s.groups = std::move(expanded.groups);
  s.allocation = expanded.allocation;
  s.gpu_memory = expanded.gpu_memory;
  p.picked = expanded.picked;
  DLPROBE_RETURN_IF_ERROR(parse_protocol(f.protocol, s.protocol, s.runs));
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
                           for_flag("--conv-engines", device::parse_conv_engines(f.conv_engines)));
  DLPROBE_ASSIGN_OR_RETURN(s.conv.sums,
                           for_flag("--conv-sums", device::parse_conv_sums(f.conv_sums)));
  DLPROBE_ASSIGN_OR_RETURN(
      s.conv.prologue, for_flag("--conv-prologue", device::parse_conv_prologue(f.conv_prologue)));
  if (f.stem_backward != "apart" && f.stem_backward != "fused") {
    return invalid_argument("--stem-backward: unknown choice '" + f.stem_backward +
                            "' (expected apart or fused)");
  }
  s.conv.fused_stem_backward = f.stem_backward == "fused";
  DLPROBE_ASSIGN_OR_RETURN(s.profile_steps, parse_int(f.profile, "--profile", 0, 10'000));
  s.weights = f.weights;
  DLPROBE_ASSIGN_OR_RETURN(s.data, data_input(f.data, s.device));
  p.single = !axes.auto_batch && bench::planned_configurations(s) == 1;
  if (!s.weights.empty() && axes.models.size() > 1) {
    return invalid_argument("--weights: fits one model; give a single --model");
  }
  if (s.profile_steps > 0 && !p.single) {
    return invalid_argument("--profile: profiles one configuration; drop the lists");
  }
  return p;
}

// --repeat-process N: the processes' results merged go where this command's outputs go; a process
// that fails is said and the others' results kept (exit 1).
int run_in_processes(const BenchFlags& flags, int count) {
  const std::vector<std::string>& own = own_command_line();
  ProgressLine line(flags.quiet);
  InterruptGuard guard;
  auto ran = bench::run_processes(own, count, [&](int i) {
    if (guard.interrupted()) return false;
    line.note(fmt::format("dlprobe bench: process {} of {}", i + 1, count));
    return true;
  });
  if (!ran) return report_error(ran.status());
  const std::vector<bench::ProcessRun>& processes = *ran;
  results::Document merged = bench::merge_processes(processes);
  merged.context.command_line = own;
  auto written = bench::Outputs::create(flags.json, flags.csv, flags.md, merged.context);
  if (!written) return report_error(written.status());
  if (Status s = written->write(merged.configurations); !s) return report_error(s);
  if (Status s = written->add_findings(merged.findings); !s) return report_error(s);
  if (Status s = written->finish(); !s) return report_error(s);
  store_in_history(flags.history, written->document());
  std::fputs(bench::processes_text(merged, processes).c_str(), stdout);
  std::fflush(stdout);
  const bool all_well = std::all_of(processes.begin(), processes.end(),
                                    [](const bench::ProcessRun& p) { return p.failure.empty(); });
  return all_well && static_cast<int>(processes.size()) == count ? kExitOk : kExitFailure;
}

int run_bench_command(const BenchFlags& flags) {
  if (Status s = prepare_outputs({{"--json", flags.json}, {"--csv", flags.csv}, {"--md", flags.md}},
                                 flags.overwrite,
                                 {history_input(flags.history),
                                  {"--weights", flags.weights},
                                  {"--tuning-cache", flags.tuning.cache}});
      !s) {
    return report_error(s);
  }
  if (Status s = check_history(flags.history); !s) return report_error(s);
  Result<BenchPlan> plan = plan_from(flags);
  if (!plan) return report_error(plan.status());
  warn_cuda_only("bench", plan->sweep.backend, flags.cuda_only);
  if (!flags.repeat_process.empty()) {
    auto count = parse_int(flags.repeat_process, "--repeat-process", 1, 100);
    if (!count) return report_error(count.status());
    return run_in_processes(flags, static_cast<int>(*count));
  }
  const bench::Sweep& sweep = plan->sweep;
  ProgressLine line(flags.quiet);
  if (!plan->device.empty()) line.note("dlprobe bench: " + plan->device);
  if (!plan->picked.empty()) {
    line.note(fmt::format(
        "picked: {} (override with --layout/--gpu-memory/--graph/--streams/--stream-lag)",
        plan->picked));
  }

  std::shared_ptr<nvml::Library> nvml;
  if (sweep.device.kind == DeviceKind::cuda) nvml = bench::open_nvml();
  const std::optional<bench::TelemetrySource> telemetry = bench::telemetry_for(sweep.device, nvml);
  bench::SweepEnvironment env;
  if (telemetry) env.telemetry = &*telemetry;
  auto outputs = bench::Outputs::create(
      flags.json, flags.csv, flags.md,
      run::results_context(own_command_line(), nvml, doctor::probe_versions()));
  if (!outputs) return report_error(outputs.status());
  if (sweep.backend == device::BackendKind::cuda && !flags.no_ceiling &&
      !bench::ceiling_dtypes(sweep).empty()) {
    line.note("dlprobe bench: measuring the GEMM ceilings (--no-ceiling skips them)...");
    env.ceilings = bench::measure_sweep_ceilings(sweep);
  }

  InterruptGuard guard;
  env.interrupt = guard.flag();
  const std::size_t planned = bench::planned_configurations(sweep);
  const bench::SweepCallbacks callbacks = line.sweep_callbacks();
  line.note(fmt::format("dlprobe bench: {}{} configuration{} on {}", planned,
                        sweep.groups.front().auto_batch ? " or fewer" : "", planned == 1 ? "" : "s",
                        device::device_name(sweep.device)));
  const evaluate::RecordedSweep run = evaluate::record_sweep(sweep, env, *outputs, {}, callbacks);
  const bench::SweepOutcome& outcome = run.outcome;
  store_in_history(flags.history, outputs->document());
  std::fputs(bench::outcome_text(sweep, outcome, run.findings, plan->single).c_str(), stdout);
  std::fflush(stdout);
  return sweep_exit_code(run.status, outcome, line,
                         "dlprobe bench: interrupted; what was measured is kept", plan->single);
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand("bench", kBenchAbout);
  add_model_flag(*sub, flags->workload.model, "a comma list sweeps");
  option(*sub, "--batch", flags->batch,
         "Images per step: a number, a comma list, or auto (double from --batch-start "
         "until the first out-of-memory)");
  option(*sub, "--precision", flags->workload.precision,
         "fp32, tf32, fp16 (mixed, loss scaling), bf16 (mixed), fp64 (reference backend "
         "only); a comma list sweeps");
  option(*sub, "--mode", flags->workload.mode,
         "train (forward, backward, optimizer), grads (forward, backward), infer "
         "(forward: per-step times are the latencies); a comma list sweeps");
  option(*sub, "--layout", flags->workload.layout,
         "nchw or nhwc (a comma list sweeps), or auto: the fastest for the device and "
         "precision (on a GPU NHWC for tf32, fp16 and bf16, NCHW for fp32)");
  add_protocol_flags(*sub, flags->protocol);
  add_device_flags(*sub, flags->where, "a correctness tool, not a benchmark");
  add_shape_flags(*sub, flags->shape);
  option(*sub, "--optimizer", flags->workload.optimizer,
         "sgd (momentum 0.9, wd 1e-4, lr 0.1) or adamw");
  sub->add_option("--weights", flags->weights,
                  "Start from a safetensors state dict (torchvision names)");
  add_tuning_flags(*sub, flags->tuning);
  add_data_flags(*sub, flags->data);
  option(*sub, "--conv-engines", flags->conv_engines,
         "Which cuDNN engines may compete: any (as cudnn.benchmark: also non-deterministic, FFT, "
         "Winograd and reduced-precision reductions), deterministic, exact (deterministic direct "
         "sums)");
  option(*sub, "--conv-sums", flags->conv_sums,
         "With batch norm inside the convolutions, who sums a convolution's output for the "
         "statistics: epilogue (cuDNN, as the convolution writes it), pass (dlprobe, in a pass "
         "over the output after it) or auto: epilogue in fp16, the pass in bf16 and tf32");
  option(*sub, "--conv-prologue", flags->conv_prologue,
         fmt::format("With batch norm inside the convolutions, who applies a batch norm + ReLU "
                     "to the next convolution's input: fused (cuDNN, as the convolution loads "
                     "it), pass (dlprobe's pass, whose output the convolution and its weight "
                     "gradient read), timed (per call shape, the faster of the two as timed on "
                     "its first call; kept in --tuning-cache), up-to:SIZE (the pass where the "
                     "input holds at most SIZE, cuDNN's above) or auto: up-to:{}MB, cuDNN's "
                     "above up to batch {} and timed above that; bf16 and tf32 take the pass",
                     device::kAutoPrologueUpTo / 1'000'000, device::kAutoPrologueBatch)
             .c_str());
  option(*sub, "--stem-backward", flags->stem_backward,
         "The backward of the stem's batch norm, ReLU and max pool (NHWC, GPU): fused (one call: "
         "the pool's forward keeps its maxima's places and the batch norm's passes gather the "
         "pool's gradient as they load it; H100: 0.5 to 1.2 % faster than apart) or apart (the "
         "pool's two passes, then the batch norm's)");
  option(*sub, "--gpu-memory", flags->gpu_memory,
         "How the engine takes device memory: grow, prealloc[:FRACTION|SIZE], "
         "limit:SIZE (the whole process within SIZE), planned (one arena laid out from "
         "the step's lifetimes), planned+ one of the others, or auto: the fastest "
         "(planned on a GPU)");
  sub->add_option("--graph", flags->graph,
                  "on (also --graph alone): record the step once as a CUDA graph and replay it "
                  "(needs planned memory); off: eager steps; auto: a graph "
                  "wherever the memory allows one on a GPU")
      ->expected(0, 1)
      ->default_str("on")
      ->option_text("[auto|on|off]=auto");
  option(*sub, "--fusion", flags->fusion,
         "all: batch norm with its ReLU and residual add, and inside the convolutions where "
         "the backend can (the CUDA backend: fp16, bf16 and tf32 NHWC, not inference); "
         "batch-norm: only with its ReLU and add; none: every layer its own call");
  option(*sub, "--streams", flags->streams,
         "2: each convolution's weight gradient runs on a second CUDA stream beside the rest "
         "of the backward pass (needs planned memory); 1: every call on one stream; auto: the "
         "fastest measured (2 for fp16, bf16 and tf32 on a GPU with planned memory, else 1). "
         "--profile's steps run on one");
  option(*sub, "--stream-lag", flags->stream_lag,
         "On two streams, stream 0 waits for a weight gradient more than N calls behind it, "
         "so that the arena keeps its operands less long (0: waits only where it must; more "
         "memory, more overlap: with --streams auto, two unbounded streams at every batch); "
         "auto: 0 up to batch 128, 16 above (fp16, bf16, tf32)");
  add_recompute_flag(*sub, flags->recompute);
  sub->add_option("--profile", flags->profile,
                  "After timing, N more steps with a mark around every call: device time per "
                  "kind of call and the slowest calls (one configuration only)");
  option(*sub, "--batch-start", flags->batch_start, "First batch of --batch auto");
  option(*sub, "--batch-limit", flags->batch_limit, "Largest batch --batch auto tries");
  sub->add_option("--repeat-process", flags->repeat_process,
                  "Run the whole measurement N times, each in a fresh process, and give the "
                  "spread between the processes beside --repeat's between fresh engines");
  sub->add_option("--json", flags->json,
                  "Write the results file (schema dlprobe.results/1), rewritten after every "
                  "configuration ('-': standard output, at the end)");
  sub->add_option("--csv", flags->csv, "Write the configuration table as CSV");
  sub->add_option("--md", flags->md, "Write the configuration table as Markdown");
  add_overwrite_flag(*sub, flags->overwrite);
  add_history_flags(*sub, flags->history);
  sub->add_flag("--no-ceiling", flags->no_ceiling,
                "Skip measuring the GEMM ceilings that TFLOP/s is compared with");
  sub->add_flag("-q,--quiet", flags->quiet, "No progress on stderr");
  return {sub, [flags, sub] {
            flags->batch_range_given =
                sub->count("--batch-start") + sub->count("--batch-limit") > 0;
            flags->workload.optimizer_given = sub->count("--optimizer") > 0;
            flags->cuda_only =
                given_options(*sub, {"--conv-algo", "--conv-engines", "--conv-sums",
                                     "--conv-prologue", "--stem-backward", "--stream-lag"});
            return run_bench_command(*flags);
          }};
}

}  // namespace dlprobe::cli
