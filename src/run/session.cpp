#include "dlprobe/run/session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string_view>
#include <thread>

#include "dlprobe/core/batch_search.h"
#include "dlprobe/core/command_line.h"
#include "dlprobe/core/files.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/doctor/versions.h"
#include "dlprobe/run/results.h"

namespace dlprobe::run {

namespace {

Status check_plan(const SessionPlan& p) {
  if (p.command.empty()) {
    return invalid_argument("no command: give it after '--', e.g. dlprobe run -- python3 train.py");
  }
  if (p.copies < 1) return invalid_argument("--copies: must be at least 1");
  if ((p.copies > 1 || !p.with.empty()) && (!p.axes.empty() || p.max_batch)) {
    return invalid_argument(
        fmt::format("{}: not with --sweep or --max-batch", p.with.empty() ? "--copies" : "--with"));
  }
  if (p.memory_limit_bytes && *p.memory_limit_bytes < (1ull << 20)) {
    return invalid_argument("--memory-limit: below 1 MiB");
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
    const MaxBatchPlan& mb = *p.max_batch;
    if (mb.limit < mb.start) return invalid_argument("--max-batch-limit: below --max-batch-start");
    // The search answers in multiples of the step (BatchSearch): one must lie in the range.
    if ((mb.start + mb.step - 1) / mb.step * mb.step > mb.limit) {
      return invalid_argument(
          fmt::format("--max-batch-step: no multiple of {} lies between --max-batch-start {} and "
                      "--max-batch-limit {}",
                      mb.step, mb.start, mb.limit));
    }
  } else if (mentions(p.command, "batch") && !batch_swept) {
    log_warn(
        "'{{batch}}' appears in the command but neither --sweep batch=... nor --max-batch "
        "is given; it is passed on as written");
  }
  return Status::ok();
}

// The GPUs the workload can see, as NVML indices: --gpu's; else CUDA_VISIBLE_DEVICES's (the run's
// --env, else ours), whose numbers are read in NVML's order (CUDA's with
// CUDA_DEVICE_ORDER=PCI_BUS_ID) and whose GPU-... UUIDs are matched, up to the first entry that
// names no GPU, as CUDA reads it; else GPU 0.
std::vector<unsigned> visible_gpus(const SessionPlan& p, nvml::Library& nvml) {
  if (!p.base.gpus.empty()) return p.base.gpus;
  std::optional<std::string> list;
  if (auto it = p.base.env_set.find("CUDA_VISIBLE_DEVICES"); it != p.base.env_set.end()) {
    list = it->second;
  } else if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    list = v;
  }
  if (!list) return {0};
  const unsigned count = nvml.device_count().value_or(0);
  std::vector<unsigned> out;
  std::string_view rest = *list;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string item(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    std::optional<unsigned> gpu;
    if (!item.empty() && std::all_of(item.begin(), item.end(),
                                     [](unsigned char c) { return std::isdigit(c) != 0; })) {
      if (item.size() < 4 && static_cast<unsigned>(std::stoi(item)) < count) {
        gpu = static_cast<unsigned>(std::stoi(item));
      }
    } else {
      for (unsigned i = 0; i < count && !gpu; ++i) {
        auto info = nvml.device_info(i);
        if (info && !item.empty() && info->uuid.rfind(item, 0) == 0) gpu = i;
      }
    }
    if (!gpu) break;
    out.push_back(*gpu);
  }
  return out;
}

// The frameworks' own switches for a memory limit, in every run's environment. The fraction is of
// the largest GPU the workload can see, so that the limit holds on each.
void set_memory_limit(SessionPlan& p) {
  const std::uint64_t limit = *p.memory_limit_bytes;
  p.base.env_set["DLPROBE_MEMORY_LIMIT_MIB"] = std::to_string(limit >> 20);
  std::optional<std::uint64_t> total;
  std::string why = "no NVML";
  if (p.base.nvml) {
    why = "the workload sees no GPU";
    std::set<std::uint64_t> totals;
    for (unsigned gpu : visible_gpus(p, *p.base.nvml)) {
      auto info = p.base.nvml->device_info(gpu);
      if (!info) {
        why = info.status().message();
        totals.clear();
        break;
      }
      why = "NVML gives no total";
      if (info->memory_total_bytes) totals.insert(*info->memory_total_bytes);
    }
    if (!totals.empty()) {
      total = *totals.rbegin();
      if (totals.size() > 1) {
        log_warn(
            "--memory-limit: the GPUs the workload sees differ in memory; "
            "XLA_PYTHON_CLIENT_MEM_FRACTION is of the largest, {}",
            format_size(*total));
      }
    }
  }
  if (!total || *total == 0) {
    log_warn(
        "--memory-limit: the GPU's memory is unknown ({}), so XLA_PYTHON_CLIENT_MEM_FRACTION is "
        "not set; DLPROBE_MEMORY_LIMIT_MIB is",
        why);
    return;
  }
  const double fraction = std::min(1.0, static_cast<double>(limit) / static_cast<double>(*total));
  p.base.env_set["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fmt::format("{:.4f}", fraction);
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
  if (plan.memory_limit_bytes) set_memory_limit(plan);
  Session session(std::move(plan), std::move(events));
  session.results_.context =
      results_context(own_command_line(), session.plan_.base.nvml, doctor::probe_versions());
  if (!session.plan_.results_json.empty()) {
    auto writer =
        results::ResultsWriter::create(session.plan_.results_json, session.results_.context);
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

RunOptions Session::options_for(const std::map<std::string, std::string>& point) {
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
  return o;
}

Result<RunResult> Session::run_point(const std::map<std::string, std::string>& point) {
  const RunOptions o = options_for(point);
  if (events_.started) events_.started(index_, point, o.argv);
  DLPROBE_ASSIGN_OR_RETURN(auto result, run_workload(o));
  result.params = point;
  if (events_.finished) events_.finished(index_, result);
  report_.runs.push_back(result);
  if (result.outcome == Outcome::interrupted) report_.interrupted = true;
  DLPROBE_RETURN_IF_ERROR(add_configuration(to_configuration(result, command_text())));
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
  results::Finding f;
  f.id = "max_batch";
  f.severity = Severity::info;
  f.message = outcome.largest_ok ? fmt::format("Largest batch that ran: {}", *outcome.largest_ok)
                                 : "No batch ran";
  f.evidence = fmt::format(
      "{}{} runs{}{}", point.empty() ? "" : point_label(point) + "; ", outcome.runs,
      outcome.smallest_failed ? fmt::format(", batch {} failed", *outcome.smallest_failed) : "",
      outcome.note.empty() ? "" : "; " + outcome.note);
  DLPROBE_RETURN_IF_ERROR(add_finding(std::move(f)));
  report_.max_batch.push_back(std::move(outcome));
  return write_details();
}

Status Session::add_configuration(results::Configuration configuration) {
  results_.configurations.push_back(configuration);
  return writer_ ? writer_->add(std::move(configuration)) : Status::ok();
}

Status Session::add_finding(results::Finding finding) {
  results_.findings.push_back(finding);
  return writer_ ? writer_->add_finding(std::move(finding)) : Status::ok();
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

Status Session::run_copies() {
  const int n = plan_.copies + static_cast<int>(plan_.with.size());
  report_.copies = n;
  std::vector<std::map<std::string, std::string>> points;
  std::vector<RunOptions> options;
  for (int i = 1; i <= n; ++i) {
    points.push_back({{"copy", std::to_string(i)}});
    RunOptions o = options_for(points.back());
    if (i > plan_.copies) {
      o.argv = {"/bin/sh", "-c", plan_.with[static_cast<std::size_t>(i - plan_.copies - 1)]};
    }
    // Our own descendants are every copy's: with each run following them (the subreaper's
    // tree), one copy's end would kill the others. Each follows its own process tree and group.
    o.subreaper = false;
    o.shared_gpu = true;
    options.push_back(std::move(o));
    if (events_.started) events_.started(index_, points.back(), options.back().argv);
  }
  // One thread per copy: each run is a loop that pumps its own workload's output and telemetry.
  std::vector<std::optional<Result<RunResult>>> results(static_cast<std::size_t>(n));
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < options.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = run_workload(options[i]); });
    }
  }
  std::vector<diagnosis::SharedCopyFacts> facts;
  std::optional<std::uint64_t> device_total;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (!*results[i]) return results[i]->status();
    RunResult result = std::move(*results[i]).value();
    result.params = points[i];
    if (events_.finished) events_.finished(index_ - n + static_cast<int>(i) + 1, result);
    diagnosis::SharedCopyFacts f;
    f.copy = static_cast<int>(i) + 1;
    f.ran = result.outcome == Outcome::ok;
    f.oom = result.outcome == Outcome::oom;
    f.outcome = std::string(outcome_name(result.outcome));
    f.items_per_s = result.steps.items_per_s;
    f.peak_gpu_bytes = result.gpu.peak_bytes;
    f.early_gpu_bytes = result.gpu.early_peak_bytes;
    f.framework = result.framework.framework;
    f.gpu = result.gpu.fullest_gpu;
    if (f.gpu) f.device_total_bytes = result.gpu.device_total_bytes;
    if (result.steps.measured_start_s && result.steps.measured_end_s) {
      f.window_start_s = result.steps.measured_start_s;
      f.window_end_s = result.steps.measured_end_s;
    } else if (result.gpu.figures_window) {
      f.window_start_s = result.gpu.figures_window->start_s;
      f.window_end_s = result.gpu.figures_window->end_s;
    }
    if (!f.framework && result.oom && result.oom->framework != Framework::unknown) {
      f.framework = std::string(framework_name(result.oom->framework));
    }
    facts.push_back(std::move(f));
    if (!device_total) device_total = result.gpu.device_total_bytes;
    if (result.outcome == Outcome::interrupted) report_.interrupted = true;
    DLPROBE_RETURN_IF_ERROR(add_configuration(to_configuration(result, command_text())));
    report_.runs.push_back(std::move(result));
  }
  for (auto& f : diagnosis::diagnose_shared_gpu(facts, device_total)) {
    report_.sweep_findings.push_back(std::move(f));
  }
  return write_details();
}

Status Session::run(const std::atomic<int>* interrupt) {
  interrupt_ = interrupt;
  const auto interrupted = [&] { return interrupt != nullptr && interrupt->load() > 0; };
  Status status;
  if (plan_.copies > 1 || !plan_.with.empty()) {
    status = run_copies();
  } else {
    for (const auto& point : sweep_points(plan_.axes)) {
      if (interrupted()) break;
      status = plan_.max_batch ? search_max_batch(point) : run_point(point).status();
      if (!status) break;
    }
  }
  if (interrupted()) report_.interrupted = true;
  add_sweep_findings();
  for (const auto& f : report_.sweep_findings) {
    if (Status s = add_finding(to_results_finding(f)); !s && status) status = s;
  }
  if (writer_) {
    if (Status s = writer_->finish().with_context("--json"); !s && status) status = s;
  }
  if (Status s = write_details(true); !s && status) status = s;
  return status;
}

}  // namespace dlprobe::run
