// `dlprobe run [options] -- CMD ARGS...`: runs any workload (a training script, a container) and
// measures it from outside; sweeps and --max-batch run one process per point. Results: a table on
// stdout, the shared results file (--json, dlprobe.results/1) and the run's own detail
// (--details-json, dlprobe.run/1: output tails, time line, max-batch searches), both rewritten
// after every point so that an interrupted sweep keeps what it has.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "dlprobe/core/files.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/results/writer.h"
#include "dlprobe/run/runner.h"
#include "run_results.h"

namespace dlprobe::cli {

namespace {

using namespace std::chrono_literals;

std::atomic<int> g_interrupts{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the signal handler needs a lock-free counter");

void on_signal(int) {
  g_interrupts.fetch_add(1);
}

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
  bool max_batch = false;
  std::string max_batch_start = "16";
  std::string max_batch_limit = "65536";
  std::string max_batch_step = "1";
  std::string max_batch_runs = "12";
  std::string log_dir;
  std::string json;
  std::string details_json;
  std::string gpus;
  std::string interval = "100ms";
  bool quiet = false;
};

struct Plan {
  run::RunOptions base;
  std::vector<run::SweepAxis> axes;  // without batch under --max-batch
  bool max_batch = false;
  std::int64_t mb_start = 16;
  std::int64_t mb_limit = 65536;
  std::int64_t mb_step = 1;
  int mb_runs = 12;
};

Result<Plan> plan_from(const RunFlags& f) {
  Plan p;
  if (f.command.empty()) {
    return invalid_argument("no command: give it after '--', e.g. dlprobe run -- python3 train.py");
  }
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
  DLPROBE_ASSIGN_OR_RETURN(p.base.interval, parse_duration(f.interval, "--interval"));
  if (!f.gpus.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto list, parse_list(f.gpus, "--gpu"));
    for (const auto& item : list) {
      DLPROBE_ASSIGN_OR_RETURN(auto gpu, parse_int(item, "--gpu", 0, 1023));
      p.base.gpus.push_back(static_cast<unsigned>(gpu));
    }
  }
  std::vector<std::string> keys;
  for (const auto& text : f.sweeps) {
    DLPROBE_ASSIGN_OR_RETURN(auto axis, run::parse_sweep(text));
    if (std::find(keys.begin(), keys.end(), axis.key) != keys.end()) {
      return invalid_argument(fmt::format("--sweep: key '{}' given twice", axis.key));
    }
    keys.push_back(axis.key);
    if (!run::mentions(f.command, axis.key)) {
      return invalid_argument(
          fmt::format("--sweep {}: '{{{}}}' does not appear in the command", axis.key, axis.key));
    }
    p.axes.push_back(std::move(axis));
  }
  p.max_batch = f.max_batch;
  if (p.max_batch) {
    if (!run::mentions(f.command, "batch")) {
      return invalid_argument("--max-batch: the command needs '{batch}' where the batch goes");
    }
    if (std::find(keys.begin(), keys.end(), "batch") != keys.end()) {
      return invalid_argument("--max-batch searches the batch itself: drop --sweep batch=...");
    }
    DLPROBE_ASSIGN_OR_RETURN(p.mb_start,
                             parse_int(f.max_batch_start, "--max-batch-start", 1, 1LL << 40));
    DLPROBE_ASSIGN_OR_RETURN(p.mb_limit,
                             parse_int(f.max_batch_limit, "--max-batch-limit", 1, 1LL << 40));
    DLPROBE_ASSIGN_OR_RETURN(p.mb_step,
                             parse_int(f.max_batch_step, "--max-batch-step", 1, 1LL << 30));
    DLPROBE_ASSIGN_OR_RETURN(auto runs, parse_int(f.max_batch_runs, "--max-batch-runs", 1, 100));
    p.mb_runs = static_cast<int>(runs);
    if (p.mb_limit < p.mb_start) {
      return invalid_argument("--max-batch-limit: below --max-batch-start");
    }
  } else if (run::mentions(f.command, "batch") &&
             std::find(keys.begin(), keys.end(), "batch") == keys.end()) {
    log_warn(
        "'{{batch}}' appears in the command but neither --sweep batch=... nor --max-batch "
        "is given; it is passed on as written");
  }
  p.base.echo = !f.quiet;
  return p;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string shell_join(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

class Runner {
 public:
  Runner(const RunFlags& flags, Plan plan, std::vector<std::string> command_line)
      : flags_(flags), plan_(std::move(plan)), command_line_(std::move(command_line)) {
    report_.command = flags.command;
    report_.shell = flags.shell;
    report_.started_at = utc_now();
  }

  // Runs one point; false when the user interrupted (nothing more should run).
  Result<run::RunResult> run_point(const std::map<std::string, std::string>& params) {
    run::RunOptions o = plan_.base;
    const auto argv = run::substitute(flags_.command, params);
    o.argv = flags_.shell ? std::vector<std::string>{"/bin/sh", "-c", shell_join(argv)} : argv;
    for (const auto& [k, v] : params) {
      std::string key = "DLPROBE_" + k;
      for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      o.env_set[key] = v;
    }
    ++index_;
    if (!flags_.log_dir.empty()) {
      std::string stem = fmt::format("run{:03d}", index_);
      for (const auto& [k, v] : params) stem += fmt::format("-{}={}", k, v);
      for (char& c : stem) {
        if (c == '/' || c == ' ') c = '_';
      }
      o.stdout_log = flags_.log_dir + "/" + stem + ".stdout.log";
      o.stderr_log = flags_.log_dir + "/" + stem + ".stderr.log";
    }
    o.nvml = nvml_;
    o.subreaper = subreaper_;
    o.interrupt = &g_interrupts;
    const std::string label =
        params.empty() ? "" : fmt::format(" {}", fmt::join(labels(params), " "));
    std::fprintf(stderr, "dlprobe run [%d]%s: %s\n", index_, label.c_str(),
                 shell_join(o.argv).c_str());
    DLPROBE_ASSIGN_OR_RETURN(auto result, run::run_workload(o));
    result.params = params;
    std::fprintf(stderr, "dlprobe run [%d]%s: %s%s\n", index_, label.c_str(),
                 std::string(run::outcome_name(result.outcome)).c_str(),
                 result.steps.items_per_s
                     ? fmt::format(", {:.1f} items/s", *result.steps.items_per_s).c_str()
                     : "");
    if (result.outcome == run::Outcome::launch_error) {
      report_error(error(Errc::not_found, result.launch_error));
    }
    report_.runs.push_back(result);
    if (result.outcome == run::Outcome::interrupted) report_.interrupted = true;
    if (writer_) DLPROBE_RETURN_IF_ERROR(writer_->add(to_configuration(result, command_text())));
    DLPROBE_RETURN_IF_ERROR(write_details());
    return result;
  }

  static std::vector<std::string> labels(const std::map<std::string, std::string>& params) {
    std::vector<std::string> out;
    for (const auto& [k, v] : params) out.push_back(k + "=" + v);
    return out;
  }

  std::string command_text() const {
    return (flags_.shell ? "sh -c " : "") + shell_join(flags_.command);
  }

  Status write_details() {
    if (flags_.details_json.empty()) return Status::ok();
    return write_file_atomic(flags_.details_json, run::report_json(report_))
        .with_context("--details-json");
  }

  Status search_max_batch(const std::map<std::string, std::string>& outer) {
    run::MaxBatchSearch search(plan_.mb_start, plan_.mb_limit, plan_.mb_step, plan_.mb_runs);
    run::MaxBatchOutcome outcome;
    outcome.params = outer;
    while (auto batch = search.next()) {
      auto params = outer;
      params["batch"] = std::to_string(*batch);
      DLPROBE_ASSIGN_OR_RETURN(auto r, run_point(params));
      if (r.outcome == run::Outcome::interrupted || r.outcome == run::Outcome::launch_error) {
        outcome.note = std::string("stopped: ") + std::string(run::outcome_name(r.outcome));
        break;
      }
      const bool ran = r.outcome == run::Outcome::ok;
      if (!ran && r.outcome != run::Outcome::oom) {
        // Some stacks fail without an OOM message when memory runs out (cuDNN workspace
        // errors), so the search treats any failure as "too large" but says so.
        outcome.note = fmt::format("batch {} failed without an out-of-memory message ({})", *batch,
                                   run::outcome_name(r.outcome));
      }
      search.report(*batch, ran);
    }
    outcome.largest_ok = search.largest_ok();
    outcome.smallest_failed = search.smallest_failed();
    outcome.converged = search.converged();
    outcome.runs = search.runs();
    if (!outcome.converged && outcome.note.empty() && outcome.largest_ok) {
      outcome.note =
          search.runs() >= plan_.mb_runs ? "--max-batch-runs reached" : "--max-batch-limit reached";
    }
    if (writer_) {
      results::Finding f;
      f.id = "max_batch";
      f.severity = results::Severity::info;
      f.message = outcome.largest_ok
                      ? fmt::format("Largest batch that ran: {}", *outcome.largest_ok)
                      : "No batch ran";
      f.evidence = fmt::format(
          "{}{} runs{}{}", outer.empty() ? "" : fmt::format("{}; ", fmt::join(labels(outer), " ")),
          outcome.runs,
          outcome.smallest_failed ? fmt::format(", batch {} failed", *outcome.smallest_failed) : "",
          outcome.note.empty() ? "" : "; " + outcome.note);
      DLPROBE_RETURN_IF_ERROR(writer_->add_finding(std::move(f)));
    }
    report_.max_batch.push_back(std::move(outcome));
    return write_details();
  }

  // Batch-sweep findings for each group of runs that differ only in batch.
  void sweep_findings() {
    std::map<std::map<std::string, std::string>, std::vector<diagnosis::SweepPointFacts>> groups;
    for (const auto& r : report_.runs) {
      auto it = r.params.find("batch");
      if (it == r.params.end()) continue;
      auto batch = parse_int(it->second, "batch", 1, 1LL << 40);
      if (!batch) continue;
      auto others = r.params;
      others.erase("batch");
      groups[others].push_back({*batch, r.outcome == run::Outcome::ok,
                                r.outcome == run::Outcome::oom, r.steps.items_per_s});
    }
    for (const auto& [others, points] : groups) {
      if (points.size() < 2) continue;
      for (auto f : diagnosis::diagnose_batch_sweep(points)) {
        if (!others.empty()) f.title += fmt::format(" ({})", fmt::join(labels(others), " "));
        report_.sweep_findings.push_back(std::move(f));
      }
    }
  }

  int run_all() {
    if (!flags_.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(flags_.log_dir, ec);
      if (ec) {
        return report_error(error(Errc::io_error, fmt::format("--log-dir: cannot create '{}': {}",
                                                              flags_.log_dir, ec.message())));
      }
    }
    if (auto lib = nvml::Library::open()) {
      nvml_ = *lib;
    } else {
      log_warn("no GPU telemetry: {}", lib.status().message());
    }
    if (!flags_.json.empty()) {
      auto writer = results::ResultsWriter::create(flags_.json, run_context(command_line_, nvml_));
      if (!writer) return report_error(writer.status().with_context("--json"));
      writer_ = std::move(writer).value();
    }
    if (Status s = run::become_subreaper(); s) {
      subreaper_ = true;
    } else {
      log_warn("{}: orphaned grandchildren of the workload will not be followed", s.message());
    }
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    struct sigaction old_int {};
    struct sigaction old_term {};
    sigaction(SIGINT, &action, &old_int);
    sigaction(SIGTERM, &action, &old_term);

    Status status;
    for (const auto& point : run::sweep_points(plan_.axes)) {
      if (g_interrupts.load() > 0) break;
      if (plan_.max_batch) {
        status = search_max_batch(point);
      } else {
        status = run_point(point).status();
      }
      if (!status) break;
    }
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    if (g_interrupts.load() > 0) report_.interrupted = true;
    sweep_findings();
    if (writer_) {
      for (const auto& f : report_.sweep_findings) {
        if (Status s = writer_->add_finding(to_results_finding(f)); !s && status) status = s;
      }
    }
    if (Status s = write_details(); !s && status) status = s;
    std::fflush(stderr);
    std::fputs(run::report_table(report_).c_str(), stdout);
    std::fflush(stdout);
    if (!status) return report_error(status);

    bool launch_failed = false;
    bool any_failed = false;
    for (const auto& r : report_.runs) {
      launch_failed = launch_failed || r.outcome == run::Outcome::launch_error;
      any_failed = any_failed || r.outcome != run::Outcome::ok;
    }
    if (launch_failed) return kExitError;
    if (report_.interrupted) return kExitFailure;
    // A max-batch search expects failures; it succeeded when it found a batch that runs.
    if (plan_.max_batch) {
      for (const auto& m : report_.max_batch) {
        if (!m.largest_ok) return kExitFailure;
      }
      return kExitOk;
    }
    return any_failed ? kExitFailure : kExitOk;
  }

 private:
  const RunFlags& flags_;
  Plan plan_;
  std::vector<std::string> command_line_;
  std::optional<results::ResultsWriter> writer_;
  run::RunReport report_;
  std::shared_ptr<nvml::Library> nvml_;
  bool subreaper_ = false;
  int index_ = 0;
};

// The command line exactly as typed, for the results' context: main() does not hand argv to
// subcommands, and /proc keeps it.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

int run_run(const RunFlags& flags, const std::vector<std::string>& command_line) {
  auto plan = plan_from(flags);
  if (!plan) return report_error(plan.status());
  g_interrupts = 0;
  Runner runner(flags, std::move(plan).value(), command_line);
  return runner.run_all();
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Run any workload (-- CMD ARGS...) and measure it: throughput from its output "
      "(docs/external.md), GPU memory of its processes, utilisation, OOM, crashes; sweeps");
  sub->add_flag("--shell", flags->shell, "Run the command through /bin/sh -c");
  sub->add_option("--timeout", flags->timeout,
                  "Stop the workload after this long (SIGTERM, then SIGKILL after --kill-grace)");
  sub->add_option("--kill-grace", flags->kill_grace,
                  "Wait between SIGINT/SIGTERM and the next signal (default 10s)");
  sub->add_option("--hang-after", flags->hang_after,
                  "Call it a hang after this long without output and without GPU activity");
  sub->add_option("--warmup-steps", flags->warmup_steps,
                  "Steps dropped before measuring (default 5; the workload can mark them)");
  sub->add_option("--batch", flags->batch, "Items per step when the workload does not say");
  sub->add_option("--throughput-regex", flags->throughput_regex,
                  "Throughput from output lines: a named group (?<ips>...) in items/s, or "
                  "(?<step_s>...) in seconds per step with --batch");
  sub->add_option("--sweep", flags->sweeps,
                  "KEY=V1,V2,...: one run per value, replacing {KEY} in the command; repeat for "
                  "all combinations")
      // One value per --sweep, so "--sweep batch=8,16 -- cmd" leaves '--' to end the options.
      ->allow_extra_args(false);
  sub->add_flag("--max-batch", flags->max_batch,
                "Find the largest {batch} that runs: double until failure, then bisect");
  sub->add_option("--max-batch-start", flags->max_batch_start, "First batch tried (default 16)");
  sub->add_option("--max-batch-limit", flags->max_batch_limit,
                  "Largest batch tried (default 65536)");
  sub->add_option("--max-batch-step", flags->max_batch_step,
                  "Answer to a multiple of this (default 1)");
  sub->add_option("--max-batch-runs", flags->max_batch_runs,
                  "At most this many runs per search (default 12)");
  sub->add_option("--log-dir", flags->log_dir, "Keep each run's full stdout and stderr here");
  sub->add_option("--json", flags->json,
                  "Write the results file (schema dlprobe.results/1, for report and compare), "
                  "rewritten after every run");
  sub->add_option("--details-json", flags->details_json,
                  "Write everything run measured (schema dlprobe.run/1: output tails, time line, "
                  "max-batch searches)");
  sub->add_option("--gpu", flags->gpus, "GPU indices to watch, e.g. 0,1 (default: all)");
  sub->add_option("-i,--interval", flags->interval, "Sampling interval (default 100ms)");
  sub->add_flag("-q,--quiet", flags->quiet, "Do not pass the workload's output through");
  sub->add_option("command", flags->command, "The workload, after '--'")->expected(-1);
  return {sub, [flags] { return run_run(*flags, own_command_line()); }};
}

}  // namespace dlprobe::cli
