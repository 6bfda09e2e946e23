#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dlprobe/core/json_optional.h"
#include "dlprobe/core/units.h"
#include "dlprobe/monitor/output.h"

namespace dlprobe::monitor {

namespace {

template <class T>
std::string or_dash(const std::optional<T>& v, std::string_view spec = "{}") {
  if (!v) return "-";
  return fmt::format(fmt::runtime(spec), *v);
}

template <class T>
std::string or_empty(const std::optional<T>& v, std::string_view spec = "{}") {
  if (!v) return {};
  return fmt::format(fmt::runtime(spec), *v);
}

std::optional<double> mib(const std::optional<std::uint64_t>& bytes) {
  if (!bytes) return std::nullopt;
  return static_cast<double>(*bytes) / kMiB;
}

std::string reasons_text(const std::optional<std::uint64_t>& mask, std::string_view separator) {
  if (!mask) return {};
  if (*mask == 0) return "none";
  return fmt::format("{}", fmt::join(nvml::clock_event_reason_names(*mask), separator));
}

double seconds_since(std::int64_t t_ns, std::int64_t start_ns) {
  return static_cast<double>(t_ns - start_ns) / 1e9;
}

double unix_seconds(std::int64_t t_ns, const OutputOptions& o) {
  return static_cast<double>(t_ns + o.unix_offset_ns) / 1e9;
}

std::string prom_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string table_header(const OutputOptions& options) {
  std::string header = fmt::format("#{:>4} {:>5} {:>5} {:>9} {:>7} {:>10} {:>5} {:>6} ", "gpu",
                                   "sm%", "mem%", "usedMiB", "pwrW", "energyJ", "tempC", "smMHz");
  if (options.pcie) header += fmt::format("{:>9} {:>9} ", "rxKB/s", "txKB/s");
  header += "clock_events\n";
  if (options.processes) {
    header +=
        fmt::format("#{:>4} {:>9} {:>9} {:>5}   (process rows)\n", "gpu", "pid", "usedMiB", "sm%");
  }
  return header;
}

std::string table_rows(const Tick& tick, const OutputOptions& options) {
  std::string out;
  for (const GpuReading& r : tick.gpus) {
    const nvml::DeviceSample& s = r.sample;
    std::string reasons = reasons_text(s.clock_event_reasons, ",");
    out += fmt::format(" {:>4} {:>5} {:>5} {:>9} {:>7} {:>10} {:>5} {:>6} ", r.gpu,
                       or_dash(s.gpu_util_pct), or_dash(s.mem_util_pct),
                       or_dash(mib(s.mem_used_bytes), "{:.0f}"), or_dash(s.power_w, "{:.1f}"),
                       or_dash(r.energy_since_start_j, "{:.1f}"), or_dash(s.temperature_c),
                       or_dash(s.sm_clock_mhz));
    if (options.pcie) {
      out += fmt::format("{:>9} {:>9} ", or_dash(s.pcie_rx_kbps), or_dash(s.pcie_tx_kbps));
    }
    out += reasons.empty() ? "-" : reasons;
    out += '\n';
    if (options.processes) {
      for (const ProcessRow& p : r.processes) {
        out += fmt::format(" {:>4} {:>9} {:>9} {:>5}\n", r.gpu, p.pid,
                           or_dash(mib(p.used_bytes), "{:.0f}"), or_dash(p.sm_util_pct));
      }
    }
  }
  return out;
}

std::string csv_header(const OutputOptions& options) {
  std::string header = "time_s,unix_s,gpu,";
  if (options.processes) header += "row,";
  header +=
      "gpu_util_pct,mem_util_pct,mem_used_mib,power_w,energy_j,temperature_c,sm_clock_mhz,"
      "mem_clock_mhz,clock_event_reasons";
  if (options.pcie) header += ",pcie_rx_kbps,pcie_tx_kbps";
  if (options.processes) header += ",pid,proc_used_mib,proc_sm_util_pct,proc_mem_util_pct";
  return header + "\n";
}

std::string csv_rows(const Tick& tick, const OutputOptions& options) {
  std::string out;
  const std::string time =
      fmt::format("{:.3f},{:.3f}", seconds_since(tick.timestamp_ns, options.start_ns),
                  unix_seconds(tick.timestamp_ns, options));
  for (const GpuReading& r : tick.gpus) {
    const nvml::DeviceSample& s = r.sample;
    out += fmt::format("{},{},", time, r.gpu);
    if (options.processes) out += "gpu,";
    out += fmt::format("{},{},{},{},{},{},{},{},{}", or_empty(s.gpu_util_pct),
                       or_empty(s.mem_util_pct), or_empty(mib(s.mem_used_bytes), "{:.1f}"),
                       or_empty(s.power_w, "{:.3f}"), or_empty(r.energy_since_start_j, "{:.3f}"),
                       or_empty(s.temperature_c), or_empty(s.sm_clock_mhz),
                       or_empty(s.mem_clock_mhz), reasons_text(s.clock_event_reasons, "|"));
    if (options.pcie) {
      out += fmt::format(",{},{}", or_empty(s.pcie_rx_kbps), or_empty(s.pcie_tx_kbps));
    }
    if (options.processes) out += ",,,,";
    out += '\n';
    if (options.processes) {
      for (const ProcessRow& p : r.processes) {
        out += fmt::format("{},{},process,,,,,,,,,", time, r.gpu);
        if (options.pcie) out += ",,";
        out += fmt::format(",{},{},{},{}\n", p.pid, or_empty(mib(p.used_bytes), "{:.1f}"),
                           or_empty(p.sm_util_pct), or_empty(p.mem_util_pct));
      }
    }
  }
  return out;
}

std::string jsonl_rows(const Tick& tick, const OutputOptions& options) {
  std::string out;
  for (const GpuReading& r : tick.gpus) {
    const nvml::DeviceSample& s = r.sample;
    nlohmann::json row = {
        {"time_s", seconds_since(tick.timestamp_ns, options.start_ns)},
        {"unix_s", unix_seconds(tick.timestamp_ns, options)},
        {"gpu", r.gpu},
        {"gpu_util_pct", s.gpu_util_pct},
        {"mem_util_pct", s.mem_util_pct},
        {"mem_used_bytes", s.mem_used_bytes},
        {"mem_free_bytes", s.mem_free_bytes},
        {"mem_reserved_bytes", s.mem_reserved_bytes},
        {"power_w", s.power_w},
        {"energy_j", r.energy_since_start_j},
        {"temperature_c", s.temperature_c},
        {"sm_clock_mhz", s.sm_clock_mhz},
        {"mem_clock_mhz", s.mem_clock_mhz},
    };
    if (s.clock_event_reasons) {
      row["clock_event_reasons"] = nvml::clock_event_reason_names(*s.clock_event_reasons);
    } else {
      row["clock_event_reasons"] = nullptr;
    }
    if (options.pcie) {
      row["pcie_rx_kbps"] = s.pcie_rx_kbps;
      row["pcie_tx_kbps"] = s.pcie_tx_kbps;
    }
    if (options.processes) {
      nlohmann::json processes = nlohmann::json::array();
      for (const ProcessRow& p : r.processes) {
        processes.push_back({{"pid", p.pid},
                             {"used_bytes", p.used_bytes},
                             {"sm_util_pct", p.sm_util_pct},
                             {"mem_util_pct", p.mem_util_pct}});
      }
      row["processes"] = std::move(processes);
    }
    out += row.dump();
    out += '\n';
  }
  return out;
}

std::string summary_text(const Summary& summary, bool wrapped, const Overhead& overhead) {
  std::string out;
  const double span_s = static_cast<double>(summary.last_ns - summary.first_ns) / 1e9;
  out += fmt::format("summary: {} round{} over {:.1f}s{}\n", summary.ticks,
                     summary.ticks == 1 ? "" : "s", span_s,
                     wrapped ? " (the most recent ones only: the ring dropped older rounds)" : "");
  for (const GpuSummary& g : summary.gpus) {
    out += fmt::format("gpu {}: {} samples\n", g.gpu, g.samples);
    out += fmt::format("  {:<14} {:>10} {:>10} {:>10}\n", "column", "min", "median", "max");
    for (std::size_t c = 0; c < kColumns.size(); ++c) {
      const auto& stats = g.columns[c];
      // PCIe columns are only sampled on request; without them the rows would be noise.
      if (!stats && (kColumns[c] == Column::pcie_rx_kbps || kColumns[c] == Column::pcie_tx_kbps)) {
        continue;
      }
      if (!stats) {
        out +=
            fmt::format("  {:<14} {:>10} {:>10} {:>10}\n", column_name(kColumns[c]), "-", "-", "-");
      } else {
        out += fmt::format("  {:<14} {:>10.1f} {:>10.1f} {:>10.1f}\n", column_name(kColumns[c]),
                           stats->min, stats->median, stats->max);
      }
    }
    if (g.energy_j) {
      out += fmt::format("  energy_j       {:.1f} (from the {})\n", *g.energy_j,
                         g.energy_source == EnergySource::counter ? "driver's energy counter"
                                                                  : "power integrated over time");
    } else {
      out += "  energy_j       -\n";
    }
  }
  const double wall_s = std::chrono::duration<double>(overhead.wall).count();
  const double cpu_pct =
      wall_s > 0 ? 100.0 * std::chrono::duration<double>(overhead.thread_cpu).count() / wall_s : 0;
  out += fmt::format(
      "sampler overhead: {:.3f} ms per round (max {:.3f} ms), {:.2f}% of one CPU, {} round{} "
      "missed\n",
      std::chrono::duration<double, std::milli>(overhead.mean_tick).count(),
      std::chrono::duration<double, std::milli>(overhead.max_tick).count(), cpu_pct,
      overhead.missed_ticks, overhead.missed_ticks == 1 ? "" : "s");
  return out;
}

std::int64_t unix_offset_ns() {
  const auto system = std::chrono::system_clock::now().time_since_epoch();
  const auto steady = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(system - steady).count();
}

Status RowFile::open(const std::string& path, std::string_view flag) {
  if (path.empty()) return Status::ok();
  if (path == "-") {
    stdout_ = true;
    return Status::ok();
  }
  file_.open(path, std::ios::out | std::ios::trunc);
  if (!file_) return error(Errc::io_error, fmt::format("{}: cannot write '{}'", flag, path));
  path_ = path;
  return Status::ok();
}

void RowFile::write(const std::string& text) {
  if (stdout_) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  } else if (file_.is_open()) {
    file_ << text;
    file_.flush();
  }
}

Status RowFile::close(std::string_view flag) {
  if (!file_.is_open()) return Status::ok();
  file_.close();
  if (!file_) return error(Errc::io_error, fmt::format("{}: writing '{}' failed", flag, path_));
  return Status::ok();
}

std::string prometheus_text(const std::optional<Tick>& latest,
                            const std::vector<nvml::DeviceInfo>& devices,
                            const Overhead& overhead) {
  std::string out;
  auto labels_of = [&](unsigned gpu) {
    for (const auto& d : devices) {
      if (d.index == gpu) {
        return fmt::format("gpu=\"{}\",uuid=\"{}\",name=\"{}\"", gpu, prom_escape(d.uuid),
                           prom_escape(d.name));
      }
    }
    return fmt::format("gpu=\"{}\"", gpu);
  };
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  struct Gauge {
    std::string_view name;
    std::string_view type;
    std::string_view help;
    std::optional<double> (*value)(const GpuReading&);
  };
  static constexpr Gauge kGauges[] = {
      {"dlprobe_gpu_utilization_percent", "gauge",
       "Percent of time a kernel ran on the GPU (NVML utilization.gpu)",
       [](const GpuReading& r) { return column_value(r.sample, Column::gpu_util_pct); }},
      {"dlprobe_gpu_memory_utilization_percent", "gauge",
       "Percent of time device memory was read or written (NVML utilization.memory)",
       [](const GpuReading& r) { return column_value(r.sample, Column::mem_util_pct); }},
      {"dlprobe_gpu_memory_used_bytes", "gauge", "Device memory in use",
       [](const GpuReading& r) -> std::optional<double> {
         if (!r.sample.mem_used_bytes) return std::nullopt;
         return static_cast<double>(*r.sample.mem_used_bytes);
       }},
      {"dlprobe_gpu_power_watts", "gauge", "Board power draw",
       [](const GpuReading& r) { return r.sample.power_w; }},
      {"dlprobe_gpu_energy_joules", "counter", "Energy used since dlprobe monitor started",
       [](const GpuReading& r) { return r.energy_since_start_j; }},
      {"dlprobe_gpu_temperature_celsius", "gauge", "GPU core temperature",
       [](const GpuReading& r) { return column_value(r.sample, Column::temperature_c); }},
      {"dlprobe_gpu_sm_clock_hertz", "gauge", "SM clock",
       [](const GpuReading& r) -> std::optional<double> {
         if (!r.sample.sm_clock_mhz) return std::nullopt;
         return *r.sample.sm_clock_mhz * 1e6;
       }},
      {"dlprobe_gpu_memory_clock_hertz", "gauge", "Memory clock",
       [](const GpuReading& r) -> std::optional<double> {
         if (!r.sample.mem_clock_mhz) return std::nullopt;
         return *r.sample.mem_clock_mhz * 1e6;
       }},
      {"dlprobe_gpu_clock_event_reasons", "gauge",
       "NVML clock event (throttle) reason bits currently set",
       [](const GpuReading& r) -> std::optional<double> {
         if (!r.sample.clock_event_reasons) return std::nullopt;
         return static_cast<double>(*r.sample.clock_event_reasons);
       }},
      {"dlprobe_gpu_throttled", "gauge", "1 while clocks are held down for power or heat",
       [](const GpuReading& r) -> std::optional<double> {
         if (!r.sample.clock_event_reasons) return std::nullopt;
         return nvml::clock_events_throttle(*r.sample.clock_event_reasons) ? 1.0 : 0.0;
       }},
  };
  for (const Gauge& g : kGauges) {
    family(g.name, g.type, g.help);
    if (!latest) continue;
    for (const GpuReading& r : latest->gpus) {
      if (auto v = g.value(r)) out += fmt::format("{}{{{}}} {}\n", g.name, labels_of(r.gpu), *v);
    }
  }
  family("dlprobe_gpu_memory_total_bytes", "gauge", "Device memory size");
  for (const auto& d : devices) {
    if (d.memory_total_bytes) {
      out += fmt::format("dlprobe_gpu_memory_total_bytes{{{}}} {}\n", labels_of(d.index),
                         *d.memory_total_bytes);
    }
  }
  struct ProcessGauge {
    std::string_view name;
    std::string_view help;
    std::optional<std::uint64_t> (*value)(const ProcessRow&);
  };
  static constexpr ProcessGauge kProcessGauges[] = {
      {"dlprobe_process_memory_used_bytes", "Device memory used by a process",
       [](const ProcessRow& p) { return p.used_bytes; }},
      {"dlprobe_process_sm_utilization_percent",
       "Percent of time a kernel of the process ran (NVML's latest per-process sample)",
       [](const ProcessRow& p) -> std::optional<std::uint64_t> { return p.sm_util_pct; }},
  };
  for (const ProcessGauge& g : kProcessGauges) {
    family(g.name, "gauge", g.help);
    if (!latest) continue;
    for (const GpuReading& r : latest->gpus) {
      for (const ProcessRow& p : r.processes) {
        if (auto v = g.value(p)) {
          out += fmt::format("{}{{{},pid=\"{}\"}} {}\n", g.name, labels_of(r.gpu), p.pid, *v);
        }
      }
    }
  }
  family("dlprobe_monitor_samples_total", "counter", "Sampling rounds taken");
  out += fmt::format("dlprobe_monitor_samples_total {}\n", overhead.ticks);
  family("dlprobe_monitor_sample_seconds", "gauge", "Mean wall time of one sampling round");
  out += fmt::format("dlprobe_monitor_sample_seconds {}\n",
                     std::chrono::duration<double>(overhead.mean_tick).count());
  return out;
}

}  // namespace dlprobe::monitor
