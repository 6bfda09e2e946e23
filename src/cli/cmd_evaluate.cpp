// `dlprobe evaluate`: the main job, an environment end to end (src/evaluate): doctor, the bench
// sweep chosen for the machine, the findings, and results.json, report.html, doctor.json and
// tuning.json in an output folder, with a five-line summary on stdout. docs/bench.md.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/core/command_line.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/device/availability.h"
#include "dlprobe/evaluate/evaluation.h"
#include "history_flags.h"

namespace dlprobe::cli {
namespace {

// What `dlprobe --help` and `dlprobe evaluate --help` say the command does.
constexpr const char* kEvaluateAbout =
    "Evaluate this machine end to end: doctor, a bench sweep chosen for it, findings, and "
    "report.html + results.json in a folder, with a five-line summary";

struct EvaluateFlags {
  std::string out;
  bool quick = false;
  std::string device = "auto";
  TuningFlags tuning;
  DataFlags data;
  bool overwrite = false;
  bool quiet = false;
  HistoryFlags history;
};

int run_evaluate(const EvaluateFlags& flags) {
  evaluate::EvaluateOptions options;
  options.quick = flags.quick;
  prepare_data_decode(flags.data);
  // Bad input is refused before anything is measured.
  if (flags.device != "auto") {
    auto device = for_flag("--device", device::parse_device(flags.device));
    if (!device) return report_error(device.status());
    const Status usable =
        device::check_device(*device, device::explain_gpus(device::gather_gpu_facts()));
    if (!usable) return report_error(usable.with_context("--device"));
    options.device = *device;
  }
  // Where the sweep will run decides where --data decodes by default.
  const device::Device runs_on =
      options.device ? *options.device
                     : device::default_device(device::explain_gpus(device::gather_gpu_facts()));
  auto data = data_input(flags.data, runs_on);
  if (!data) return report_error(data.status());
  options.data = std::move(*data);
  auto tuning = tuning_options(flags.tuning);
  if (!tuning) return report_error(tuning.status());
  options.conv.algo = tuning->algo;
  // Without --tuning-cache the folder keeps its own.
  if (!flags.tuning.cache.empty()) options.conv.tuning = tuning->cache;
  options.folder = flags.out.empty() ? evaluate::default_folder() : flags.out;
  if (is_stdout_path(options.folder)) {
    return report_error(
        invalid_argument("--output -: names a folder, which standard output is not"));
  }
  std::error_code ec;
  const bool existed = std::filesystem::exists(options.folder, ec);
  // A folder this run made and then measured nothing into is removed: it would hold no results.
  const auto discard = [&](const Status& why) {
    if (!existed) std::filesystem::remove_all(options.folder, ec);
    return report_error(why);
  };
  if (Status s = check_history(flags.history); !s) return report_error(s);
  const std::array<NamedOutput, 2> read = {
      {history_input(flags.history), {"--tuning-cache", flags.tuning.cache}}};
  if (Status s = evaluate::prepare_folder(options.folder, flags.overwrite, read); !s) {
    return discard(s.with_context("--output"));
  }
  ProgressLine line(flags.quiet);
  auto plan = evaluate::plan_evaluation(options, [&](const std::string& text) { line.note(text); });
  if (!plan) return discard(plan.status());
  line.note(plan->chosen.why);

  InterruptGuard guard;
  auto evaluation =
      evaluate::run_evaluation(*plan, own_command_line(), line.sweep_callbacks(), guard.flag());
  if (!evaluation) return discard(evaluation.status());
  const auto& measured = evaluation->run.outcome.configurations;
  if (std::none_of(measured.begin(), measured.end(),
                   [](const results::Configuration& c) { return c.statistics.has_value(); })) {
    return discard(evaluation->status.is_ok()
                       ? error(Errc::internal, "no configuration was measured")
                       : evaluation->status);
  }
  store_in_history(flags.history, results::read_file(options.folder / "results.json"));
  std::fputs(evaluation->summary.c_str(), stdout);
  std::fflush(stdout);
  return sweep_exit_code(
      evaluation->status, evaluation->run.outcome, line,
      "dlprobe evaluate: interrupted; what was measured is in the results and report", false);
}

}  // namespace

Command add_evaluate_command(CLI::App& app) {
  auto flags = std::make_shared<EvaluateFlags>();
  CLI::App* sub = app.add_subcommand("evaluate", kEvaluateAbout);
  // -o is the output in every command: a file for doctor and report, this folder here (--out, the
  // name it had first, still works).
  sub->add_option("-o,--output,--out", flags->out,
                  "Folder for results.json, report.html and doctor.json (default: "
                  "dlprobe-evaluate-<UTC date>-<time>; refused when it holds results, unless "
                  "--overwrite)");
  add_overwrite_flag(*sub, flags->overwrite);
  add_history_flags(*sub, flags->history);
  sub->add_flag("--quick", flags->quick, "A shorter sweep (about a minute on a GPU)");
  option(*sub, "--device", flags->device,
         "auto (the first GPU when there is one, else the CPU), cpu or cuda:N");
  add_tuning_flags(*sub, flags->tuning);
  add_data_flags(*sub, flags->data);
  sub->add_flag("-q,--quiet", flags->quiet, "No progress on stderr");
  return {sub, [flags] { return run_evaluate(*flags); }};
}

}  // namespace dlprobe::cli
