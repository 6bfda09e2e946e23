#include "dlprobe/bench/sweep.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "dlprobe/core/clock.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/log.h"
#include "dlprobe/device/fastest_settings.h"
#include "dlprobe/monitor/sampler.h"

namespace dlprobe::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The energy counter in joules, read on its own (about 4 ms on an H200, so only at window edges).
std::optional<double> energy_counter_j(const TelemetrySource& source) {
  nvml::SampleOptions options;
  options.energy_counter = true;
  auto sample = source.nvml->sample(source.gpu, options);
  if (!sample || !sample->energy_mj) return std::nullopt;
  return static_cast<double>(*sample->energy_mj) / 1e3;
}

}  // namespace

std::vector<std::int64_t> auto_batches(const AutoBatch& a) {
  std::vector<std::int64_t> out;
  for (std::int64_t b = std::max<std::int64_t>(a.start, 1); b <= a.limit; b *= 2) {
    out.push_back(b);
  }
  return out;
}

Result<Expanded> expand(const SweepAxes& axes, DeviceKind device) {
  Expanded out;
  bool planned = false;
  if (axes.memory) {
    planned = axes.memory->planned;
    out.allocation = axes.memory->allocator;
    out.gpu_memory = axes.memory->text;
    if (axes.graph == true && !planned) {
      return invalid_argument("a graph needs the planned memory (it replays fixed addresses)");
    }
  } else {
    // A graph asked for brings the arena it needs.
    planned = axes.graph == true;
    for (const engine::Precision p : axes.precisions)
      planned = planned || device::fastest_settings(device, p).planned;
    out.gpu_memory = planned ? "planned" : "grow";
  }
  if (axes.streams > 1 && !planned) {
    return invalid_argument(
        "a second stream needs the planned memory: plan it, or take one stream");
  }
  if (axes.stream_lag && *axes.stream_lag < 0) {
    return invalid_argument(
        fmt::format("a stream lag is a count of calls, 0 for no bound; got {}", *axes.stream_lag));
  }
  if (axes.stream_lag > 0 && axes.streams == 1) {
    return invalid_argument(
        "a stream lag bounds the second stream, and one stream was asked for: take two streams "
        "(or auto), or no lag");
  }
  const bool recompute = axes.base.recompute_block_outputs;
  if (axes.streams > 1 && recompute) {
    return invalid_argument(
        "a second stream keeps recomputed block outputs to the end of the backward pass: take "
        "one stream, or keep the outputs");
  }

  device::Picks layouts;
  device::Picks graphs;
  device::Picks streams;
  device::Picks lags;
  for (const model::Arch arch : axes.models) {
    for (const engine::Precision precision : axes.precisions) {
      const device::FastestSettings best = device::fastest_settings(device, precision);
      for (const engine::StepMode mode : axes.modes) {
        std::vector<Layout> each = axes.layouts;
        if (each.empty()) {
          each = {best.layout};
          layouts.add(device::layout_flag(best.layout), engine::precision_name(precision));
        }
        const bool graph = axes.graph.value_or(best.graph && planned);
        if (!axes.graph) graphs.add(graph ? "on" : "off", engine::precision_name(precision));
        const bool streams_open = !axes.streams && planned && !recompute;
        // The CPU backends have one stream: no choice to tell of there.
        if (!axes.streams && device == DeviceKind::cuda) {
          const std::int64_t up_to = streams_open ? best.two_streams_up_to : 0;
          const std::string above =
              best.stream_lag_above == 0 ? "1"
              : axes.stream_lag          ? "2"
                                : fmt::format("2 with --stream-lag {}", best.stream_lag_above);
          streams.add(up_to > 0 ? fmt::format("2 up to batch {}, {} above", up_to, above) : "1",
                      engine::precision_name(precision));
        }
        if (axes.streams > 1 && !axes.stream_lag && device == DeviceKind::cuda) {
          lags.add(best.stream_lag_above > 0
                       ? fmt::format("0 up to batch {}, {} above", best.two_streams_up_to,
                                     best.stream_lag_above)
                       : "0",
                   engine::precision_name(precision));
        }
        for (const Layout layout : each) {
          SweepGroup g;
          g.step = axes.base;
          g.step.model.arch = arch;
          g.step.precision = precision;
          g.step.mode = mode;
          g.step.layout = layout;
          g.step.memory_plan = planned ? engine::MemoryPlan::planned : engine::MemoryPlan::dynamic;
          g.step.graph = graph;
          g.step.streams = axes.streams.value_or(1);
          g.step.stream_lag = axes.stream_lag.value_or(0);
          g.streams_open = streams_open;
          g.stream_lag_open = !axes.stream_lag;
          g.two_streams_up_to = best.two_streams_up_to;
          g.stream_lag_above = best.stream_lag_above;
          g.batches = axes.batches;
          g.auto_batch = axes.auto_batch;
          out.groups.push_back(std::move(g));
        }
      }
    }
  }
  std::vector<std::string> picked;
  if (!layouts.empty()) picked.push_back("layout " + layouts.text());
  if (!axes.memory) picked.push_back("gpu-memory " + out.gpu_memory);
  if (!graphs.empty()) picked.push_back("graph " + graphs.text());
  if (!streams.empty()) picked.push_back("streams " + streams.text());
  if (!lags.empty()) picked.push_back("stream-lag " + lags.text());
  out.picked = fmt::format("{}", fmt::join(picked, ", "));
  return out;
}

std::size_t planned_configurations(const Sweep& sweep) {
  std::size_t n = 0;
  for (const SweepGroup& g : sweep.groups) {
    n += g.auto_batch ? auto_batches(sweep.auto_batch).size() : g.batches.size();
  }
  // Training from JPEGs doubles each configuration.
  return sweep.data ? 2 * n : n;
}

SweepOutcome run_sweep(const Sweep& sweep, const SweepEnvironment& env,
                       const SweepCallbacks& callbacks) {
  SweepOutcome out;
  const auto sweep_start = Clock::now();
  const auto stop_requested = [&] { return env.interrupt != nullptr && env.interrupt->load() > 0; };

  std::unique_ptr<monitor::Sampler> sampler;
  const TelemetrySource* tel = env.telemetry;
  if (tel != nullptr && tel->nvml) {
    monitor::SamplerOptions options;
    options.interval = tel->interval;
    options.gpus = {tel->gpu};
    options.processes = true;
    auto started = monitor::Sampler::start(tel->nvml, options);
    if (started) {
      sampler = std::move(started).value();
    } else {
      log_warn("no GPU telemetry during the sweep: {}", started.status().message());
    }
  }

  // One engine per compute type (fp64 needs its own reference backend); normally just one.
  std::map<DType, std::unique_ptr<device::Engine>> engines;
  const auto compute_of = [](engine::Precision p) {
    return p == engine::Precision::fp64 ? DType::fp64 : DType::fp32;
  };
  // The engine a run takes: the sweep's shared one, or, for each of several runs from scratch, one
  // of its own (kept in `fresh`).
  const auto engine_of_run =
      [&](device::Engine* shared, engine::Precision p,
          std::unique_ptr<device::Engine>& fresh) -> Result<device::Engine*> {
    if (shared != nullptr) return shared;
    DLPROBE_ASSIGN_OR_RETURN(fresh, device::Engine::open(sweep.device, sweep.backend, sweep.conv,
                                                         compute_of(p), sweep.allocation));
    return fresh.get();
  };
  const auto engine_for = [&](engine::Precision p) -> Result<device::Engine*> {
    const DType compute = compute_of(p);
    auto it = engines.find(compute);
    if (it == engines.end()) {
      DLPROBE_ASSIGN_OR_RETURN(auto e, device::Engine::open(sweep.device, sweep.backend, sweep.conv,
                                                            compute, sweep.allocation));
      it = engines.emplace(compute, std::move(e)).first;
    }
    return it->second.get();
  };

  std::size_t planned = planned_configurations(sweep);
  std::size_t index = 0;
  std::size_t finished = 0;
  double finished_seconds = 0;
  for (const SweepGroup& group : sweep.groups) {
    const std::vector<std::int64_t> batches =
        group.auto_batch ? auto_batches(sweep.auto_batch) : group.batches;
    std::vector<diagnosis::SweepPointFacts> points;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      if (stop_requested()) {
        out.interrupted = true;
        break;
      }
      ++index;
      Measured m;
      m.step = group.step_at(batches[b]);
      m.device = sweep.device;
      m.backend = sweep.backend;
      m.gpu_memory = sweep.gpu_memory;
      const std::string label =
          results::describe(results::Kind::native, settings_of(m.step, m.device, m.backend));
      const auto config_start = Clock::now();

      // One run takes the sweep's engine; more take one each (below).
      device::Engine* shared = nullptr;
      if (sweep.runs == 1) {
        auto engine = engine_for(m.step.precision);
        if (!engine) {
          out.status = engine.status();
          return out;
        }
        shared = *engine;
      }
      if (auto flops = flops_per_image(m.step.model, m.step.mode)) m.flops_per_item = *flops;
      if (auto c = env.ceilings.find(m.step.precision); c != env.ceilings.end()) {
        m.ceiling = c->second;
      }

      std::vector<WindowTelemetry> windows;
      std::optional<double> energy_at_begin;
      Hooks hooks;
      hooks.progress = [&](const Progress& p) {
        if (!callbacks.progress) return;
        SweepProgress sp;
        sp.index = index;
        sp.planned = planned;
        sp.label = label;
        sp.step = p;
        sp.elapsed_s = seconds_since(sweep_start);
        if (finished > 0) {
          const double per = finished_seconds / static_cast<double>(finished);
          sp.eta_s = std::max(
              0.0, per * static_cast<double>(planned - index + 1) - seconds_since(config_start));
        }
        callbacks.progress(sp);
      };
      if (sampler) {
        hooks.window_discarded = [&](int) { windows.pop_back(); };
        hooks.window_begin = [&](int) {
          energy_at_begin = energy_counter_j(*tel);
          windows.emplace_back().begin_ns = steady_now_ns();
        };
        hooks.window_end = [&](int) {
          WindowTelemetry& w = windows.back();
          w.end_ns = steady_now_ns();
          const std::optional<double> energy_at_end = energy_counter_j(*tel);
          if (energy_at_begin && energy_at_end && *energy_at_end >= *energy_at_begin) {
            w.counter_energy_j = *energy_at_end - *energy_at_begin;
          }
          w.ticks = sampler->window(w.begin_ns, w.end_ns);
        };
      }

      BenchOptions options;
      options.step = m.step;
      options.protocol = sweep.protocol;
      options.weights = sweep.weights;
      options.profile_steps = sweep.profile_steps;
      options.interrupt = env.interrupt;
      // Every run to its end, unless one fails or is interrupted: what the others measured stays.
      std::vector<BenchResult> runs;
      Status failure = Status::ok();
      bool interrupted = false;
      for (int k = 0; k < sweep.runs && failure.is_ok() && !interrupted; ++k) {
        std::unique_ptr<device::Engine> fresh;
        auto on = engine_of_run(shared, m.step.precision, fresh);
        if (!on) {
          out.status = on.status();
          return out;
        }
        Result<BenchResult> run = run_bench(**on, options, hooks);
        if (!run) {
          failure = run.status();
          // After an out-of-memory the allocator still tells what was held where.
          if (failure.code() == Errc::out_of_memory) m.memory = (*on)->allocator().stats();
          break;
        }
        interrupted = run->interrupted;
        runs.push_back(std::move(run).value());
      }
      for (const BenchResult& r : runs) m.runs.push_back(&r);
      // The results say what ran: no recomputation where the step had none to do.
      if (!runs.empty()) m.step.recompute_block_outputs = runs.front().recomputed_block_outputs;
      if (!failure.is_ok()) {
        const bool oom = failure.code() == Errc::out_of_memory;
        m.status = oom ? results::RunStatus::oom : results::RunStatus::failed;
        m.error = failure.message();
      } else if (!runs.empty()) {
        m.memory = runs.front().memory;
      }
      if (interrupted) {
        std::int64_t timed = 0;
        for (const BenchResult& r : runs) timed += r.timed_steps();
        m.status = results::RunStatus::interrupted;
        m.error = fmt::format("{} after {} timed steps", kInterrupted, timed);
      }
      if (sampler) {
        m.telemetry = telemetry_over(windows, tel->gpu);
        m.others = other_processes(windows, tel->gpu, static_cast<unsigned>(::getpid()));
      }
      results::Configuration c = to_configuration(m);
      points.push_back(
          {m.step.batch, c.status == results::RunStatus::ok, c.status == results::RunStatus::oom,
           c.statistics ? std::optional<double>(c.statistics->throughput) : std::nullopt});
      const results::RunStatus status = c.status;
      out.configurations.push_back(std::move(c));
      out.runs.push_back(std::move(runs));
      // The walk ends at its first out-of-memory; finding it is what the walk is for.
      const bool walk_ends = group.auto_batch && status == results::RunStatus::oom;
      const std::size_t per_batch = sweep.data ? 2 : 1;
      // A configuration that did not finish is not run from JPEGs.
      if (sweep.data && status != results::RunStatus::ok) --planned;
      if (walk_ends) {
        planned -= (batches.size() - b - 1) * per_batch;
      } else if (status != results::RunStatus::ok) {
        ++out.incomplete;
      }
      if (callbacks.done) {
        if (Status s = callbacks.done(out.configurations, planned); !s) {
          out.status = s;
          return out;
        }
      }
      finished_seconds += seconds_since(config_start);
      ++finished;
      if (interrupted || stop_requested()) {
        out.interrupted = true;
        break;
      }
      if (walk_ends) break;
      if (sweep.data && status == results::RunStatus::ok) {
        // The same configuration from JPEGs, once, right after the synthetic run: in the same
        // engine, or a new one where the runs each had their own.
        windows.clear();
        options.data = &*sweep.data;
        std::unique_ptr<device::Engine> fresh;
        auto on = engine_of_run(shared, m.step.precision, fresh);
        if (!on) {
          out.status = on.status();
          return out;
        }
        Result<BenchResult> fed = run_bench(**on, options, hooks);
        Measured d = m;
        d.runs.clear();
        d.memory.reset();
        d.input = input_setting(*sweep.data, sweep.device);
        if (fed) {
          d.runs = {&fed.value()};
          d.memory = fed->memory;
          if (fed->interrupted) {
            d.status = results::RunStatus::interrupted;
            d.error = fmt::format("{} after {} timed steps", kInterrupted, fed->timed_steps());
          }
        } else {
          d.status = fed.status().code() == Errc::out_of_memory ? results::RunStatus::oom
                                                                : results::RunStatus::failed;
          d.error = fed.status().message();
        }
        if (sampler) {
          d.telemetry = telemetry_over(windows, tel->gpu);
          d.others = other_processes(windows, tel->gpu, static_cast<unsigned>(::getpid()));
        }
        results::Configuration dc = to_configuration(d);
        if (fed && fed->input && dc.statistics) {
          dc.findings.push_back(input_finding(out.configurations.back(), dc, *fed->input));
        }
        if (dc.status != results::RunStatus::ok) ++out.incomplete;
        const bool stopped = fed && fed->interrupted;
        out.configurations.push_back(std::move(dc));
        std::vector<BenchResult> fed_runs;
        if (fed) fed_runs.push_back(std::move(fed).value());
        out.runs.push_back(std::move(fed_runs));
        if (callbacks.done) {
          if (Status s = callbacks.done(out.configurations, planned); !s) {
            out.status = s;
            return out;
          }
        }
        if (stopped || stop_requested()) {
          out.interrupted = true;
          break;
        }
      }
    }
    if (points.size() >= 2) {
      const std::string name =
          results::series_label(results::Kind::native, out.configurations.back().settings);
      for (diagnosis::Finding f : diagnosis::diagnose_batch_sweep(points)) {
        // That rule's words are about a GPU left idle by launch overhead; on the CPU they mislead.
        if (sweep.device.kind == DeviceKind::cpu && f.id == "small_batch_slow") continue;
        f.title += fmt::format(" ({})", name);
        out.findings.push_back(std::move(f));
      }
    }
    if (out.interrupted) break;
  }
  return out;
}

}  // namespace dlprobe::bench
