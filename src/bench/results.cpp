#include "dlprobe/bench/results.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "dlprobe/bench/host_cpu.h"
#include "dlprobe/core/units.h"
#include "dlprobe/memory/analysis_json.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::bench {
namespace {

std::optional<results::Range> range_of(std::vector<double> v) {
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  return results::Range{v.size(), v.front(), stats::percentile_sorted(v, 0.5), v.back()};
}

const monitor::GpuReading* reading_of(const monitor::Tick& tick, unsigned gpu) {
  for (const auto& r : tick.gpus) {
    if (r.gpu == gpu) return &r;
  }
  return nullptr;
}

std::string ms(double seconds) {
  return fmt::format("{:.3f} ms", seconds * 1e3);
}

}  // namespace

std::optional<std::string> ceiling_dtype(engine::Precision precision) {
  // The GEMM ceilings are named as the precisions are; none is measured for fp64.
  if (precision == engine::Precision::fp64) return std::nullopt;
  return std::string(engine::precision_name(precision));
}

std::optional<results::Telemetry> telemetry_over(const std::vector<WindowTelemetry>& windows,
                                                 unsigned gpu) {
  if (windows.empty()) return std::nullopt;
  results::Telemetry t;
  t.gpu = static_cast<int>(gpu);
  std::vector<double> util, mem_util, power, sm, mem_clock, temp, mem_used;
  std::uint64_t reasons = 0;
  const std::int64_t origin = windows.front().begin_ns;
  bool every_counter = true;
  double counter_j = 0;
  double integral_j = 0;
  bool integral_known = true;
  for (const WindowTelemetry& w : windows) {
    t.window_s += static_cast<double>(w.end_ns - w.begin_ns) / 1e9;
    if (w.counter_energy_j) {
      counter_j += *w.counter_energy_j;
    } else {
      every_counter = false;
    }
    std::vector<monitor::Tick> own;
    for (const monitor::Tick& tick : w.ticks) {
      const monitor::GpuReading* r = reading_of(tick, gpu);
      if (r == nullptr) continue;
      own.push_back(tick);
      ++t.samples;
      const nvml::DeviceSample& s = r->sample;
      using monitor::Column;
      const auto add = [&](std::vector<double>& v, Column c) {
        if (auto x = monitor::column_value(s, c)) v.push_back(*x);
      };
      add(util, Column::gpu_util_pct);
      add(mem_util, Column::mem_util_pct);
      add(power, Column::power_w);
      add(sm, Column::sm_clock_mhz);
      add(mem_clock, Column::mem_clock_mhz);
      add(temp, Column::temperature_c);
      add(mem_used, Column::mem_used_mib);
      // Only the bits that slow the GPU down: "idle" and application-clock settings are not news.
      if (s.clock_event_reasons) reasons |= nvml::throttling_clock_events(*s.clock_event_reasons);
      results::TelemetrySample point;
      point.t_s = static_cast<double>(tick.timestamp_ns - origin) / 1e9;
      point.gpu_util_pct = monitor::column_value(s, Column::gpu_util_pct);
      point.power_w = monitor::column_value(s, Column::power_w);
      point.sm_clock_mhz = monitor::column_value(s, Column::sm_clock_mhz);
      point.mem_used_mib = monitor::column_value(s, Column::mem_used_mib);
      point.temperature_c = monitor::column_value(s, Column::temperature_c);
      t.timeline.push_back(point);
    }
    const monitor::Summary summary = monitor::summarize(own);
    if (!summary.gpus.empty() && summary.gpus.front().energy_j) {
      integral_j += *summary.gpus.front().energy_j;
    } else {
      integral_known = false;
    }
  }
  if (t.samples == 0 && !every_counter) return std::nullopt;
  t.gpu_util_pct = range_of(std::move(util));
  t.mem_util_pct = range_of(std::move(mem_util));
  t.power_w = range_of(std::move(power));
  t.sm_clock_mhz = range_of(std::move(sm));
  t.mem_clock_mhz = range_of(std::move(mem_clock));
  t.temperature_c = range_of(std::move(temp));
  t.mem_used_mib = range_of(std::move(mem_used));
  t.throttle_reasons = nvml::clock_event_reason_names(reasons);
  if (every_counter) {
    t.energy_j = counter_j;
    t.energy_source = "counter";
  } else if (integral_known) {
    t.energy_j = integral_j;
    t.energy_source = "power_integral";
  } else {
    t.energy_source = "none";
  }
  return t;
}

std::vector<OtherProcess> other_processes(const std::vector<WindowTelemetry>& windows, unsigned gpu,
                                          unsigned own_pid) {
  std::map<unsigned, OtherProcess> seen;
  bool own_seen = false;
  for (const WindowTelemetry& w : windows) {
    for (const monitor::Tick& tick : w.ticks) {
      const monitor::GpuReading* r = reading_of(tick, gpu);
      if (r == nullptr) continue;
      for (const monitor::ProcessRow& p : r->processes) {
        if (p.pid == own_pid) {
          own_seen = true;
          continue;
        }
        OtherProcess& o = seen[p.pid];
        o.pid = p.pid;
        if (p.used_bytes) o.used_bytes = std::max(o.used_bytes.value_or(0), *p.used_bytes);
        if (p.sm_util_pct) {
          o.max_sm_util_pct = std::max(o.max_sm_util_pct.value_or(0), *p.sm_util_pct);
        }
      }
    }
  }
  // In a container NVML can list host pids: this process is then among the "others" under a
  // number it does not know, and nothing tells the rows apart.
  if (!own_seen) return {};
  std::vector<OtherProcess> out;
  for (auto& [pid, o] : seen) out.push_back(o);
  return out;
}

results::Settings settings_of(const engine::StepConfig& step, const device::Device& device,
                              device::BackendKind backend) {
  results::Settings s;
  s.model = std::string(model::arch_name(step.model.arch));
  s.batch = step.batch;
  s.precision = std::string(engine::precision_name(step.precision));
  s.mode = std::string(engine::step_mode_name(step.mode));
  // Lower case, as the flags take it ("nhwc"); layout_name() is the upper-case display name.
  s.layout = step.layout == Layout::nhwc ? "nhwc" : "nchw";
  s.device = device::device_name(device);
  s.optimizer = step.mode == engine::StepMode::train
                    ? std::string(engine::optimizer_name(step.optimizer))
                    : std::string("none");
  s.image_size = step.model.image_size;
  s.classes = step.model.classes;
  s.width = step.model.width;
  s.backend = std::string(device::backend_kind_name(backend));
  // The CPU backends have one stream, whatever the step asked for.
  s.streams = step.streams > 1 && backend == device::BackendKind::cuda ? step.streams : 0;
  s.stream_lag = s.streams > 1 ? step.stream_lag : 0;
  s.recompute = step.recompute_block_outputs ? "block-outputs" : "";
  return s;
}

results::Configuration to_configuration(const Measured& m) {
  results::Configuration c;
  c.kind = results::Kind::native;
  c.settings = settings_of(m.step, m.device, m.backend);
  c.settings.gpu_memory = m.gpu_memory;
  c.settings.input = m.input;
  c.status = m.status;
  c.error = m.error;
  if (!m.runs.empty()) {
    const bool windowed = std::any_of(m.runs.begin(), m.runs.end(),
                                      [](const BenchResult* r) { return r->windows.size() > 1; });
    for (const BenchResult* r : m.runs) {
      const std::vector<double> steps = r->step_seconds();
      c.samples.step_seconds.insert(c.samples.step_seconds.end(), steps.begin(), steps.end());
      if (windowed) {
        for (const Window& w : r->windows) {
          c.samples.window_steps.push_back(static_cast<std::int64_t>(w.step_seconds.size()));
        }
      }
      if (m.runs.size() > 1 && !steps.empty()) {
        c.samples.run_steps.push_back(static_cast<std::int64_t>(steps.size()));
      }
      // With --repeat each run profiles after its timing; the last run's profile is kept.
      if (!r->profile.empty()) c.profile = r->profile;
      c.samples.warmup_steps += static_cast<int>(r->warmup_steps);
      c.samples.warmup.push_back({r->until_steady ? "steady" : "fixed", r->warmup_steps,
                                  r->warmup_seconds, r->warmup_steady, r->restarts,
                                  r->warmup_step_seconds});
    }
    c.samples.step_items.assign(c.samples.step_seconds.size(), static_cast<double>(m.step.batch));
    // Other processes' CPU time, a figure a window, when every window has one.
    std::vector<double> other;
    for (const BenchResult* r : m.runs) {
      for (const Window& w : r->windows) {
        if (w.other_cpu_seconds) other.push_back(*w.other_cpu_seconds);
      }
    }
    const std::size_t windows = !c.samples.window_steps.empty()
                                    ? c.samples.window_steps.size()
                                    : std::max<std::size_t>(1, c.samples.run_steps.size());
    if (other.size() == windows) {
      c.samples.window_other_cpu_seconds = std::move(other);
      c.samples.host_cpus = online_cpus();
    }
    if (!c.samples.step_seconds.empty()) {
      // Event timers can in principle read 0 for a step of a few microseconds; such a window is
      // recorded (raw times) but cannot enter statistics that divide by time.
      if (auto summary = stats::summarize(c.samples.step_seconds, c.samples.step_items)) {
        c.statistics = *summary;
      } else if (c.status == results::RunStatus::ok) {
        c.status = results::RunStatus::failed;
        c.error = fmt::format("step statistics: {}", summary.status().message());
      }
    }
    if (c.samples.run_steps.size() >= 2) {
      c.runs_in = results::RunsIn::engines;
      if (auto spread = stats::run_spread(results::run_throughputs(c.samples))) {
        c.run_spread = *spread;
      }
    }
  }
  if (m.memory) {
    results::Memory mem;
    mem.source = "allocator";
    mem.allocator_stats = memory::to_flat_json(*m.memory);
    if (!m.runs.empty() && m.runs.front()->arena_fullest) {
      mem.arena = memory::to_json(*m.runs.front()->arena_fullest);
      // From the plan alone: what the allocator held during that call is not known.
      mem.arena.erase("allocated_bytes");
    }
    c.memory = std::move(mem);
  }
  if (m.telemetry) c.telemetry.push_back(*m.telemetry);
  if (m.flops_per_item) {
    results::Compute compute;
    compute.flops_per_item = m.flops_per_item;
    if (c.statistics) {
      compute.achieved_tflops = *m.flops_per_item * c.statistics->throughput / 1e12;
    }
    if (m.ceiling) {
      compute.ceiling_dtype = m.ceiling->dtype;
      compute.ceiling_tflops = m.ceiling->tflops;
      if (compute.achieved_tflops && m.ceiling->tflops > 0) {
        compute.fraction_of_ceiling = *compute.achieved_tflops / m.ceiling->tflops;
      }
    }
    c.compute = compute;
  }
  c.findings = findings_of(c, m.others);
  return c;
}

std::vector<results::Finding> findings_of(const results::Configuration& c,
                                          const std::vector<OtherProcess>& others) {
  std::vector<results::Finding> out;
  const auto add = [&](Severity severity, std::string id, std::string message, std::string evidence,
                       std::string fix) {
    out.push_back(
        {severity, std::move(id), std::move(message), std::move(evidence), std::move(fix)});
  };
  const std::vector<double>& t = c.samples.step_seconds;
  // The fixes differ: a CPU run has no GPU clocks to pin and shares its cores with the machine.
  const bool on_cpu = c.settings.device == "cpu";
  if (c.statistics) {
    const stats::Summary& s = *c.statistics;
    if (s.steps < kFewSteps) {
      add(Severity::warning, "few_steps", "fewer than 10 timed steps",
          fmt::format("{} steps", s.steps),
          "time more steps (--steps) or a longer window (--min-time)");
    }
    if (t.size() >= kMinFirstStepSteps) {
      const std::vector<std::size_t> outliers = stats::outliers(t);
      const bool first_is_outlier = !outliers.empty() && outliers.front() == 0;
      if (first_is_outlier && t.front() > kSlowFirstStep * s.median_s) {
        add(Severity::warning, "slow_first_step",
            "the first timed step was slow: warm-up did not reach the steady state",
            fmt::format("first step {}, {:.2f}x the median {}", ms(t.front()),
                        t.front() / s.median_s, ms(s.median_s)),
            "warm up until steady (--warmup auto, the default) or for longer (--warmup-time)");
      }
    }
    const std::vector<results::Warmup>& warmups = c.samples.warmup;
    const auto unsettled = std::find_if(warmups.begin(), warmups.end(), [](const auto& w) {
      return w.mode == "steady" && !w.steady;
    });
    if (unsettled != warmups.end()) {
      const results::Warmup& w = *unsettled;
      add(Severity::warning, "warmup_not_steady",
          "the step times were still falling when the warm-up reached its bound",
          fmt::format("{}warm-up of {} steps in {:.1f} s{}",
                      warmups.size() > 1 ? fmt::format("run {}: ", unsettled - warmups.begin() + 1)
                                         : std::string(),
                      w.steps, w.seconds,
                      w.step_seconds.empty()
                          ? std::string()
                          : fmt::format(", its last step {}", ms(w.step_seconds.back()))),
          "allow a longer warm-up (--warmup-time), or find what keeps slowing down (clocks, "
          "other processes)");
    }
    if (s.cv > kNoisyCv) {
      add(Severity::warning, "noisy_steps",
          "step times vary by more than 5%; the throughput is less certain",
          fmt::format("CV {:.1f}%, median {}, p99 {}, {} outliers in {} steps", s.cv * 100,
                      ms(s.median_s), ms(s.p99_s), s.outliers, s.steps),
          on_cpu ? "close other work on the machine, keep the threads on their cores "
                   "(OMP_PROC_BIND=close OMP_PLACES=cores), time longer (--min-time) or repeat "
                   "(--repeat 3)"
                 : "close other work on the machine, pin the GPU clocks (nvidia-smi -lgc), time "
                   "longer (--min-time) or repeat (--repeat 3)");
    }
  }
  if (const std::optional<double> share = results::other_cpu_share(c.samples);
      share && *share >= kCpuContention) {
    double seconds = 0;
    for (const double w : c.samples.window_other_cpu_seconds) seconds += w;
    add(Severity::warning, "cpu_contention",
        on_cpu ? "other processes used the CPUs during the timed windows: the step shared its "
                 "cores, and the throughput is lower than on an idle machine"
               : "other processes used the CPUs during the timed windows: the thread that feeds "
                 "the GPU shared its cores",
        fmt::format("{:.0f}% of the machine's CPU time ({:.1f} of {} CPUs, {:.1f} CPU-seconds)",
                    *share * 100, *share * c.samples.host_cpus, c.samples.host_cpus, seconds),
        "stop them (top or ps -eo pcpu,pid,comm --sort=-pcpu shows them) or measure when the "
        "machine is idle; compare only runs made under the same load");
  }
  const std::vector<double> windows = results::window_throughputs(c.samples);
  if (windows.size() >= 2) {
    std::vector<double> sorted = windows;
    std::sort(sorted.begin(), sorted.end());
    const double median = stats::percentile_sorted(sorted, 0.5);
    const double spread = (sorted.back() - sorted.front()) / median;
    if (spread > kWindowSpread) {
      std::string each;
      for (double w : windows) each += fmt::format("{}{:.1f}", each.empty() ? "" : ", ", w);
      add(Severity::warning, "windows_disagree",
          "the repeated windows disagree by more than 2%: something changed during the run",
          fmt::format("window throughputs {} items/s, spread {:.1f}% of the median", each,
                      spread * 100),
          on_cpu ? "check for other processes (cpu_contention) and CPU frequency changes "
                   "(turbo, heat); warm up longer"
                 : "check the telemetry for clock changes and other processes; warm up longer");
    }
  }
  for (const results::Telemetry& tel : c.telemetry) {
    if (!tel.throttle_reasons.empty()) {
      std::string reasons;
      for (const auto& r : tel.throttle_reasons) reasons += (reasons.empty() ? "" : ", ") + r;
      add(Severity::warning, "clock_events",
          fmt::format("GPU {} lowered its clocks during the timed window", tel.gpu), reasons,
          "results under throttling are not comparable: check cooling and the power limit "
          "(nvidia-smi -q -d PERFORMANCE,POWER)");
    }
    if (tel.sm_clock_mhz && tel.sm_clock_mhz->median > 0) {
      const results::Range& r = *tel.sm_clock_mhz;
      const double spread = (r.max - r.min) / r.median;
      if (spread > kClockSpread) {
        add(Severity::warning, "clock_changed",
            fmt::format("GPU {}'s SM clock moved during the timed window", tel.gpu),
            fmt::format("{:.0f} to {:.0f} MHz (median {:.0f}) over {} samples", r.min, r.max,
                        r.median, r.count),
            "lock the clocks for comparable runs (nvidia-smi -lgc <mhz>) or warm up longer");
      }
    }
    if (tel.gpu_util_pct && tel.gpu_util_pct->median < kLowUtilPct) {
      add(Severity::info, "low_gpu_util",
          fmt::format("GPU {} was busy only part of the timed window", tel.gpu),
          fmt::format("median utilisation {:.0f}% over {} samples", tel.gpu_util_pct->median,
                      tel.gpu_util_pct->count),
          "the host does not queue work fast enough at this size: a larger batch keeps the GPU "
          "busy");
    }
  }
  for (const OtherProcess& p : others) {
    const bool active = p.max_sm_util_pct && *p.max_sm_util_pct > 0;
    add(active ? Severity::warning : Severity::info, "other_process",
        active ? fmt::format("another process (pid {}) used the GPU during the timed window", p.pid)
               : fmt::format("another process (pid {}) held GPU memory during the timed window",
                             p.pid),
        fmt::format(
            "pid {}{}{}", p.pid,
            p.used_bytes ? fmt::format(", {} of GPU memory", format_size(*p.used_bytes))
                         : std::string(),
            p.max_sm_util_pct ? fmt::format(", up to {}% SM", *p.max_sm_util_pct) : std::string()),
        active ? "stop it or bench on another GPU: it shares the SMs and memory bandwidth"
               : "its memory is not available to the benchmark; stop it for the largest batches");
  }
  return out;
}

results::Finding input_finding(const results::Configuration& synthetic,
                               const results::Configuration& fed, const InputFacts& facts) {
  results::Finding f;
  const double base = synthetic.statistics ? synthetic.statistics->throughput : 0;
  const double got = fed.statistics ? fed.statistics->throughput : 0;
  const double share = base > 0 ? got / base : 0;
  const double batch = static_cast<double>(fed.settings.batch);
  const double batches = static_cast<double>(std::max<std::int64_t>(facts.batches, 1));
  const double fetch_ms = facts.batches > 0 ? 1e3 * facts.fetch_seconds / batches : 0;
  const double upload_ms = facts.batches > 0 ? 1e3 * facts.upload_seconds / batches : 0;
  const double step_ms = base > 0 ? 1e3 * batch / base : 0;
  f.evidence = fmt::format(
      "{:.0f} img/s from JPEGs ({}, {} loader threads) against {:.0f} img/s on the synthetic "
      "batch: {:.1f} %; making a batch took {:.1f} ms on the host's clock against a {:.1f} ms "
      "step, and handing it to the step {:.1f} ms with the device idle{}",
      got, facts.decoder, facts.threads, base, 100 * share, fetch_ms, step_ms, upload_ms,
      facts.skipped.empty() ? std::string()
                            : fmt::format("; {} file(s) gave no image", facts.skipped.size()));
  if (share >= 0.95) {
    f.severity = Severity::info;
    f.id = "input_keeps_up";
    f.message = fmt::format("the input pipeline keeps up: {:.1f} % of the synthetic throughput",
                            100 * share);
    return f;
  }
  f.severity = Severity::warning;
  f.id = "input_bound";
  // Few hardware queues put the decoders' work behind the step's: the first thing to mend.
  const std::string queues =
      facts.input == "jpeg-gpu" && facts.cuda_queues
          ? fmt::format(
                "unset CUDA_DEVICE_MAX_CONNECTIONS or set it to 32 (it is {} here: with fewer "
                "hardware queues the decoders' work waits behind the step's); ",
                *facts.cuda_queues)
          : std::string();
  // Where the batches are ready before the step before them ends, more decoding threads would
  // not help, and saying so would send the user after the wrong fix: the loss is then the copy
  // up (host path), or the step itself slowed by the decoding beside it (GPU path). A tenth of a
  // step is where the copy, not the decoding, explains it.
  const double fed_ms = got > 0 ? 1e3 * batch / got : 0;
  const bool in_time = facts.batches > 0 && fed_ms > 0 && fetch_ms < fed_ms;
  const bool copy_counts = upload_ms >= 0.1 * step_ms;
  if (in_time && facts.input != "jpeg-gpu" && copy_counts) {
    f.message = fmt::format(
        "input-bound by the copy to the device: training from JPEGs runs at {:.1f} % of the "
        "synthetic throughput; the batches are ready in time ({:.1f} ms against a {:.1f} ms "
        "step) but the device waits {:.1f} ms a step while each is copied to it",
        100 * share, fetch_ms, fed_ms, upload_ms);
    f.fix =
        "copy each batch from pinned memory on a stream of its own while the step before runs "
        "(as dlprobe's host path on a CUDA device does; PyTorch: DataLoader(pin_memory=True) "
        "and .to(device, non_blocking=True); tf.data: prefetch_to_device), or decode on the GPU "
        "(--data-decode gpu)";
    return f;
  }
  if (in_time && facts.input == "jpeg-gpu" && !copy_counts) {
    f.message = fmt::format(
        "input-bound by the decoding's share of the GPU: training from JPEGs runs at {:.1f} % "
        "of the synthetic throughput; the batches are ready in time ({:.1f} ms) but a step "
        "takes {:.1f} ms beside the decoding against {:.1f} ms on the synthetic batch",
        100 * share, fetch_ms, fed_ms, step_ms);
    f.fix = queues +
            "the decoding and the step share the GPU: decode on the host's cores where they keep "
            "up (--data-decode cpu; `dlprobe pipeline DIR --device cuda:N --decode cpu` measures "
            "their rate delivered to the GPU), or store smaller images (e.g. 256 pixels on the "
            "short side), which leaves less to decode";
    return f;
  }
  f.message = fmt::format(
      "input-bound: training from JPEGs runs at {:.1f} % of the synthetic throughput", 100 * share);
  f.fix =
      facts.input == "jpeg-gpu"
          ? queues +
                "more loader threads (--data-threads) if the readers cannot keep up; nvJPEG's "
                "hardware engine where the GPU has one (drop --cuda-decoder); smaller stored "
                "images (e.g. 256 pixels on the short side); a faster disk if the files are not "
                "in the page cache"
          : "decode on the GPU (--data-decode gpu); more loader threads (--data-threads) or "
            "cores; keep decoded images in memory (a cache, as tf.data's cache()); smaller "
            "stored images (e.g. 256 pixels on the short side)";
  return f;
}

}  // namespace dlprobe::bench
