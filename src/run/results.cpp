#include "dlprobe/run/results.h"
#include "dlprobe/core/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "dlprobe/core/build_info.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/log.h"
#include "dlprobe/doctor/container.h"
#include "dlprobe/doctor/cpu_info.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::run {

namespace {

// The results serializer refuses invalid UTF-8, and a workload's output can hold any bytes: text
// taken from it passes through nlohmann's replacing dump (U+FFFD for bad bytes) and back.
std::string clean(const std::string& text) {
  const nlohmann::json as_json(text);
  return nlohmann::json::parse(
             as_json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}

std::optional<results::Range> range_of(std::vector<double> v) {
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  return results::Range{v.size(), v.front(), stats::percentile_sorted(v, 0.5), v.back()};
}

results::RunStatus status_of(Outcome o) {
  switch (o) {
    case Outcome::ok:
      return results::RunStatus::ok;
    case Outcome::oom:
      return results::RunStatus::oom;
    case Outcome::interrupted:
      return results::RunStatus::interrupted;
    case Outcome::timeout:
      return results::RunStatus::timeout;
    case Outcome::failed:
    case Outcome::crashed:
    case Outcome::hang:
    case Outcome::launch_error:
      break;
  }
  return results::RunStatus::failed;
}

std::string error_of(const RunResult& r) {
  switch (r.outcome) {
    case Outcome::ok:
      return "";
    case Outcome::launch_error:
      return r.launch_error;
    case Outcome::oom:
      return r.oom ? r.oom->line : "out of memory";
    case Outcome::hang:
      return "hang: no output and no GPU activity for --hang-after";
    case Outcome::timeout:
      return "stopped at --timeout";
    case Outcome::interrupted:
      return std::string(kInterrupted);
    case Outcome::failed:
    case Outcome::crashed:
      break;
  }
  return r.error_line ? fmt::format("{}: {}", describe_exit(r.exit), *r.error_line)
                      : describe_exit(r.exit);
}

}  // namespace

results::Finding to_results_finding(const diagnosis::Finding& f) {
  results::Finding out;
  out.severity = f.severity;
  out.id = f.id;
  out.message = clean(f.title);
  out.evidence = clean(f.evidence);
  out.fix = clean(f.fix);
  return out;
}

results::Context results_context(const std::vector<std::string>& command_line,
                                 const std::shared_ptr<nvml::Library>& nvml,
                                 const doctor::StackVersions& versions) {
  results::Context c;
  if (versions.cuda_runtime_loaded > 0) {
    c.cuda_runtime_version = doctor::decode_cuda_version(versions.cuda_runtime_loaded).str();
  }
  for (const doctor::LibraryProbe* p : {&versions.cudnn, &versions.cublas, &versions.cublaslt,
                                        &versions.nccl, &versions.cupti, &versions.onednn}) {
    c.libraries.push_back({p->name, p->loaded ? p->version : "", p->loaded ? p->path : ""});
  }
  const auto& build = build_info();
  c.dlprobe_version = std::string(build.version);
  c.git_hash = std::string(build.git_hash);
  for (const auto& arg : command_line) c.command_line.push_back(clean(arg));
  c.date = results::iso8601_utc_now();
  if (auto host = doctor::read_host_info()) {
    c.hostname = host->hostname;
    c.os = host->os;
    c.cpu = host->cpu.model;
    c.cpu_threads = host->cpu.threads;
    c.host_memory_bytes = host->memory_total_bytes;
  } else {
    log_debug("host info: {}", host.status().message());
  }
  c.container = doctor::detect_container();
  if (!nvml) return c;
  c.driver_version = nvml->driver_version();
  if (auto v = nvml->cuda_driver_version()) {
    c.cuda_driver_version = fmt::format("{}.{}", *v / 1000, (*v % 1000) / 10);
  }
  const unsigned count = nvml->device_count().value_or(0);
  for (unsigned i = 0; i < count; ++i) {
    auto info = nvml->device_info(i);
    if (!info) continue;
    results::Gpu g;
    g.index = static_cast<int>(i);
    g.name = info->name;
    g.uuid = info->uuid;
    g.pci_bus_id = info->pci_bus_id;
    if (info->cc_major && info->cc_minor) {
      g.compute_capability = fmt::format("{}.{}", *info->cc_major, *info->cc_minor);
    }
    g.memory_total_bytes = info->memory_total_bytes;
    c.gpus.push_back(std::move(g));
    results::DeviceState state;
    state.gpu = static_cast<int>(i);
    state.power_limit_w = info->power_limit_w;
    nvml::SampleOptions quick;
    quick.energy_counter = false;
    if (auto s = nvml->sample(i, quick)) {
      if (s->sm_clock_mhz) state.sm_clock_mhz = *s->sm_clock_mhz;
      if (s->mem_clock_mhz) state.mem_clock_mhz = *s->mem_clock_mhz;
      if (s->temperature_c) state.temperature_c = *s->temperature_c;
      state.power_w = s->power_w;
      if (s->clock_event_reasons) {
        state.clock_event_reasons = nvml::clock_event_reason_names(*s->clock_event_reasons);
      }
    }
    if (auto procs = nvml->processes(i)) {
      for (const auto& p : *procs) state.other_processes.push_back({p.pid, p.used_bytes});
    }
    c.device_state.push_back(std::move(state));
  }
  return c;
}

results::Configuration to_configuration(const RunResult& r, const std::string& command) {
  results::Configuration c;
  c.kind = results::Kind::external;
  c.settings.command = clean(command);
  for (const auto& [k, v] : r.params) c.settings.sweep[k] = clean(v);
  c.status = status_of(r.outcome);
  c.error = clean(error_of(r));
  c.samples.step_seconds = r.steps.step_seconds;
  c.samples.step_items = r.steps.step_items;
  c.samples.warmup_steps = static_cast<int>(r.steps.warmup_dropped);
  if (!r.steps.step_seconds.empty()) {
    // Steps of zero seconds (a coarse clock in the workload) cannot enter the statistics.
    if (auto summary = stats::summarize(r.steps.step_seconds, r.steps.step_items)) {
      c.statistics = *summary;
    } else {
      log_warn("step statistics: {}", summary.status().message());
    }
  }
  const auto signed_bytes = [](std::optional<std::uint64_t> b) -> std::optional<std::int64_t> {
    if (!b) return std::nullopt;
    return static_cast<std::int64_t>(*b);
  };
  const bool framework = r.framework.peak_bytes || r.framework.reserved_bytes;
  if (framework || r.gpu.peak_bytes) {
    results::Memory m;
    m.source = framework ? "framework" : "nvml";
    m.allocator_stats = nullptr;
    m.framework_peak_allocated_bytes = signed_bytes(r.framework.peak_bytes);
    m.framework_peak_reserved_bytes = signed_bytes(r.framework.reserved_bytes);
    // Only a figure that belongs to the workload's processes; device-wide memory includes others.
    if (r.gpu.attribution == Attribution::process_tree ||
        r.gpu.attribution == Attribution::new_processes) {
      m.nvml_process_peak_bytes = signed_bytes(r.gpu.peak_bytes);
    }
    c.memory = m;
  }
  if (r.gpu.telemetry && !r.timeline.empty()) {
    // One entry per GPU the workload used, each with its own readings; every GPU sampled when
    // its memory was seen on none (no process attribution), as each may be the one it ran on.
    std::vector<unsigned> gpus = r.gpu.gpus_used;
    if (gpus.empty()) {
      std::set<unsigned> sampled;
      for (const auto& p : r.timeline) {
        for (const auto& [gpu, reading] : p.gpus) sampled.insert(gpu);
      }
      gpus.assign(sampled.begin(), sampled.end());
    }
    // The summaries over the window the run's figures and findings describe (the measured
    // steps, or the steady phase found in the telemetry), as a native run's cover its timed
    // window; the time line keeps the whole run, start-up included, for the report's charts.
    const std::optional<TimeWindow>& window = r.gpu.figures_window;
    for (unsigned gpu : gpus) {
      results::Telemetry t;
      t.gpu = static_cast<int>(gpu);
      t.window_s =
          window ? window->end_s - window->start_s : r.timeline.back().t_s - r.timeline.front().t_s;
      std::vector<double> util, mem_util, power, clock, mem_clock, temp, mem;
      std::uint64_t throttling = 0;
      for (const auto& p : r.timeline) {
        const auto it = p.gpus.find(gpu);
        if (it == p.gpus.end()) continue;
        const GpuReading& g = it->second;
        const std::optional<double> used_mib =
            g.used_bytes ? std::optional<double>(static_cast<double>(*g.used_bytes) / kMiB)
                         : std::nullopt;
        if (!window || window->holds(p.t_s)) {
          ++t.samples;
          if (g.util_pct) util.push_back(*g.util_pct);
          if (g.mem_util_pct) mem_util.push_back(*g.mem_util_pct);
          if (g.power_w) power.push_back(*g.power_w);
          if (g.sm_clock_mhz) clock.push_back(*g.sm_clock_mhz);
          if (g.mem_clock_mhz) mem_clock.push_back(*g.mem_clock_mhz);
          if (g.temperature_c) temp.push_back(*g.temperature_c);
          if (used_mib) mem.push_back(*used_mib);
          // Only the bits that slow the GPU down: "idle" is what a GPU waiting for input shows.
          if (g.clock_event_reasons) {
            throttling |= nvml::throttling_clock_events(*g.clock_event_reasons);
          }
        }
        results::TelemetrySample s;
        s.t_s = p.t_s;
        s.gpu_util_pct = g.util_pct;
        s.power_w = g.power_w;
        if (g.sm_clock_mhz) s.sm_clock_mhz = *g.sm_clock_mhz;
        s.mem_used_mib = used_mib;
        s.temperature_c = g.temperature_c;
        t.timeline.push_back(s);
      }
      t.gpu_util_pct = range_of(util);
      t.mem_util_pct = range_of(mem_util);
      t.power_w = range_of(power);
      t.sm_clock_mhz = range_of(clock);
      t.mem_clock_mhz = range_of(mem_clock);
      t.temperature_c = range_of(temp);
      t.mem_used_mib = range_of(mem);
      t.energy_source = "none";
      t.throttle_reasons = nvml::clock_event_reason_names(throttling);
      c.telemetry.push_back(std::move(t));
    }
  }
  for (const auto& f : r.findings) c.findings.push_back(to_results_finding(f));
  return c;
}

}  // namespace dlprobe::run
