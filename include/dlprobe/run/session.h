// One `dlprobe run` invocation: one process per sweep point, or a search for the largest batch at
// each point, with the shared results file (dlprobe.results/1) and the run's own details
// (dlprobe.run/1) rewritten after every run so that an interrupted sweep keeps what it has, and the
// sweep's findings at the end. It prints nothing of its own: the caller hears of each run through
// SessionEvents.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/results/writer.h"
#include "dlprobe/run/runner.h"

namespace dlprobe::run {

// --max-batch: the largest {batch} that runs, from `start` by doubling until a run fails (or
// `limit`), then bisection to a multiple of `step`, within `runs` runs per point.
struct MaxBatchPlan {
  std::int64_t start = 16;
  std::int64_t limit = 65536;
  std::int64_t step = 1;
  int runs = 12;
};

struct SessionPlan {
  std::vector<std::string> command;  // as given, with {key} templates
  bool shell = false;                // run it through /bin/sh -c
  // Options of every run; the session sets argv, env_set, the logs, nvml, subreaper and interrupt.
  RunOptions base;
  std::vector<SweepAxis> axes;  // without batch under max_batch
  std::optional<MaxBatchPlan> max_batch;
  // --copies: this many copies of the command started together (sharing the GPU), "{copy}" in
  // the command and DLPROBE_COPY in the environment set to each one's number from 1; not with
  // axes or max_batch.
  int copies = 1;
  // --with: other commands (shell text, run by /bin/sh -c) started together with the copies on
  // the same GPU; they are the copies numbered after the command's, in order.
  std::vector<std::string> with;
  // --memory-limit: each run is told to use at most this much GPU memory through the frameworks'
  // own switches: DLPROBE_MEMORY_LIMIT_MIB (read by the example scripts, which pass it to
  // PyTorch's per-process memory fraction or TensorFlow's logical device memory_limit) and
  // XLA_PYTHON_CLIENT_MEM_FRACTION (any JAX program; needs the GPU's total from NVML).
  std::optional<std::uint64_t> memory_limit_bytes;
  std::string log_dir;  // each run's full stdout and stderr; empty: not kept
  // The outputs, checked by the caller before start (core's check_outputs); "-" is standard
  // output, written once when the session ends.
  std::string results_json;  // the results file; empty: none
  std::string details_json;  // the details; empty: none
};

// What the caller hears: a run starts (its number from 1, its sweep point, the command as it
// runs), and a run ended (its result holds the point).
struct SessionEvents {
  std::function<void(int index, const std::map<std::string, std::string>& point,
                     const std::vector<std::string>& argv)>
      started;
  std::function<void(int index, const RunResult& result)> finished;
};

class Session {
 public:
  // Checks the plan (each swept key appears in the command, once; --max-batch has a {batch} of its
  // own), creates the log folder and the results file, opens NVML (a warning where there is none)
  // and makes this process the subreaper of the workload's orphans (a warning where it cannot): an
  // error here comes before any run.
  static Result<Session> start(SessionPlan plan, SessionEvents events);

  // Runs every point in turn until the end, an error or an interrupt (`interrupt` counts signals,
  // as InterruptGuard's flag: the first stops the run under way, a second cuts its grace period);
  // then adds the sweep's findings. The report keeps what ran whatever stopped it.
  Status run(const std::atomic<int>* interrupt);

  const RunReport& report() const { return report_; }
  // What the results file holds (or would, without one): the context, a configuration per run
  // and the findings, for the history.
  const results::Document& results() const { return results_; }

 private:
  Session(SessionPlan plan, SessionEvents events);
  Result<RunResult> run_point(const std::map<std::string, std::string>& point);
  Status search_max_batch(const std::map<std::string, std::string>& point);
  // The copies together, then the shared-GPU findings.
  Status run_copies();
  RunOptions options_for(const std::map<std::string, std::string>& point);
  void add_sweep_findings();
  // Records a run's configuration, or a finding about the run as a whole, in the results file
  // too when there is one.
  Status add_configuration(results::Configuration configuration);
  Status add_finding(results::Finding finding);
  // Rewrites the details file; with `last`, standard output too ("-", written once).
  Status write_details(bool last = false) const;
  std::string command_text() const;

  SessionPlan plan_;
  SessionEvents events_;
  std::optional<results::ResultsWriter> writer_;
  results::Document results_;
  RunReport report_;
  const std::atomic<int>* interrupt_ = nullptr;
  int index_ = 0;
};

}  // namespace dlprobe::run
