#include "dlprobe/monitor/sampler.h"
#include "dlprobe/core/units.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dlprobe/core/log.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::monitor {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

template <class T>
std::optional<double> as_double(const std::optional<T>& v) {
  if (!v) return std::nullopt;
  return static_cast<double>(*v);
}

ColumnStats stats_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  ColumnStats s;
  s.count = values.size();
  s.min = values.front();
  s.max = values.back();
  s.median = stats::percentile_sorted(values, 0.5);
  return s;
}

double trapezoid_j(std::int64_t t0_ns, double p0_w, std::int64_t t1_ns, double p1_w) {
  return (p0_w + p1_w) / 2.0 * static_cast<double>(t1_ns - t0_ns) / 1e9;
}

}  // namespace

std::string_view column_name(Column column) {
  return name_of(kColumnNames, column, "unknown");
}

std::optional<double> column_value(const nvml::DeviceSample& s, Column column) {
  switch (column) {
    case Column::gpu_util_pct:
      return as_double(s.gpu_util_pct);
    case Column::mem_util_pct:
      return as_double(s.mem_util_pct);
    case Column::mem_used_mib:
      if (!s.mem_used_bytes) return std::nullopt;
      return static_cast<double>(*s.mem_used_bytes) / kMiB;
    case Column::power_w:
      return s.power_w;
    case Column::temperature_c:
      return as_double(s.temperature_c);
    case Column::sm_clock_mhz:
      return as_double(s.sm_clock_mhz);
    case Column::mem_clock_mhz:
      return as_double(s.mem_clock_mhz);
    case Column::pcie_rx_kbps:
      return as_double(s.pcie_rx_kbps);
    case Column::pcie_tx_kbps:
      return as_double(s.pcie_tx_kbps);
  }
  return std::nullopt;
}

std::string_view energy_source_name(EnergySource source) {
  switch (source) {
    case EnergySource::none:
      return "none";
    case EnergySource::counter:
      return "counter";
    case EnergySource::power_integral:
      return "power_integral";
  }
  return "none";
}

Summary summarize(const std::vector<Tick>& ticks) {
  Summary summary;
  summary.ticks = ticks.size();
  if (ticks.empty()) return summary;
  summary.first_ns = ticks.front().timestamp_ns;
  summary.last_ns = ticks.back().timestamp_ns;

  // GPUs in the order they first appear.
  std::map<unsigned, std::size_t> slot;
  for (const Tick& tick : ticks) {
    for (const GpuReading& r : tick.gpus) {
      if (slot.emplace(r.gpu, summary.gpus.size()).second) summary.gpus.emplace_back().gpu = r.gpu;
    }
  }
  for (GpuSummary& gs : summary.gpus) {
    std::array<std::vector<double>, kColumns.size()> values;
    const GpuReading* first_reading = nullptr;
    const GpuReading* last_reading = nullptr;
    // Counter readings within the span: the summary's energy came from the counter only where it
    // was read again after the first reading (it is read once a second; power fills in between).
    std::size_t counter_reads = 0;
    const nvml::DeviceSample* first_counter = nullptr;
    const nvml::DeviceSample* last_counter = nullptr;
    const nvml::DeviceSample* previous_power = nullptr;
    double integral_j = 0;
    std::size_t power_samples = 0;
    for (const Tick& tick : ticks) {
      for (const GpuReading& r : tick.gpus) {
        if (r.gpu != gs.gpu) continue;
        ++gs.samples;
        if (first_reading == nullptr) first_reading = &r;
        last_reading = &r;
        for (std::size_t c = 0; c < kColumns.size(); ++c) {
          if (auto v = column_value(r.sample, kColumns[c])) values[c].push_back(*v);
        }
        if (r.energy_from_counter) ++counter_reads;
        if (r.sample.energy_mj) {
          if (first_counter == nullptr) first_counter = &r.sample;
          last_counter = &r.sample;
        }
        if (r.sample.power_w) {
          if (previous_power != nullptr) {
            integral_j += trapezoid_j(previous_power->timestamp_ns, *previous_power->power_w,
                                      r.sample.timestamp_ns, *r.sample.power_w);
          }
          previous_power = &r.sample;
          ++power_samples;
        }
      }
    }
    for (std::size_t c = 0; c < kColumns.size(); ++c) {
      if (!values[c].empty()) gs.columns[c] = stats_of(std::move(values[c]));
    }
    if (first_reading != last_reading && first_reading->energy_since_start_j &&
        last_reading->energy_since_start_j) {
      gs.energy_j = *last_reading->energy_since_start_j - *first_reading->energy_since_start_j;
      gs.energy_source = counter_reads >= 2 ? EnergySource::counter : EnergySource::power_integral;
    } else if (first_counter != nullptr && first_counter != last_counter &&
               *last_counter->energy_mj >= *first_counter->energy_mj) {
      gs.energy_j = static_cast<double>(*last_counter->energy_mj - *first_counter->energy_mj) / 1e3;
      gs.energy_source = EnergySource::counter;
    } else if (power_samples >= 2) {
      gs.energy_j = integral_j;
      gs.energy_source = EnergySource::power_integral;
    }
  }
  return summary;
}

struct Sampler::State {
  std::shared_ptr<nvml::Library> nvml;
  SamplerOptions options;
  std::vector<unsigned> gpus;
  Clock::time_point started;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  bool stop_requested = false;
  bool finished = false;
  Status status;
  std::deque<Tick> ring;
  bool wrapped = false;
  Overhead overhead;
  std::chrono::nanoseconds total_tick{};

  std::thread thread;

  // Sampler-thread-only state.
  struct Energy {
    std::optional<std::uint64_t> counter_base_mj;
    std::uint64_t counter_last_mj = 0;
    std::optional<std::int64_t> counter_read_ns;  // when the counter was last asked for
    std::optional<std::int64_t> last_power_ns;
    double last_power_w = 0;
    double integral_j = 0;                // power integrated since start
    double integral_since_counter_j = 0;  // power integrated since the last counter reading
    double reported_j = 0;                // the most given as energy since start so far
  };

  // Whether this round should read the energy counter for `gpu`.
  bool energy_due(unsigned gpu, std::int64_t now_ns) {
    Energy& e = energy[gpu];
    if (!e.counter_read_ns || now_ns - *e.counter_read_ns >= options.energy_interval.count()) {
      e.counter_read_ns = now_ns;
      return true;
    }
    return false;
  }
  std::map<unsigned, Energy> energy;
  std::map<unsigned, std::uint64_t> putil_seen_us;
  std::map<unsigned, std::map<unsigned, nvml::ProcessUtilization>> putil_latest;
  std::map<unsigned, bool> process_warned;

  void add_energy(unsigned gpu, GpuReading& r) {
    Energy& e = energy[gpu];
    const nvml::DeviceSample& s = r.sample;
    if (s.power_w) {
      if (e.last_power_ns) {
        const double j = trapezoid_j(*e.last_power_ns, e.last_power_w, s.timestamp_ns, *s.power_w);
        e.integral_j += j;
        e.integral_since_counter_j += j;
      }
      e.last_power_ns = s.timestamp_ns;
      e.last_power_w = *s.power_w;
    }
    // A counter that went backwards (driver reload) cannot be trusted: fall back to power.
    if (s.energy_mj && (!e.counter_base_mj || *s.energy_mj >= *e.counter_base_mj)) {
      if (!e.counter_base_mj) e.counter_base_mj = *s.energy_mj;
      e.counter_last_mj = *s.energy_mj;
      e.integral_since_counter_j = 0;
      r.energy_from_counter = true;
    }
    if (e.counter_base_mj) {
      // Never below what was given before: power's estimate between two readings may run ahead of
      // the counter, and a figure that falls reads as a reset to a Prometheus counter.
      e.reported_j =
          std::max(e.reported_j, static_cast<double>(e.counter_last_mj - *e.counter_base_mj) / 1e3 +
                                     e.integral_since_counter_j);
      r.energy_since_start_j = e.reported_j;
    } else if (e.last_power_ns) {
      r.energy_since_start_j = e.integral_j;
    }
  }

  std::vector<ProcessRow> process_rows(unsigned gpu) {
    std::vector<ProcessRow> rows;
    auto processes = nvml->processes(gpu);
    if (!processes) {
      // Said once per GPU: the same reason would repeat every round.
      if (!process_warned[gpu]) {
        log_warn("GPU {}: no per-process rows: {}", gpu, processes.status().message());
        process_warned[gpu] = true;
      }
      return rows;
    }
    auto& latest = putil_latest[gpu];
    if (auto samples = nvml->process_utilization(gpu, putil_seen_us[gpu])) {
      for (const auto& u : *samples) {
        auto& seen = putil_seen_us[gpu];
        seen = std::max(seen, u.timestamp_us);
        auto it = latest.find(u.pid);
        if (it == latest.end() || it->second.timestamp_us <= u.timestamp_us) latest[u.pid] = u;
      }
    }
    std::map<unsigned, nvml::ProcessUtilization> still_running;
    for (const auto& p : *processes) {
      ProcessRow& row = rows.emplace_back();
      row.pid = p.pid;
      row.used_bytes = p.used_bytes;
      if (auto it = latest.find(p.pid); it != latest.end()) {
        row.sm_util_pct = it->second.sm_util_pct;
        row.mem_util_pct = it->second.mem_util_pct;
        still_running.insert(*it);
      }
    }
    latest = std::move(still_running);
    return rows;
  }

  Result<Tick> take(std::uint64_t index) {
    Tick tick;
    tick.index = index;
    tick.timestamp_ns = to_ns(Clock::now());
    for (unsigned gpu : gpus) {
      GpuReading& r = tick.gpus.emplace_back();
      r.gpu = gpu;
      const nvml::SampleOptions sample_options{
          .pcie_throughput = options.pcie_throughput,
          .energy_counter = energy_due(gpu, tick.timestamp_ns)};
      DLPROBE_ASSIGN_OR_RETURN(r.sample, nvml->sample(gpu, sample_options));
      add_energy(gpu, r);
      if (options.processes) r.processes = process_rows(gpu);
    }
    return tick;
  }

  void run() {
    auto next = started;
    for (std::uint64_t index = 0;; ++index) {
      const auto begin = Clock::now();
      auto tick = take(index);
      const auto spent = Clock::now() - begin;
      if (!tick) {
        std::lock_guard lock(mutex);
        status = tick.status().with_context("sampling stopped");
        break;
      }
      {
        std::lock_guard lock(mutex);
        overhead.ticks = index + 1;
        total_tick += spent;
        overhead.max_tick = std::max<std::chrono::nanoseconds>(overhead.max_tick, spent);
        overhead.mean_tick = total_tick / static_cast<std::int64_t>(overhead.ticks);
        overhead.thread_cpu = thread_cpu_time();
        ring.push_back(*tick);
        if (ring.size() > options.ring_capacity) {
          ring.pop_front();
          wrapped = true;
        }
      }
      if (options.sink) options.sink(*tick);
      if (options.max_ticks != 0 && index + 1 >= options.max_ticks) break;

      // A fixed schedule, so the rate does not drift by the time each round takes; rounds that
      // could not start in time are skipped and counted, not bunched up.
      next += options.interval;
      const auto now = Clock::now();
      if (next < now) {
        const auto behind = (now - next) / options.interval + 1;
        next += behind * options.interval;
        std::lock_guard lock(mutex);
        overhead.missed_ticks += static_cast<std::uint64_t>(behind);
      }
      std::unique_lock lock(mutex);
      if (changed.wait_until(lock, next, [&] { return stop_requested; })) break;
    }
    std::lock_guard lock(mutex);
    overhead.thread_cpu = thread_cpu_time();
    overhead.wall = Clock::now() - started;
    finished = true;
    changed.notify_all();
  }
};

Sampler::Sampler(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<Sampler>> Sampler::start(std::shared_ptr<nvml::Library> nvml,
                                                SamplerOptions options) {
  if (nvml == nullptr) return error(Errc::invalid_argument, "sampler: no NVML library");
  if (options.interval < kMinInterval) {
    return invalid_argument(fmt::format("sampling interval {}ms is below the minimum of {}ms",
                                        options.interval.count() / 1'000'000,
                                        kMinInterval.count() / 1'000'000));
  }
  if (options.ring_capacity == 0) {
    return invalid_argument("sampler: the ring must hold at least one round");
  }
  DLPROBE_ASSIGN_OR_RETURN(unsigned count, nvml->device_count());
  auto state = std::make_unique<State>();
  if (options.gpus.empty()) {
    for (unsigned i = 0; i < count; ++i) state->gpus.push_back(i);
  } else {
    for (unsigned gpu : options.gpus) {
      if (gpu >= count) {
        return invalid_argument(fmt::format("GPU {} does not exist (NVML sees {} GPU{})", gpu,
                                            count, count == 1 ? "" : "s"));
      }
      if (std::find(state->gpus.begin(), state->gpus.end(), gpu) == state->gpus.end()) {
        state->gpus.push_back(gpu);
      }
    }
  }
  if (state->gpus.empty()) return error(Errc::unavailable, "NVML sees no GPU");
  state->nvml = std::move(nvml);
  state->options = std::move(options);
  state->started = Clock::now();
  State* raw = state.get();
  state->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<Sampler>(new Sampler(std::move(state)));
}

Sampler::~Sampler() {
  stop();
}

void Sampler::stop() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop_requested = true;
  }
  state_->changed.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

bool Sampler::wait_for(std::chrono::nanoseconds timeout) const {
  std::unique_lock lock(state_->mutex);
  return state_->changed.wait_for(lock, timeout, [&] { return state_->finished; });
}

Status Sampler::status() const {
  std::lock_guard lock(state_->mutex);
  return state_->status;
}

const std::vector<unsigned>& Sampler::gpus() const {
  return state_->gpus;
}

std::optional<Tick> Sampler::latest() const {
  std::lock_guard lock(state_->mutex);
  if (state_->ring.empty()) return std::nullopt;
  return state_->ring.back();
}

std::vector<Tick> Sampler::window(std::int64_t t0_ns, std::int64_t t1_ns) const {
  std::lock_guard lock(state_->mutex);
  std::vector<Tick> out;
  for (const Tick& tick : state_->ring) {
    if (tick.timestamp_ns >= t0_ns && tick.timestamp_ns <= t1_ns) out.push_back(tick);
  }
  return out;
}

Summary Sampler::summary() const {
  std::vector<Tick> all;
  {
    std::lock_guard lock(state_->mutex);
    all.assign(state_->ring.begin(), state_->ring.end());
  }
  return summarize(all);
}

Summary Sampler::summary(std::int64_t t0_ns, std::int64_t t1_ns) const {
  return summarize(window(t0_ns, t1_ns));
}

bool Sampler::wrapped() const {
  std::lock_guard lock(state_->mutex);
  return state_->wrapped;
}

Overhead Sampler::overhead() const {
  std::lock_guard lock(state_->mutex);
  Overhead o = state_->overhead;
  if (!state_->finished) o.wall = Clock::now() - state_->started;
  return o;
}

}  // namespace dlprobe::monitor
