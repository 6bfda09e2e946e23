#include "dlprobe/run/session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "dlprobe/core/batch_search.h"
#include "dlprobe/core/command_line.h"
#include "dlprobe/core/files.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/run/results.h"

namespace dlprobe::run {

namespace {

Status check_plan(const SessionPlan& p) {
  if (p.command.empty()) {
    return invalid_argument("no command: give it after '--', e.g. dlprobe run -- python3 train.py");
  }
  std::vector<std::string> keys;
  for (const SweepAxis& axis : p.axes) {
    if (std::find(keys.begin(), keys.end(), axis.key) != keys.end()) {
      return invalid_argument(fmt::format("--sweep: key '{}' given twice", axis.key));
    }
    keys.push_back(axis.key);
    if (!mentions(p.command, axis.key)) {
      return invalid_argument(
          fmt::format("--sweep {}: '{{{}}}' does not appear in the command", axis.key, axis.key));
    }
  }
  const bool batch_swept = std::find(keys.begin(), keys.end(), "batch") != keys.end();
  if (p.max_batch) {
    if (!mentions(p.command, "batch")) {
      return invalid_argument("--max-batch: the command needs '{batch}' where the batch goes");
    }
    if (batch_swept) {
      return invalid_argument("--max-batch searches the batch itself: drop --sweep batch=...");
    }
    if (p.max_batch->limit < p.max_batch->start) {
      return invalid_argument("--max-batch-limit: below --max-batch-start");
    }
  } else if (mentions(p.command, "batch") && !batch_swept) {
    log_warn(
        "'{{batch}}' appears in the command but neither --sweep batch=... nor --max-batch "
        "is given; it is passed on as written");
  }
  return Status::ok();
}

std::string shell_join(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

Session::Session(SessionPlan plan, SessionEvents events)
    : plan_(std::move(plan)), events_(std::move(events)) {
  report_.command = plan_.command;
  report_.shell = plan_.shell;
  report_.started_at = results::iso8601_utc_now();
}

Result<Session> Session::start(SessionPlan plan, SessionEvents events) {
  DLPROBE_RETURN_IF_ERROR(check_plan(plan));
  if (!plan.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(plan.log_dir, ec);
    if (ec) {
      return error(Errc::io_error,
                   fmt::format("--log-dir: cannot create '{}': {}", plan.log_dir, ec.message()));
    }
  }
  if (auto lib = nvml::Library::open()) {
    plan.base.nvml = *lib;
  } else {
    log_warn("no GPU telemetry: {}", lib.status().message());
  }
  Session session(std::move(plan), std::move(events));
  if (!session.plan_.results_json.empty()) {
    auto writer = results::ResultsWriter::create(
        session.plan_.results_json, results_context(own_command_line(), session.plan_.base.nvml));
    if (!writer) return writer.status().with_context("--json");
    session.writer_ = std::move(writer).value();
  }
  if (Status s = become_subreaper(); s) {
    session.plan_.base.subreaper = true;
  } else {
    log_warn("{}: orphaned grandchildren of the workload will not be followed", s.message());
  }
  return session;
}

std::string Session::command_text() const {
  return (plan_.shell ? "sh -c " : "") + shell_join(plan_.command);
}

Status Session::write_details(bool last) const {
  // Standard output cannot be rewritten: it gets the details once, at the end.
  if (plan_.details_json.empty() || (is_stdout_path(plan_.details_json) && !last)) {
    return Status::ok();
  }
  return write_file_atomic(plan_.details_json, report_json(report_)).with_context("--details-json");
}

Result<RunResult> Session::run_point(const std::map<std::string, std::string>& point) {
  RunOptions o = plan_.base;
  const auto argv = substitute(plan_.command, point);
  o.argv = plan_.shell ? std::vector<std::string>{"/bin/sh", "-c", shell_join(argv)} : argv;
  for (const auto& [k, v] : point) {
    std::string key = "DLPROBE_" + k;
    for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    o.env_set[key] = v;
  }
  ++index_;
  if (!plan_.log_dir.empty()) {
    std::string stem = fmt::format("run{:03d}", index_);
    for (const auto& [k, v] : point) stem += fmt::format("-{}={}", k, v);
    for (char& c : stem) {
      if (c == '/' || c == ' ') c = '_';
    }
    o.stdout_log = plan_.log_dir + "/" + stem + ".stdout.log";
    o.stderr_log = plan_.log_dir + "/" + stem + ".stderr.log";
  }
  o.interrupt = interrupt_;
  if (events_.started) events_.started(index_, point, o.argv);
  DLPROBE_ASSIGN_OR_RETURN(auto result, run_workload(o));
  result.params = point;
  if (events_.finished) events_.finished(index_, result);
  report_.runs.push_back(result);
  if (result.outcome == Outcome::interrupted) report_.interrupted = true;
  if (writer_) DLPROBE_RETURN_IF_ERROR(writer_->add(to_configuration(result, command_text())));
  DLPROBE_RETURN_IF_ERROR(write_details());
  return result;
}

Status Session::search_max_batch(const std::map<std::string, std::string>& point) {
  const MaxBatchPlan& mb = *plan_.max_batch;
  // Doubling from the start; nothing below it is tried, as the user chose it.
  BatchSearch search({.guess = mb.start,
                      .lower = mb.start,
                      .upper = mb.limit,
                      .first_step = mb.start,
                      .granularity = mb.step,
                      .max_probes = mb.runs});
  MaxBatchOutcome outcome;
  outcome.params = point;
  while (auto batch = search.next()) {
    auto params = point;
    params["batch"] = std::to_string(*batch);
    DLPROBE_ASSIGN_OR_RETURN(auto r, run_point(params));
    if (r.outcome == Outcome::interrupted || r.outcome == Outcome::launch_error) {
      outcome.note = std::string("stopped: ") + std::string(outcome_name(r.outcome));
      break;
    }
    const bool ran = r.outcome == Outcome::ok;
    if (!ran && r.outcome != Outcome::oom) {
      // Some stacks fail without an OOM message when memory runs out (cuDNN workspace
      // errors), so the search treats any failure as "too large" but says so.
      outcome.note = fmt::format("batch {} failed without an out-of-memory message ({})", *batch,
                                 outcome_name(r.outcome));
    }
    search.report(*batch, ran);
  }
  outcome.largest_ok = search.largest_passed();
  outcome.smallest_failed = search.smallest_failed();
  outcome.converged = search.converged();
  outcome.runs = search.probes();
  if (!outcome.converged && outcome.note.empty() && outcome.largest_ok) {
    outcome.note =
        search.probes() >= mb.runs ? "--max-batch-runs reached" : "--max-batch-limit reached";
  }
  if (writer_) {
    results::Finding f;
    f.id = "max_batch";
    f.severity = Severity::info;
    f.message = outcome.largest_ok ? fmt::format("Largest batch that ran: {}", *outcome.largest_ok)
                                   : "No batch ran";
    f.evidence = fmt::format(
        "{}{} runs{}{}", point.empty() ? "" : point_label(point) + "; ", outcome.runs,
        outcome.smallest_failed ? fmt::format(", batch {} failed", *outcome.smallest_failed) : "",
        outcome.note.empty() ? "" : "; " + outcome.note);
    DLPROBE_RETURN_IF_ERROR(writer_->add_finding(std::move(f)));
  }
  report_.max_batch.push_back(std::move(outcome));
  return write_details();
}

void Session::add_sweep_findings() {
  // Batch-sweep findings for each group of runs that differ only in batch.
  std::map<std::map<std::string, std::string>, std::vector<diagnosis::SweepPointFacts>> groups;
  for (const auto& r : report_.runs) {
    auto it = r.params.find("batch");
    if (it == r.params.end()) continue;
    auto batch = parse_int(it->second, "batch", 1, 1LL << 40);
    if (!batch) continue;
    auto others = r.params;
    others.erase("batch");
    groups[others].push_back(
        {*batch, r.outcome == Outcome::ok, r.outcome == Outcome::oom, r.steps.items_per_s});
  }
  for (const auto& [others, points] : groups) {
    if (points.size() < 2) continue;
    for (auto f : diagnosis::diagnose_batch_sweep(points)) {
      if (!others.empty()) f.title += fmt::format(" ({})", point_label(others));
      report_.sweep_findings.push_back(std::move(f));
    }
  }
}

Status Session::run(const std::atomic<int>* interrupt) {
  interrupt_ = interrupt;
  const auto interrupted = [&] { return interrupt != nullptr && interrupt->load() > 0; };
  Status status;
  for (const auto& point : sweep_points(plan_.axes)) {
    if (interrupted()) break;
    status = plan_.max_batch ? search_max_batch(point) : run_point(point).status();
    if (!status) break;
  }
  if (interrupted()) report_.interrupted = true;
  add_sweep_findings();
  if (writer_) {
    for (const auto& f : report_.sweep_findings) {
      if (Status s = writer_->add_finding(to_results_finding(f)); !s && status) status = s;
    }
    if (Status s = writer_->finish().with_context("--json"); !s && status) status = s;
  }
  if (Status s = write_details(true); !s && status) status = s;
  return status;
}

}  // namespace dlprobe::run
