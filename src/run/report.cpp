#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "dlprobe/core/build_info.h"
#include "dlprobe/core/json_optional.h"
#include "dlprobe/core/units.h"
#include "dlprobe/run/runner.h"

namespace dlprobe::run {

namespace {

// Keys in the order written, for a file people read.
using Json = nlohmann::ordered_json;

Json finding_json(const diagnosis::Finding& f) {
  return {{"id", f.id},       {"severity", severity_name(f.severity)},
          {"title", f.title}, {"evidence", f.evidence},
          {"fix", f.fix},     {"numbers", f.numbers}};
}

Json per_gpu_json(const std::vector<PerGpuFigures>& gpus) {
  Json out = Json::array();
  for (const auto& p : gpus) {
    out.push_back({{"index", p.index},
                   {"name", p.name},
                   {"peak_bytes", p.peak_bytes},
                   {"total_bytes", p.total_bytes},
                   {"util_median_pct", p.util_median_pct},
                   {"power_median_w", p.power_median_w}});
  }
  return out;
}

// A time-line point's GPUs folded into the machine's: utilisation averaged, memory and power
// summed, the hottest temperature, the highest SM clock, every clock event (each GPU's own series
// are in the results file's telemetry).
struct MachineReading {
  std::optional<double> util_pct;
  std::optional<std::uint64_t> used_bytes;
  std::optional<double> power_w;
  std::optional<double> temperature_c;
  std::optional<unsigned> sm_clock_mhz;
  std::optional<std::uint64_t> clock_event_reasons;
};

MachineReading machine_reading(const TelemetryPoint& p) {
  MachineReading m;
  double util_sum = 0;
  std::size_t util_count = 0;
  const auto fold = [](auto& total, const auto& value, auto combine) {
    if (value) total = total ? combine(*total, *value) : *value;
  };
  const auto plus = [](auto a, auto b) { return a + b; };
  const auto most = [](auto a, auto b) { return std::max(a, b); };
  for (const auto& [gpu, g] : p.gpus) {
    if (g.util_pct) {
      util_sum += *g.util_pct;
      ++util_count;
    }
    fold(m.used_bytes, g.used_bytes, plus);
    fold(m.power_w, g.power_w, plus);
    fold(m.temperature_c, g.temperature_c, most);
    fold(m.sm_clock_mhz, g.sm_clock_mhz, most);
    fold(m.clock_event_reasons, g.clock_event_reasons, [](auto a, auto b) { return a | b; });
  }
  if (util_count > 0) m.util_pct = util_sum / static_cast<double>(util_count);
  return m;
}

Json run_json(const RunResult& r) {
  Json findings = Json::array();
  for (const auto& f : r.findings) findings.push_back(finding_json(f));
  Json timeline = Json::array();
  for (const auto& p : r.timeline) {
    const MachineReading m = machine_reading(p);
    timeline.push_back({{"t_s", p.t_s},
                        {"gpu_util_pct", m.util_pct},
                        {"workload_sm_util_pct", p.tree_sm_util_pct},
                        {"workload_gpu_bytes", p.workload_gpu_bytes},
                        {"device_used_bytes", m.used_bytes},
                        {"power_w", m.power_w},
                        {"temperature_c", m.temperature_c},
                        {"sm_clock_mhz", m.sm_clock_mhz},
                        {"clock_event_reasons", m.clock_event_reasons},
                        {"host_cpu_pct", p.host_cpu_pct},
                        {"busiest_process_cpu_pct", p.busiest_process_cpu_pct},
                        {"rss_bytes", p.rss_bytes},
                        {"processes", p.processes}});
  }
  const StepStats& s = r.steps;
  const GpuFigures& g = r.gpu;
  return {
      {"params", r.params},
      {"argv", r.argv},
      {"outcome", outcome_name(r.outcome)},
      {"exit_code", r.exit.exit_code},
      {"signal", r.exit.signal},
      {"core_dumped", r.exit.core_dumped},
      {"launch_error", r.launch_error.empty() ? Json(nullptr) : Json(r.launch_error)},
      {"wall_s", r.wall_s},
      {"end_marker", r.end_marker},
      {"oom", r.oom ? Json{{"framework", framework_name(r.oom->framework)}, {"line", r.oom->line}}
                    : Json(nullptr)},
      {"error_line", r.error_line},
      {"throughput",
       {{"items_per_s", s.items_per_s},
        {"source", s.throughput_source.empty() ? Json(nullptr) : Json(s.throughput_source)},
        {"batch", s.batch},
        {"steps_seen", s.steps_seen},
        {"warmup_dropped", s.warmup_dropped},
        {"steps_measured", s.steps_measured},
        {"items", s.items},
        {"elapsed_s", s.elapsed_s},
        {"step_time_s",
         {{"median", s.step_median_s},
          {"p90", s.step_p90_s},
          {"mean", s.step_mean_s},
          {"min", s.step_min_s},
          {"max", s.step_max_s}}},
        {"data_wait_share", s.data_wait_share}}},
      {"window",
       {{"source", r.window_source},
        {"start_s", g.figures_window ? Json(g.figures_window->start_s) : Json(nullptr)},
        {"end_s", g.figures_window ? Json(g.figures_window->end_s) : Json(nullptr)},
        {"phases",
         {{"series", r.phases.series.empty() ? Json(nullptr) : Json(r.phases.series)},
          {"level_pct", r.phases.level_pct},
          {"startup_end_s", r.phases.startup_end_s},
          {"steady_start_s", r.phases.steady ? Json(r.phases.steady->start_s) : Json(nullptr)},
          {"steady_end_s", r.phases.steady ? Json(r.phases.steady->end_s) : Json(nullptr)},
          {"why_none", r.phases.why_none.empty() ? Json(nullptr) : Json(r.phases.why_none)}}}}},
      {"framework",
       {{"name", r.framework.framework},
        {"model", r.framework.model},
        {"precision", r.framework.precision},
        {"channels_last", r.framework.channels_last},
        {"peak_bytes", r.framework.peak_bytes},
        {"reserved_bytes", r.framework.reserved_bytes},
        {"allocated_bytes", r.framework.allocated_bytes}}},
      {"gpu",
       {{"telemetry", g.telemetry},
        {"note", g.telemetry_note.empty() ? Json(nullptr) : Json(g.telemetry_note)},
        {"attribution", attribution_name(g.attribution)},
        {"name", g.gpu_name},
        {"gpus_used", g.gpus_used},
        {"per_gpu", per_gpu_json(g.per_gpu)},
        {"peak_bytes", g.peak_bytes},
        {"fullest_gpu", g.fullest_gpu},
        {"busiest_gpu_peak_bytes", g.busiest_gpu_peak_bytes},
        {"early_peak_bytes", g.early_peak_bytes},
        {"device_total_bytes", g.device_total_bytes},
        {"device_used_before_bytes", g.device_used_before_bytes},
        {"device_peak_used_bytes", g.device_peak_used_bytes},
        {"util_median_pct", g.util_median_pct},
        {"workload_sm_util_median_pct", g.tree_sm_util_median_pct},
        {"power_median_w", g.power_median_w},
        {"power_limit_w", g.power_limit_w},
        {"temperature_max_c", g.temperature_max_c},
        {"clock_events_seen", g.clock_events_seen},
        {"power_throttle_share", g.power_throttle.share},
        {"thermal_throttle_share", g.thermal_throttle.share},
        {"power_throttle_gpu", g.power_throttle.gpu},
        {"thermal_throttle_gpu", g.thermal_throttle.gpu},
        {"samples", g.samples}}},
      {"host",
       {{"cores", r.host.cores},
        {"cpu_median_pct", r.host.cpu_median_pct},
        {"cpu_max_pct", r.host.cpu_max_pct},
        {"busiest_process_median_pct", r.host.busiest_process_median_pct},
        {"rss_peak_bytes", r.host.rss_peak_bytes},
        {"max_processes", r.host.max_processes}}},
      {"findings", findings},
      {"protocol_errors", r.protocol_errors},
      {"warnings", r.warnings},
      {"stdout_tail", r.stdout_tail},
      {"stderr_tail", r.stderr_tail},
      {"logs",
       {{"stdout", r.stdout_log.empty() ? Json(nullptr) : Json(r.stdout_log)},
        {"stderr", r.stderr_log.empty() ? Json(nullptr) : Json(r.stderr_log)}}},
      {"timeline", timeline},
  };
}

std::string mib(const std::optional<std::uint64_t>& bytes) {
  if (!bytes) return "-";
  return fmt::format("{:.0f}", static_cast<double>(*bytes) / (1024.0 * 1024.0));
}

std::string params_text(const std::map<std::string, std::string>& params) {
  return params.empty() ? "-" : point_label(params);
}

}  // namespace

std::string report_json(const RunReport& report) {
  const auto& build = build_info();
  Json runs = Json::array();
  for (const auto& r : report.runs) runs.push_back(run_json(r));
  Json searches = Json::array();
  for (const auto& m : report.max_batch) {
    searches.push_back({{"params", m.params},
                        {"largest_ok", m.largest_ok},
                        {"smallest_failed", m.smallest_failed},
                        {"converged", m.converged},
                        {"runs", m.runs},
                        {"note", m.note.empty() ? Json(nullptr) : Json(m.note)}});
  }
  Json sweep = Json::array();
  for (const auto& f : report.sweep_findings) sweep.push_back(finding_json(f));
  Json doc = {{"schema", "dlprobe.run/1"},
              {"dlprobe", {{"version", build.version}, {"git_hash", build.git_hash}}},
              {"started_at", report.started_at},
              {"command", report.command},
              {"shell", report.shell},
              {"interrupted", report.interrupted},
              {"copies", report.copies},
              {"runs", runs},
              {"max_batch", searches},
              {"sweep_findings", sweep}};
  // Bad UTF-8 in a workload's output must not make the whole file unwritable.
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string report_table(const RunReport& report) {
  std::string out =
      fmt::format("{:<24} {:<12} {:>10} {:>11} {:>10} {:>11}  {}\n", "point", "status", "items/s",
                  "median ms", "GPU MiB", "fw peak MiB", "findings");
  for (const auto& r : report.runs) {
    std::vector<std::string> ids;
    for (const auto& f : r.findings) ids.push_back(f.id);
    std::string status(outcome_name(r.outcome));
    if (r.outcome == Outcome::failed || r.outcome == Outcome::crashed) {
      status = describe_exit(r.exit);
    }
    out += fmt::format(
        "{:<24} {:<12} {:>10} {:>11} {:>10} {:>11}  {}\n", params_text(r.params), status,
        r.steps.items_per_s ? fmt::format("{:.1f}", *r.steps.items_per_s) : "-",
        r.steps.step_median_s ? fmt::format("{:.2f}", *r.steps.step_median_s * 1e3) : "-",
        mib(r.gpu.peak_bytes) + (r.gpu.attribution == Attribution::device_wide ? "*" : ""),
        mib(r.framework.peak_bytes), ids.empty() ? "-" : fmt::format("{}", fmt::join(ids, ",")));
  }
  bool device_wide = false;
  for (const auto& r : report.runs) {
    device_wide = device_wide || r.gpu.attribution == Attribution::device_wide;
  }
  if (device_wide) out += "* device-wide: the workload's processes were not visible to NVML\n";
  for (const auto& m : report.max_batch) {
    out += fmt::format(
        "max batch{}: {}{}{}\n", m.params.empty() ? "" : " (" + params_text(m.params) + ")",
        m.largest_ok ? std::to_string(*m.largest_ok) : "none ran",
        m.smallest_failed ? fmt::format(" (batch {} failed)", *m.smallest_failed) : "",
        m.note.empty() ? "" : "; " + m.note);
  }
  // A note that every run of a sweep shares (no telemetry) is said once.
  std::set<std::pair<std::string, std::string>> said;
  auto write_findings = [&](std::string_view where, const std::vector<diagnosis::Finding>& fs) {
    for (const auto& f : fs) {
      if (f.severity == Severity::info && !said.insert({f.id, f.evidence}).second) {
        continue;
      }
      out += fmt::format("[{}] {}{}: {}\n  evidence: {}\n  fix: {}\n", severity_name(f.severity),
                         where, f.id, f.title, f.evidence, f.fix);
    }
  };
  const bool several = report.runs.size() > 1;
  for (const auto& r : report.runs) {
    // Which seconds the utilisation and the findings describe, where a phase was found for them.
    if (r.window_source == "steady phase" && r.gpu.figures_window) {
      out += fmt::format("{}steady window {:.1f}-{:.1f} s (found in the {} telemetry{})\n",
                         several ? params_text(r.params) + ": " : "", r.gpu.figures_window->start_s,
                         r.gpu.figures_window->end_s,
                         r.phases.series == "cpu" ? "workload CPU" : "GPU utilisation",
                         r.gpu.util_median_pct ? fmt::format("; median GPU utilisation {:.0f}%",
                                                             *r.gpu.util_median_pct)
                                               : "");
    }
    write_findings(several ? params_text(r.params) + ": " : "", r.findings);
  }
  write_findings("sweep: ", report.sweep_findings);
  return out;
}

}  // namespace dlprobe::run
