// `dlprobe run [options] -- CMD ARGS...`: runs any workload (a training script, a container) and
// measures it from outside; sweeps and --max-batch run one process per point. Results: a table on
// stdout, the shared results file (--json, dlprobe.results/1) and the run's own detail
// (--details-json, dlprobe.run/1: output tails, time line, max-batch searches), both rewritten
// after every point so that an interrupted sweep keeps what it has (run::Session).
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "commands.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/units.h"
#include "dlprobe/run/session.h"
#include "history_flags.h"

namespace dlprobe::cli {

namespace {

using namespace std::chrono_literals;

// What `dlprobe --help` and `dlprobe run --help` say the command does.
constexpr const char* kRunAbout =
    "Run any workload (-- CMD ARGS...) and measure it: throughput from its output "
    "(docs/external.md), GPU memory of its processes, utilisation, OOM, crashes; sweeps";

struct RunFlags {
  std::vector<std::string> command;
  bool shell = false;
  std::string timeout;
  std::string kill_grace = "10s";
  std::string hang_after;
  std::string warmup_steps = "5";
  std::string batch;
  std::string throughput_regex;
  std::vector<std::string> sweeps;
  std::vector<std::string> with;
  bool max_batch = false;
  // Empty: not given (run::MaxBatchPlan holds the defaults).
  std::string max_batch_start;
  std::string max_batch_limit;
  std::string max_batch_step;
  std::string max_batch_runs;
  std::string copies;
  std::string memory_limit;
  std::string log_dir;
  std::string json;
  std::string details_json;
  bool overwrite = false;
  std::string gpus;
  std::string interval = "100ms";
  bool quiet = false;
  HistoryFlags history;
};

Result<run::SessionPlan> plan_from(const RunFlags& f) {
  run::SessionPlan p;
  p.command = f.command;
  p.shell = f.shell;
  if (!f.timeout.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.base.timeout, parse_duration(f.timeout, "--timeout"));
    if (*p.base.timeout <= 0ns) return invalid_argument("--timeout: must be longer than 0");
  }
  DLPROBE_ASSIGN_OR_RETURN(p.base.kill_grace, parse_duration(f.kill_grace, "--kill-grace"));
  if (!f.hang_after.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.base.hang_after, parse_duration(f.hang_after, "--hang-after"));
    if (*p.base.hang_after <= 0ns) return invalid_argument("--hang-after: must be longer than 0");
  }
  DLPROBE_ASSIGN_OR_RETURN(p.base.warmup_steps,
                           parse_int(f.warmup_steps, "--warmup-steps", 0, 1'000'000));
  if (!f.batch.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.base.batch, parse_int(f.batch, "--batch", 1, 1LL << 40));
  }
  if (!f.throughput_regex.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.base.throughput_regex,
                             run::ThroughputRegex::compile(f.throughput_regex));
  }
  DLPROBE_ASSIGN_OR_RETURN(p.base.interval, parse_sampling_interval(f.interval));
  if (!f.gpus.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.base.gpus, parse_gpu_indices(f.gpus));
  }
  p.base.echo = !f.quiet;
  for (const auto& text : f.sweeps) {
    DLPROBE_ASSIGN_OR_RETURN(auto axis, run::parse_sweep(text));
    p.axes.push_back(std::move(axis));
  }
  struct SearchFlag {
    const char* name;
    const std::string& text;
    std::int64_t max;
    std::int64_t* into;
  };
  run::MaxBatchPlan mb;
  std::int64_t runs = mb.runs;
  const SearchFlag search[] = {{"--max-batch-start", f.max_batch_start, 1LL << 40, &mb.start},
                               {"--max-batch-limit", f.max_batch_limit, 1LL << 40, &mb.limit},
                               {"--max-batch-step", f.max_batch_step, 1LL << 30, &mb.step},
                               {"--max-batch-runs", f.max_batch_runs, 100, &runs}};
  for (const SearchFlag& flag : search) {
    if (flag.text.empty()) continue;
    // Ignored, the bound would let the user believe a search bounded so had run.
    if (!f.max_batch) return invalid_argument(fmt::format("{}: only with --max-batch", flag.name));
    DLPROBE_ASSIGN_OR_RETURN(*flag.into, parse_int(flag.text, flag.name, 1, flag.max));
  }
  mb.runs = static_cast<int>(runs);
  if (f.max_batch) p.max_batch = mb;
  if (!f.copies.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto copies, parse_int(f.copies, "--copies", 1, 64));
    p.copies = static_cast<int>(copies);
  }
  p.with = f.with;
  if (!f.memory_limit.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(p.memory_limit_bytes, parse_size(f.memory_limit, "--memory-limit"));
  }
  p.log_dir = f.log_dir;
  p.results_json = f.json;
  p.details_json = f.details_json;
  return p;
}

std::string joined(const std::vector<std::string>& args) {
  return fmt::format("{}", fmt::join(args, " "));
}

// A line on stderr as each run starts and ends: "dlprobe run [2] batch=64: python3 train.py ...".
run::SessionEvents progress_lines() {
  const auto prefix = [](int index, const std::map<std::string, std::string>& point) {
    return fmt::format("dlprobe run [{}]{}", index,
                       point.empty() ? "" : " " + run::point_label(point));
  };
  run::SessionEvents events;
  events.started = [prefix](int index, const std::map<std::string, std::string>& point,
                            const std::vector<std::string>& argv) {
    std::fprintf(stderr, "%s: %s\n", prefix(index, point).c_str(), joined(argv).c_str());
  };
  events.finished = [prefix](int index, const run::RunResult& r) {
    std::fprintf(
        stderr, "%s: %s%s\n", prefix(index, r.params).c_str(),
        std::string(run::outcome_name(r.outcome)).c_str(),
        r.steps.items_per_s ? fmt::format(", {:.1f} items/s", *r.steps.items_per_s).c_str() : "");
    if (r.outcome == run::Outcome::launch_error) {
      report_error(error(Errc::not_found, r.launch_error));
    }
  };
  return events;
}

int exit_code(const run::RunReport& report, bool max_batch) {
  bool launch_failed = false;
  bool any_failed = false;
  for (const auto& r : report.runs) {
    launch_failed = launch_failed || r.outcome == run::Outcome::launch_error;
    any_failed = any_failed || r.outcome != run::Outcome::ok;
  }
  if (launch_failed) return kExitError;
  if (report.interrupted) return kExitFailure;
  // A max-batch search expects failures; it succeeded when it found a batch that runs.
  if (max_batch) {
    for (const auto& m : report.max_batch) {
      if (!m.largest_ok) return kExitFailure;
    }
    return kExitOk;
  }
  return any_failed ? kExitFailure : kExitOk;
}

int run_run(const RunFlags& flags) {
  // `dlprobe run ... | head`: when the reader of our stdout goes away, SIGPIPE would end dlprobe
  // with the workload left running (re-parented to init) and no results written. Ignored, the
  // write fails with EPIPE instead: the echo stops and the run is measured to its end. The
  // workload starts with SIGPIPE at its default again (ChildProcess::spawn).
  signal(SIGPIPE, SIG_IGN);
  if (Status s = prepare_outputs({{"--json", flags.json}, {"--details-json", flags.details_json}},
                                 flags.overwrite, {history_input(flags.history)});
      !s) {
    return report_error(s);
  }
  if (Status s = check_history(flags.history); !s) return report_error(s);
  auto plan = plan_from(flags);
  if (!plan) return report_error(plan.status());
  auto session = run::Session::start(std::move(plan).value(), progress_lines());
  if (!session) return report_error(session.status());
  Status status;
  {
    // Counted: the workload runs in processes of its own, which the session must stop; a second
    // Ctrl-C cuts their grace period short rather than leaving them behind.
    InterruptGuard guard(InterruptGuard::Second::counted);
    status = session->run(guard.flag());
  }
  store_in_history(flags.history, session->results());
  std::fflush(stderr);
  std::fputs(run::report_table(session->report()).c_str(), stdout);
  std::fflush(stdout);
  if (!status) return report_error(status);
  return exit_code(session->report(), flags.max_batch);
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* sub = app.add_subcommand("run", kRunAbout);
  sub->add_flag("--shell", flags->shell, "Run the command through /bin/sh -c");
  add_text_options<RunFlags>(
      *sub, *flags,
      {{"--timeout", &RunFlags::timeout,
        "Stop the workload after this long (SIGTERM, then SIGKILL after --kill-grace)"},
       {"--kill-grace", &RunFlags::kill_grace, "Wait between SIGINT/SIGTERM and the next signal"},
       {"--hang-after", &RunFlags::hang_after,
        "Call it a hang after this long without output and without GPU activity"},
       {"--warmup-steps", &RunFlags::warmup_steps,
        "Steps dropped before measuring (the workload can mark them)"},
       {"--batch", &RunFlags::batch, "Items per step when the workload does not say"},
       {"--throughput-regex", &RunFlags::throughput_regex,
        "Throughput from output lines: a named group (?<ips>...) in items/s, or "
        "(?<step_s>...) in seconds per step with --batch"}});
  sub->add_option("--sweep", flags->sweeps,
                  "KEY=V1,V2,...: one run per value, replacing {KEY} in the command; repeat for "
                  "all combinations")
      // One value per --sweep, so "--sweep batch=8,16 -- cmd" leaves '--' to end the options.
      ->allow_extra_args(false);
  sub->add_option("--with", flags->with,
                  "'CMD ...': another command (run by /bin/sh -c) started together with the "
                  "command on the GPU, as with --copies; repeat for more")
      ->allow_extra_args(false);
  sub->add_flag("--max-batch", flags->max_batch,
                "Find the largest {batch} that runs: double until failure, then bisect");
  add_text_options<RunFlags>(
      *sub, *flags,
      {{"--max-batch-start", &RunFlags::max_batch_start,
        "First batch tried (rounded up to a multiple of --max-batch-step)"},
       {"--max-batch-limit", &RunFlags::max_batch_limit, "Largest batch tried"},
       {"--max-batch-step", &RunFlags::max_batch_step, "Answer to a multiple of this"},
       {"--max-batch-runs", &RunFlags::max_batch_runs, "At most this many runs per search"},
       {"--copies", &RunFlags::copies,
        "Start N copies of the command together on the GPU ({copy} and DLPROBE_COPY: 1..N) and "
        "report their combined throughput, each one's memory and preallocation"},
       {"--memory-limit", &RunFlags::memory_limit,
        "GPU memory each run may use (e.g. 24GiB), through the frameworks' own switches: "
        "DLPROBE_MEMORY_LIMIT_MIB for the example scripts, XLA_PYTHON_CLIENT_MEM_FRACTION"},
       {"--log-dir", &RunFlags::log_dir, "Keep each run's full stdout and stderr here"},
       {"--json", &RunFlags::json,
        "Write the results file (schema dlprobe.results/1, for report and compare), "
        "rewritten after every run"},
       {"--details-json", &RunFlags::details_json,
        "Write everything run measured (schema dlprobe.run/1: output tails, time line, "
        "max-batch searches); '-' for either: standard output, at the end"},
       {"--gpu", &RunFlags::gpus, "GPU indices to watch, e.g. 0,1 (default: all)"},
       {"-i,--interval", &RunFlags::interval,
        "Sampling interval (nvidia-smi dmon's -i picks the GPU; here --gpu does)"}});
  // The search's defaults are run::MaxBatchPlan's, which the empty flags leave in place.
  const run::MaxBatchPlan plan;
  sub->get_option("--max-batch-start")->default_str(std::to_string(plan.start));
  sub->get_option("--max-batch-limit")->default_str(std::to_string(plan.limit));
  sub->get_option("--max-batch-step")->default_str(std::to_string(plan.step));
  sub->get_option("--max-batch-runs")->default_str(std::to_string(plan.runs));
  add_overwrite_flag(*sub, flags->overwrite);
  add_history_flags(*sub, flags->history);
  sub->add_flag("-q,--quiet", flags->quiet, "Do not pass the workload's output through");
  sub->add_option("command", flags->command, "The workload, after '--'")->expected(-1);
  return {sub, [flags] { return run_run(*flags); }};
}

}  // namespace dlprobe::cli
