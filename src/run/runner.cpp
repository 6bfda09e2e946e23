#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>

#include "dlprobe/core/launcher.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/parallel.h"
#include "dlprobe/monitor/sampler.h"
#include "dlprobe/run/process_tree.h"
#include "dlprobe/run/runner.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::run {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t kMaxTimeline = 20000;  // points kept; a longer run is thinned evenly
constexpr std::size_t kMaxQueuedTicks = 1000;
constexpr std::size_t kMaxProtocolErrors = 5;
constexpr std::size_t kMaxErrorLine = 500;
// When the root has exited, how long stragglers may keep the pipes open before they are killed.
constexpr auto kDrainAfterExit = 2s;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::optional<double> median(const std::vector<double>& v) {
  if (v.empty()) return std::nullopt;
  return stats::median(v);
}

// The measured steps' window, widened to hold at least three of the sample `times` (the fewest a
// figure over the steps is taken from); none when the workload reported no steps.
std::optional<TimeWindow> steps_window(const StepStats& steps, const std::vector<double>& times) {
  if (!steps.measured_start_s || !steps.measured_end_s) return std::nullopt;
  return widen_to_samples({*steps.measured_start_s, *steps.measured_end_s}, times, 3);
}

// Per round of telemetry, the workload's GPU memory three ways; which one the run reports is
// decided at the end (the best attribution that ever worked).
struct RawPoint {
  TelemetryPoint point;
  std::map<unsigned, std::uint64_t> tree_bytes;  // per GPU
  std::map<unsigned, std::uint64_t> new_bytes;
  std::map<unsigned, std::uint64_t> device_bytes;
  bool tree_rows_without_bytes = false;
};

class TickQueue {
 public:
  void push(const monitor::Tick& tick) {
    std::lock_guard lock(mutex_);
    ticks_.push_back(tick);
    while (ticks_.size() > kMaxQueuedTicks) ticks_.pop_front();
  }
  std::deque<monitor::Tick> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(ticks_, {});
  }

 private:
  std::mutex mutex_;
  std::deque<monitor::Tick> ticks_;
};

struct GpuBaseline {
  nvml::DeviceInfo info;
  std::optional<std::uint64_t> used_before;
};

}  // namespace

std::string_view outcome_name(Outcome o) {
  switch (o) {
    case Outcome::ok:
      return "ok";
    case Outcome::failed:
      return "failed";
    case Outcome::oom:
      return "oom";
    case Outcome::crashed:
      return "crashed";
    case Outcome::timeout:
      return "timeout";
    case Outcome::hang:
      return "hang";
    case Outcome::interrupted:
      return "interrupted";
    case Outcome::launch_error:
      return "launch_error";
  }
  return "?";
}

std::string_view attribution_name(Attribution a) {
  switch (a) {
    case Attribution::none:
      return "none";
    case Attribution::process_tree:
      return "process_tree";
    case Attribution::new_processes:
      return "new_processes";
    case Attribution::device_wide:
      return "device_wide";
  }
  return "?";
}

namespace {

// Everything run_workload accumulates while the workload runs.
class Run {
 public:
  Run(const RunOptions& o, RunResult& r) : o_(o), r_(r) {}

  void setup_telemetry();
  Status launch();
  void loop();
  void finish();

 private:
  void on_line(Stream stream, std::string_view line);
  void poll_tree();
  void take_ticks();
  std::vector<int> workload_pids() const;
  void send(int sig);
  void escalate(Clock::time_point now);
  void kill_leftovers(const ChildProcess::LineSink& sink);
  void compute_gpu_figures();
  void compute_host_figures();
  void decide_outcome();

  const RunOptions& o_;
  RunResult& r_;
  Clock::time_point start_;
  std::unique_ptr<ChildProcess> child_;
  std::unique_ptr<TreeTracker> tracker_;
  std::unique_ptr<monitor::Sampler> sampler_;
  TickQueue queue_;
  std::map<unsigned, GpuBaseline> gpus_;
  std::set<unsigned> baseline_pids_;
  std::set<int> tree_ever_;
  std::vector<int> tree_now_;
  TreeReading last_reading_;
  // A time-line point at `timestamp_ns` (steady clock) holding the host side of `reading`.
  TelemetryPoint host_point(std::int64_t timestamp_ns, const TreeReading& reading) const;
  std::vector<RawPoint> raw_;
  std::size_t raw_stride_ = 1;  // keep every n-th point after thinning
  std::size_t raw_seen_ = 0;
  std::vector<TreeReading> host_readings_;
  std::vector<StepRecord> steps_;
  std::vector<double> rates_;
  bool rates_from_regex_ = false;
  std::optional<double> last_rate_s_;  // when the last reported rate arrived, from launch
  // Figures printed in a known form (match_printed_figure), with their arrival; used when the
  // workload reports neither steps nor rates through the protocol or a regex.
  struct Printed {
    PrintedFigure figure;
    double t_s = 0;
  };
  std::vector<Printed> printed_;
  std::optional<std::int64_t> printed_batch_;
  void on_printed(const PrintedFigure& f, double t, std::string_view line);
  void warn(std::string text);
  // The headline rate from printed_, into rates_ (and its line's arrival into last_rate_s_).
  void use_printed();
  std::string printed_format_;
  std::optional<std::int64_t> protocol_warmup_;
  Clock::time_point last_activity_;
  std::set<unsigned> workload_gpus_;  // where its processes' memory has been seen so far
  enum class Stop { none, interrupted, timeout, hang };
  Stop stop_ = Stop::none;
  std::vector<int> signal_plan_;  // signals still to send, in order
  Clock::time_point last_signal_{};
  int interrupts_seen_ = 0;
};

void Run::setup_telemetry() {
  if (!o_.nvml) {
    r_.gpu.telemetry_note = "NVML not available";
    return;
  }
  monitor::SamplerOptions so;
  so.interval = o_.interval;
  so.gpus = o_.gpus;
  so.processes = true;
  so.ring_capacity = 16;  // the runner keeps its own time line
  so.sink = [this](const monitor::Tick& tick) { queue_.push(tick); };
  std::vector<unsigned> indices = o_.gpus;
  if (indices.empty()) {
    if (auto count = o_.nvml->device_count()) {
      for (unsigned i = 0; i < *count; ++i) indices.push_back(i);
    }
  }
  for (unsigned i : indices) {
    GpuBaseline b;
    if (auto info = o_.nvml->device_info(i)) b.info = std::move(info).value();
    if (auto sample = o_.nvml->sample(i)) b.used_before = sample->mem_used_bytes;
    if (auto procs = o_.nvml->processes(i)) {
      for (const auto& p : *procs) baseline_pids_.insert(p.pid);
    }
    gpus_[i] = std::move(b);
  }
  auto sampler = monitor::Sampler::start(o_.nvml, std::move(so));
  if (!sampler) {
    r_.gpu.telemetry_note = "GPU sampling failed: " + sampler.status().message();
    return;
  }
  sampler_ = std::move(sampler).value();
  r_.gpu.telemetry = true;
}

Status Run::launch() {
  SpawnOptions so;
  so.argv = o_.argv;
  so.env_set = o_.env_set;
  // Python buffers a pipe's output in 8 KiB blocks: lines would arrive late and in bursts, which
  // breaks hang detection and timing from arrival.
  if (std::getenv("PYTHONUNBUFFERED") == nullptr && so.env_set.count("PYTHONUNBUFFERED") == 0) {
    so.env_set["PYTHONUNBUFFERED"] = "1";
  }
  // NVLink multicast stays off in the workload unless the user chose (here or with --env).
  if (so.env_set.count(std::string(kNvlsVariable)) == 0) {
    for (auto& [key, value] : nccl_child_env(process_env())) so.env_set[key] = value;
  }
  so.echo = o_.echo;
  so.stdout_path = o_.stdout_log;
  so.stderr_path = o_.stderr_log;
  so.tail_lines = o_.tail_lines;
  start_ = Clock::now();
  last_activity_ = start_;
  auto child = ChildProcess::spawn(so);
  if (!child) return child.status();
  child_ = std::move(child).value();
  std::vector<int> roots{child_->pid()};
  // As a subreaper, orphaned grandchildren become our children: our own descendants are the tree.
  if (o_.subreaper) roots.push_back(static_cast<int>(getpid()));
  tracker_ = std::make_unique<TreeTracker>(roots, child_->pgid(),
                                           std::vector<int>{static_cast<int>(getpid())});
  return Status::ok();
}

void Run::on_line(Stream, std::string_view line) {
  const double t = seconds_between(start_, Clock::now());
  auto record = parse_protocol_line(line);
  if (!record) {
    if (r_.protocol_errors.size() < kMaxProtocolErrors) {
      if (r_.protocol_errors.empty()) log_warn("{}", record.status().message());
      r_.protocol_errors.push_back(record.status().message());
    }
  } else if (record->has_value()) {
    const ProtocolRecord& p = **record;
    if (p.step || p.step_time_s) {
      steps_.push_back({p.step, p.step_time_s, p.data_time_s, p.batch, p.warmup, t});
    } else if (p.items_per_s && !p.warmup.value_or(false)) {
      rates_.push_back(*p.items_per_s);
      last_rate_s_ = t;
    }
    if (p.batch) r_.steps.batch = p.batch;
    if (p.warmup_steps) protocol_warmup_ = p.warmup_steps;
    auto keep_max = [](std::optional<std::uint64_t>& into, std::optional<std::uint64_t> v) {
      if (v && (!into || *v > *into)) into = v;
    };
    keep_max(r_.framework.peak_bytes, p.framework_peak_bytes);
    keep_max(r_.framework.reserved_bytes, p.framework_reserved_bytes);
    keep_max(r_.framework.allocated_bytes, p.framework_allocated_bytes);
    if (p.framework) r_.framework.framework = p.framework;
    if (p.model) r_.framework.model = p.model;
    if (p.precision) r_.framework.precision = p.precision;
    if (p.channels_last) r_.framework.channels_last = p.channels_last;
    if (p.oom.value_or(false) && !r_.oom) {
      Framework f = Framework::unknown;
      for (Framework k : {Framework::pytorch, Framework::tensorflow, Framework::jax}) {
        if (p.framework && *p.framework == framework_name(k)) f = k;
      }
      r_.oom = OomMatch{f, p.message.value_or("reported by the workload")};
    }
    if (p.end) r_.end_marker = true;
    return;
  }
  if (!o_.throughput_regex) {
    if (auto f = match_printed_figure(line)) on_printed(*f, t, line);
  } else {
    if (auto m = o_.throughput_regex->match(line)) {
      if (m->step_time_s) {
        steps_.push_back({m->step, m->step_time_s, std::nullopt, std::nullopt, std::nullopt, t});
      } else if (m->items_per_s) {
        rates_.push_back(*m->items_per_s);
        rates_from_regex_ = true;
        last_rate_s_ = t;
      }
    }
  }
  if (!r_.oom) {
    if (auto oom = detect_oom(line)) r_.oom = std::move(oom);
  }
  if (looks_like_error(line)) r_.error_line = std::string(line.substr(0, kMaxErrorLine));
}

void Run::warn(std::string text) {
  if (r_.warnings.size() >= kMaxProtocolErrors) return;
  log_warn("{}", text);
  r_.warnings.push_back(std::move(text));
}

void Run::on_printed(const PrintedFigure& f, double t, std::string_view line) {
  const bool bad = !std::isfinite(f.value) || f.value < 0 ||
                   (f.kind == PrintedFigure::Kind::batch && f.value < 1) ||
                   (f.kind == PrintedFigure::Kind::step_time_s && f.value == 0);
  if (bad) {
    warn(fmt::format("the workload printed an invalid figure ({}), not used: {}", f.format,
                     line.substr(0, 200)));
    return;
  }
  if (f.kind == PrintedFigure::Kind::batch) {
    printed_batch_ = std::llround(f.value);
    return;
  }
  printed_.push_back({f, t});
}

void Run::use_printed() {
  if (printed_.empty()) return;
  const auto batch = o_.batch ? o_.batch : printed_batch_;
  auto items = [&](const PrintedFigure& f) -> std::optional<double> {
    switch (f.kind) {
      case PrintedFigure::Kind::items_per_s:
        return f.value;
      case PrintedFigure::Kind::steps_per_s:
        if (batch) return f.value * static_cast<double>(*batch);
        return std::nullopt;
      case PrintedFigure::Kind::step_time_s:
        if (batch) return static_cast<double>(*batch) / f.value;
        return std::nullopt;
      case PrintedFigure::Kind::batch:
        break;
    }
    return std::nullopt;
  };
  // A closing figure over the timed steps wins, the script's own items per second first (the
  // seed's scripts print it beside the step time it came from); else the progress updates, less
  // the first when there are several (it holds compilation and warm-up, as Keras' first epoch).
  for (const bool rate_only : {true, false}) {
    for (auto it = printed_.rbegin(); it != printed_.rend(); ++it) {
      if (!it->figure.summary) continue;
      if (rate_only && it->figure.kind != PrintedFigure::Kind::items_per_s) continue;
      if (auto v = items(it->figure)) {
        rates_ = {*v};
        last_rate_s_ = it->t_s;
        printed_format_ = std::string(it->figure.format);
        return;
      }
    }
  }
  std::vector<const Printed*> progress;
  for (const auto& p : printed_) {
    if (!p.figure.summary && items(p.figure)) progress.push_back(&p);
  }
  if (progress.size() >= 2) progress.erase(progress.begin());
  for (const Printed* p : progress) rates_.push_back(*items(p->figure));
  if (!progress.empty()) {
    last_rate_s_ = progress.back()->t_s;
    printed_format_ = std::string(progress.back()->figure.format);
    return;
  }
  warn(fmt::format(
      "the workload prints its speed per step ({}) but not its batch: give --batch for items per "
      "second",
      printed_.back().figure.format));
}

void Run::poll_tree() {
  TreeReading reading = tracker_->poll();
  tree_now_ = reading.pids;
  tree_ever_.insert(reading.pids.begin(), reading.pids.end());
  host_readings_.push_back(reading);
  last_reading_ = std::move(reading);
}

TelemetryPoint Run::host_point(std::int64_t timestamp_ns, const TreeReading& reading) const {
  TelemetryPoint p;
  const auto start_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count();
  p.t_s = static_cast<double>(timestamp_ns - start_ns) / 1e9;
  p.host_cpu_pct = reading.cpu_pct;
  p.busiest_process_cpu_pct = reading.busiest_cpu_pct;
  p.rss_bytes = reading.rss_bytes;
  p.processes = reading.pids.size();
  return p;
}

void Run::take_ticks() {
  for (const monitor::Tick& tick : queue_.take()) {
    RawPoint raw;
    TelemetryPoint& p = raw.point;
    p = host_point(tick.timestamp_ns, last_reading_);
    bool gpu_active = false;
    std::set<unsigned> busy;  // GPUs whose utilisation was above 0 in this round
    for (const auto& g : tick.gpus) {
      const auto& s = g.sample;
      GpuReading& own = p.gpus[g.gpu];
      own.util_pct = s.gpu_util_pct;
      own.mem_util_pct = s.mem_util_pct;
      own.power_w = s.power_w;
      if (s.temperature_c) own.temperature_c = double(*s.temperature_c);
      own.sm_clock_mhz = s.sm_clock_mhz;
      own.mem_clock_mhz = s.mem_clock_mhz;
      own.used_bytes = s.mem_used_bytes;
      own.clock_event_reasons = s.clock_event_reasons;
      if (s.gpu_util_pct && *s.gpu_util_pct > 0) busy.insert(g.gpu);
      if (s.mem_used_bytes) {
        const auto before = gpus_[g.gpu].used_before.value_or(0);
        raw.device_bytes[g.gpu] = *s.mem_used_bytes > before ? *s.mem_used_bytes - before : 0;
      }
      for (const auto& row : g.processes) {
        const int pid = static_cast<int>(row.pid);
        if (tree_ever_.count(pid) != 0) {
          if (row.used_bytes) {
            raw.tree_bytes[g.gpu] += *row.used_bytes;
          } else {
            raw.tree_rows_without_bytes = true;
          }
          if (row.sm_util_pct) {
            p.tree_sm_util_pct = p.tree_sm_util_pct.value_or(0) + *row.sm_util_pct;
            if (*row.sm_util_pct > 0) gpu_active = true;
          }
        } else if (baseline_pids_.count(row.pid) == 0 && row.used_bytes) {
          raw.new_bytes[g.gpu] += *row.used_bytes;
        }
      }
    }
    // A GPU's utilisation is the workload's activity only on a GPU where its memory has been
    // seen (another job's busy GPU would hide a hang); on any GPU while none has been.
    for (const auto* bytes : {&raw.tree_bytes, &raw.new_bytes}) {
      for (const auto& [gpu, b] : *bytes) {
        if (b > 0) workload_gpus_.insert(gpu);
      }
    }
    for (unsigned gpu : busy) {
      if (workload_gpus_.empty() || workload_gpus_.count(gpu) != 0) gpu_active = true;
    }
    if (gpu_active) last_activity_ = Clock::now();
    // Keep every raw_stride_-th point; when full, drop every other one and double the stride, so
    // a long run keeps an even time line in bounded memory.
    if (raw_seen_++ % raw_stride_ == 0) raw_.push_back(std::move(raw));
    if (raw_.size() >= kMaxTimeline) {
      std::vector<RawPoint> thinned;
      for (std::size_t i = 0; i < raw_.size(); i += 2) thinned.push_back(std::move(raw_[i]));
      raw_ = std::move(thinned);
      raw_stride_ *= 2;
    }
  }
}

// The workload's live processes, found through /proc: the members of its process group and every
// descendant of its root, and with a child subreaper (Session sets it) every descendant of ours.
// A signal to the process group alone misses a child that called setsid() or setpgid(), and such
// a child outlived the timeout and the end of the run. We track descendants rather than sessions
// because the subreaper makes them complete: an orphan re-parents to us, not to init, so it stays
// in our tree after its parent ended. (A cgroup would hold them too, but needs privileges and a
// delegated hierarchy that a plain user on a GPU machine rarely has.) Zombies are left out: they
// are already dead and go when reaped. Our children's pids cannot be reused before we reap them;
// a grandchild's pid could be between the scan and the kill, a window of microseconds that every
// /proc-based tool accepts.
std::vector<int> Run::workload_pids() const {
  std::vector<int> roots;
  if (!child_->exit_info()) roots.push_back(child_->pid());  // once reaped, its pid may be reused
  const int self = static_cast<int>(getpid());
  if (o_.subreaper) roots.push_back(self);
  const std::vector<ProcStat> all = scan_processes();
  std::vector<int> pids = tree_pids(all, roots, child_->pgid());
  std::set<int> zombies;
  for (const auto& p : all) {
    if (p.state == 'Z') zombies.insert(p.pid);
  }
  std::erase_if(pids, [&](int pid) { return pid == self || zombies.count(pid) != 0; });
  return pids;
}

void Run::send(int sig) {
  log_info("sending {} to the workload's processes (process group {})", sigabbrev_np(sig),
           child_->pgid());
  child_->signal_group(sig);
  for (int pid : workload_pids()) kill(pid, sig);
  last_signal_ = Clock::now();
}

// Kills and reaps what is left of the workload once its root has ended: stragglers in its process
// group and descendants that left it. Bounded, for a process stuck in the kernel (a GPU context
// being torn down) that SIGKILL ends only when it returns.
void Run::kill_leftovers(const ChildProcess::LineSink& sink) {
  const auto deadline = Clock::now() + 5s;
  bool announced = false;
  for (;;) {
    const std::vector<int> pids = workload_pids();
    if (pids.empty()) break;
    if (!announced) {
      log_info("killing what is left of the workload ({} processes)", pids.size());
      announced = true;
    }
    child_->signal_group(SIGKILL);
    for (int pid : pids) kill(pid, SIGKILL);
    child_->pump(std::chrono::milliseconds(20), sink);
    if (o_.subreaper) child_->poll_exit(true);
    if (Clock::now() >= deadline) {
      log_warn("{} of the workload's processes outlived SIGKILL", workload_pids().size());
      break;
    }
  }
  const auto drain = Clock::now() + 1s;
  while (!child_->output_closed() && Clock::now() < drain) child_->pump(20ms, sink);
}

void Run::escalate(Clock::time_point now) {
  if (signal_plan_.empty() || now - last_signal_ < o_.kill_grace) return;
  const int sig = signal_plan_.front();
  signal_plan_.erase(signal_plan_.begin());
  send(sig);
}

void Run::loop() {
  auto last_poll = Clock::now() - o_.interval;
  auto line = [this](Stream s, std::string_view l) { on_line(s, l); };
  for (;;) {
    if (child_->pump(std::chrono::milliseconds(20), line)) last_activity_ = Clock::now();
    const auto now = Clock::now();
    if (now - last_poll >= o_.interval) {
      poll_tree();
      last_poll = now;
    }
    take_ticks();
    if (child_->poll_exit(o_.subreaper)) break;

    if (const int count = o_.interrupt != nullptr ? o_.interrupt->load() : 0;
        count > interrupts_seen_) {
      if (interrupts_seen_ == 0) {
        stop_ = Stop::interrupted;
        signal_plan_ = {SIGTERM, SIGKILL};
        send(SIGINT);
      }
      if (count >= 2) {
        // A second Ctrl-C (both may arrive between two polls): the user will not wait out the
        // grace period. The workload is killed at once; what was measured is kept.
        signal_plan_.clear();
        send(SIGKILL);
      }
      interrupts_seen_ = count;
    }
    if (stop_ == Stop::none && o_.timeout && now - start_ >= *o_.timeout) {
      stop_ = Stop::timeout;
      signal_plan_ = {SIGKILL};
      send(SIGTERM);
    }
    if (stop_ == Stop::none && o_.hang_after && now - last_activity_ >= *o_.hang_after) {
      stop_ = Stop::hang;
      signal_plan_ = {SIGKILL};
      send(SIGTERM);
    }
    escalate(now);
  }
  // The root is gone; what it printed last may still be in the pipes, and children that kept
  // them open are given a moment before they are killed.
  auto line_sink = [this](Stream s, std::string_view l) { on_line(s, l); };
  const auto drain_until = Clock::now() + kDrainAfterExit;
  while (!child_->output_closed() && Clock::now() < drain_until) {
    child_->pump(std::chrono::milliseconds(20), line_sink);
  }
  kill_leftovers(line_sink);
  child_->flush_partial(line_sink);
  if (o_.subreaper) child_->poll_exit(true);
}

void Run::finish() {
  r_.wall_s = seconds_between(start_, Clock::now());
  if (sampler_) {
    sampler_->stop();
    take_ticks();
  }
  if (child_) {
    r_.exit = child_->exit_info().value_or(ExitInfo{});
    r_.stdout_tail = child_->tail(Stream::out);
    r_.stderr_tail = child_->tail(Stream::err);
  }
  const std::int64_t warmup = protocol_warmup_.value_or(o_.warmup_steps);
  const auto batch = r_.steps.batch ? r_.steps.batch : o_.batch ? o_.batch : printed_batch_;
  if (steps_.empty() && rates_.empty()) use_printed();
  r_.steps = summarize_steps(steps_, rates_, warmup, o_.batch);
  if (!r_.steps.batch) r_.steps.batch = batch;
  if (r_.steps.throughput_source == "reported rate" && rates_from_regex_) {
    r_.steps.throughput_source = "regex";
  } else if (r_.steps.throughput_source == "reported rate" && !printed_format_.empty()) {
    r_.steps.throughput_source = "printed: " + printed_format_;
  }
  compute_gpu_figures();
  compute_host_figures();
  decide_outcome();
  diagnosis::RunFacts facts = facts_of(r_);
  // The hang threshold is the run's option, not part of its result.
  if (o_.hang_after) facts.hang_after_s = std::chrono::duration<double>(*o_.hang_after).count();
  r_.findings = diagnosis::diagnose_run(facts);
  for (auto& f : gpu_imbalance_findings(r_.gpu.per_gpu, r_.gpu.figures_window.has_value()))
    r_.findings.push_back(std::move(f));
}

void Run::compute_gpu_figures() {
  GpuFigures& g = r_.gpu;
  for (const auto& [index, b] : gpus_) {
    if (!g.gpu_name) g.gpu_name = b.info.name;
    if (!g.cc_major) g.cc_major = b.info.cc_major;
  }
  g.samples = raw_.size();
  g.prealloc_window_s = std::chrono::duration<double>(o_.prealloc_window).count();
  if (!g.telemetry) return;

  bool any_tree = false;
  bool any_new = false;
  bool rows_without_bytes = false;
  for (const auto& raw : raw_) {
    any_tree = any_tree || !raw.tree_bytes.empty();
    any_new = any_new || !raw.new_bytes.empty();
    rows_without_bytes = rows_without_bytes || raw.tree_rows_without_bytes;
  }
  g.attribution = any_tree        ? Attribution::process_tree
                  : o_.shared_gpu ? Attribution::none
                  : any_new       ? Attribution::new_processes
                                  : Attribution::device_wide;
  if (!any_tree && o_.shared_gpu) {
    g.telemetry_note = "NVML listed none of this workload's processes on the shared GPU";
  } else if (!any_tree && rows_without_bytes) {
    g.telemetry_note = "NVML lists the workload's processes without their memory";
  }
  const std::map<unsigned, std::uint64_t> nothing;
  auto bytes_of = [&](const RawPoint& raw) -> const std::map<unsigned, std::uint64_t>& {
    switch (g.attribution) {
      case Attribution::process_tree:
        return raw.tree_bytes;
      case Attribution::new_processes:
        return raw.new_bytes;
      case Attribution::device_wide:
        return raw.device_bytes;
      case Attribution::none:
        break;
    }
    return nothing;
  };
  // A device-wide rise below this is other noise (another process, the driver), not the workload.
  constexpr std::uint64_t kDeviceNoise = 256ull << 20;
  std::map<unsigned, std::uint64_t> per_gpu_peak;
  std::map<unsigned, std::uint64_t> per_gpu_early;  // within prealloc_window of its first memory
  std::map<unsigned, std::uint64_t> per_gpu_used;   // the device's, every process's
  std::optional<double> first_memory_s;
  for (auto& raw : raw_) {
    std::uint64_t sum = 0;
    for (const auto& [gpu, bytes] : bytes_of(raw)) {
      sum += bytes;
      per_gpu_peak[gpu] = std::max(per_gpu_peak[gpu], bytes);
    }
    raw.point.workload_gpu_bytes = sum;
    const bool holds = g.attribution == Attribution::device_wide ? sum > kDeviceNoise : sum > 0;
    if (holds && !first_memory_s) first_memory_s = raw.point.t_s;
    if (!g.peak_bytes || sum > *g.peak_bytes) g.peak_bytes = sum;
    for (const auto& [gpu, reading] : raw.point.gpus) {
      if (reading.used_bytes) per_gpu_used[gpu] = std::max(per_gpu_used[gpu], *reading.used_bytes);
    }
    if (holds && *first_memory_s + std::chrono::duration<double>(o_.prealloc_window).count() >=
                     raw.point.t_s) {
      for (const auto& [gpu, bytes] : bytes_of(raw)) {
        per_gpu_early[gpu] = std::max(per_gpu_early[gpu], bytes);
      }
    }
  }
  for (const auto& [gpu, peak] : per_gpu_peak) {
    if (g.attribution != Attribution::device_wide ? peak > 0 : peak > kDeviceNoise) {
      g.gpus_used.push_back(gpu);
    }
  }
  // The fullest GPU (the workload's peak over the GPU's memory) decides the device-relative
  // figures: a near OOM or a preallocation happens on one GPU, and on GPUs of different sizes the
  // one holding the most bytes need not be the fullest.
  const auto fullness = [&](unsigned gpu) {
    const std::uint64_t total = gpus_[gpu].info.memory_total_bytes.value_or(0);
    return total > 0 ? static_cast<double>(per_gpu_peak[gpu]) / static_cast<double>(total)
                     : static_cast<double>(per_gpu_peak[gpu]);
  };
  std::optional<unsigned> fullest;
  for (unsigned gpu : g.gpus_used) {
    if (!fullest || fullness(gpu) > fullness(*fullest)) fullest = gpu;
  }
  const bool used_one = fullest.has_value();
  // With no memory of its seen, the one GPU there is still the one it ran on.
  if (!fullest && gpus_.size() == 1) fullest = gpus_.begin()->first;
  if (fullest) {
    const GpuBaseline& b = gpus_[*fullest];
    g.device_total_bytes = b.info.memory_total_bytes;
    g.power_limit_w = b.info.power_limit_w;
    g.device_used_before_bytes = b.used_before;
    if (auto it = per_gpu_used.find(*fullest); it != per_gpu_used.end()) {
      g.device_peak_used_bytes = it->second;
    }
  }
  if (used_one) {
    const GpuBaseline& b = gpus_[*fullest];
    g.fullest_gpu = *fullest;
    g.gpu_name = b.info.name;
    g.cc_major = b.info.cc_major;
    g.busiest_gpu_peak_bytes = per_gpu_peak[*fullest];
    if (auto it = per_gpu_early.find(*fullest); it != per_gpu_early.end()) {
      g.early_peak_bytes = it->second;
    }
  }

  // Utilisation and clocks over the measured steps when the workload reported steps, widened to
  // the nearest samples when the steps were shorter than a few sampling periods (start-up,
  // autotuning and compilation would otherwise dominate the median); else while the workload held
  // GPU memory, or over the whole run when it never did; on the GPUs it used.
  std::vector<double> util;
  std::vector<double> sm;
  std::vector<double> power;
  std::map<unsigned, std::vector<double>> util_of;
  std::map<unsigned, std::vector<double>> power_of;
  // Per GPU: its samples with clock events read, with a power cap or brake, with a thermal
  // slowdown.
  struct Throttling {
    std::size_t counted = 0;
    std::size_t power = 0;
    std::size_t thermal = 0;
  };
  std::map<unsigned, Throttling> throttling;
  const std::set<unsigned> used(g.gpus_used.begin(), g.gpus_used.end());
  std::vector<double> times;
  times.reserve(raw_.size());
  for (const auto& raw : raw_) times.push_back(raw.point.t_s);
  g.figures_window = steps_window(r_.steps, times);
  if (g.figures_window) {
    r_.window_source = "steps";
  } else {
    // No steps: the steady phase in the utilisation of the GPUs it used, before the line that
    // reported its throughput.
    std::vector<PhaseSample> series;
    for (const auto& raw : raw_) {
      PhaseSample s{raw.point.t_s, std::nullopt, raw.point.host_cpu_pct};
      double sum = 0;
      std::size_t n = 0;
      for (const auto& [gpu, reading] : raw.point.gpus) {
        if (reading.util_pct && (used.empty() || used.count(gpu) != 0)) {
          sum += *reading.util_pct;
          ++n;
        }
      }
      if (n > 0) s.gpu_util_pct = sum / static_cast<double>(n);
      series.push_back(s);
    }
    r_.phases = find_phases(series, last_rate_s_);
    if (r_.phases.steady) {
      g.figures_window = r_.phases.steady;
      r_.window_source = "steady phase";
    }
  }
  for (const auto& raw : raw_) {
    const bool active = g.figures_window
                            ? g.figures_window->holds(raw.point.t_s)
                            : (!first_memory_s || (raw.point.workload_gpu_bytes.value_or(0) > 0 &&
                                                   raw.point.t_s >= *first_memory_s));
    if (!active) continue;
    for (const auto& [gpu, reading] : raw.point.gpus) {
      if (!used.empty() && used.count(gpu) == 0) continue;
      if (reading.util_pct) {
        util.push_back(*reading.util_pct);
        util_of[gpu].push_back(*reading.util_pct);
      }
      if (reading.power_w) {
        power.push_back(*reading.power_w);
        power_of[gpu].push_back(*reading.power_w);
      }
      if (reading.temperature_c) {
        g.temperature_max_c = std::max(g.temperature_max_c.value_or(0), *reading.temperature_c);
      }
      if (!reading.clock_event_reasons) continue;
      const std::uint64_t events = *reading.clock_event_reasons;
      Throttling& t = throttling[gpu];
      ++t.counted;
      g.clock_events_seen |= events;
      if ((events & (nvml::kClockEventSwPowerCap | nvml::kClockEventHwPowerBrakeSlowdown)) != 0) {
        ++t.power;
      }
      if ((events & (nvml::kClockEventSwThermalSlowdown | nvml::kClockEventHwThermalSlowdown)) !=
          0) {
        ++t.thermal;
      }
    }
    if (raw.point.tree_sm_util_pct) sm.push_back(*raw.point.tree_sm_util_pct);
  }
  g.util_median_pct = median(util);
  for (unsigned gpu : g.gpus_used) {
    PerGpuFigures p;
    p.index = gpu;
    if (auto it = gpus_.find(gpu); it != gpus_.end()) {
      p.name = it->second.info.name;
      p.total_bytes = it->second.info.memory_total_bytes;
    }
    p.peak_bytes = per_gpu_peak[gpu];
    p.util_median_pct = median(util_of[gpu]);
    p.power_median_w = median(power_of[gpu]);
    g.per_gpu.push_back(std::move(p));
  }
  g.tree_sm_util_median_pct = median(sm);
  g.power_median_w = median(power);
  // Each GPU judged alone, the worst one kept: one of eight held back is news, pooled it is not.
  for (const auto& [gpu, t] : throttling) {
    const auto keep_worst = [&, gpu = gpu](diagnosis::ThrottleShare& worst, std::size_t hits) {
      const double share = static_cast<double>(hits) / static_cast<double>(t.counted);
      if (worst.samples == 0 || share > worst.share) {
        worst = {share, t.counted, std::nullopt};
        if (throttling.size() > 1) worst.gpu = gpu;
      }
    };
    keep_worst(g.power_throttle, t.power);
    keep_worst(g.thermal_throttle, t.thermal);
  }
  r_.timeline.reserve(raw_.size());
  for (const auto& raw : raw_) r_.timeline.push_back(raw.point);
}

void Run::compute_host_figures() {
  HostFigures& h = r_.host;
  h.cores = static_cast<unsigned>(usable_cores());
  // The medians over the measured steps, as the GPU's utilisation is taken (a framework that
  // compiles or autotunes at full CPU for a minute would otherwise look host-bound during steps
  // that leave the CPU idle); peaks over the whole run.
  std::vector<double> times;
  for (const auto& reading : host_readings_) {
    if (reading.cpu_pct) times.push_back(host_point(reading.timestamp_ns, reading).t_s);
  }
  std::optional<TimeWindow> window = steps_window(r_.steps, times);
  if (!window && r_.gpu.telemetry) {
    window = r_.gpu.figures_window;  // the steady phase, where the GPU showed one
  } else if (!window) {
    // Without GPU telemetry the steady phase is looked for in the workload's CPU.
    std::vector<PhaseSample> series;
    for (const auto& reading : host_readings_) {
      series.push_back(
          {host_point(reading.timestamp_ns, reading).t_s, std::nullopt, reading.cpu_pct});
    }
    r_.phases = find_phases(series, last_rate_s_);
    window = r_.phases.steady;
    if (window) {
      r_.window_source = "steady phase";
      r_.gpu.figures_window = window;
    }
  } else {
    r_.window_source = "steps";
  }
  std::vector<double> cpu;
  std::vector<double> busiest;
  for (const auto& reading : host_readings_) {
    if (reading.cpu_pct) {
      h.cpu_max_pct = std::max(h.cpu_max_pct.value_or(0), *reading.cpu_pct);
    }
    h.rss_peak_bytes = std::max(h.rss_peak_bytes, reading.rss_bytes);
    h.max_processes = std::max(h.max_processes, reading.pids.size());
    if (window && !window->holds(host_point(reading.timestamp_ns, reading).t_s)) continue;
    if (reading.cpu_pct) cpu.push_back(*reading.cpu_pct);
    if (reading.busiest_cpu_pct) busiest.push_back(*reading.busiest_cpu_pct);
  }
  h.cpu_median_pct = median(cpu);
  h.busiest_process_median_pct = median(busiest);
  if (r_.timeline.empty()) {
    // Without GPU telemetry the time line is the host's.
    for (const auto& reading : host_readings_) {
      r_.timeline.push_back(host_point(reading.timestamp_ns, reading));
    }
    if (r_.timeline.size() > kMaxTimeline) {
      std::vector<TelemetryPoint> thinned;
      const std::size_t stride = r_.timeline.size() / kMaxTimeline + 1;
      for (std::size_t i = 0; i < r_.timeline.size(); i += stride) {
        thinned.push_back(r_.timeline[i]);
      }
      r_.timeline = std::move(thinned);
    }
  }
}

void Run::decide_outcome() {
  if (!child_) {
    r_.outcome = Outcome::launch_error;
    return;
  }
  const ExitInfo& e = r_.exit;
  const bool failed = e.signal.has_value() || e.exit_code.value_or(0) != 0;
  if (stop_ == Stop::interrupted) {
    r_.outcome = Outcome::interrupted;
  } else if (stop_ == Stop::timeout) {
    r_.outcome = Outcome::timeout;
  } else if (stop_ == Stop::hang) {
    r_.outcome = Outcome::hang;
  } else if (r_.oom && failed) {
    r_.outcome = Outcome::oom;
  } else if (e.signal) {
    r_.outcome = Outcome::crashed;
  } else if (failed) {
    r_.outcome = Outcome::failed;
  } else {
    r_.outcome = Outcome::ok;
  }
}

}  // namespace

diagnosis::RunFacts facts_of(const RunResult& r) {
  diagnosis::RunFacts f;
  f.oom = r.outcome == Outcome::oom;
  if (f.oom && r.oom) {
    f.oom_framework = std::string(framework_name(r.oom->framework));
    f.oom_line = r.oom->line;
  }
  f.failed = r.outcome == Outcome::crashed || r.outcome == Outcome::failed;
  f.exit_code = r.exit.exit_code;
  f.signal = r.exit.signal;
  f.hang = r.outcome == Outcome::hang;
  f.timeout = r.outcome == Outcome::timeout;
  f.data_wait_share = r.steps.data_wait_share;
  // Medians over the whole run describe start-up as much as the work: no finding is drawn from
  // them, and the run says why.
  if (r.window_source != "none") {
    f.gpu_util_median_pct = r.gpu.util_median_pct;
    f.host_cpu_median_pct = r.host.cpu_median_pct;
    f.busiest_process_cpu_pct = r.host.busiest_process_median_pct;
  } else if (r.gpu.telemetry) {
    f.no_steady_phase = r.phases.why_none.empty() ? "no samples" : r.phases.why_none;
  }
  f.host_cores = r.host.cores;
  f.peak_gpu_bytes = r.gpu.busiest_gpu_peak_bytes;
  f.early_gpu_bytes = r.gpu.early_peak_bytes;
  f.prealloc_window_s = r.gpu.prealloc_window_s;
  f.device_total_bytes = r.gpu.device_total_bytes;
  f.framework_peak_bytes = r.framework.peak_bytes;
  f.attribution_device_wide =
      r.gpu.attribution == Attribution::device_wide && r.gpu.peak_bytes.value_or(0) > 0;
  f.no_gpu_telemetry = !r.gpu.telemetry && r.outcome != Outcome::launch_error;
  f.precision = r.framework.precision;
  f.channels_last = r.framework.channels_last;
  f.cc_major = r.gpu.cc_major;
  f.power_throttle = r.gpu.power_throttle;
  f.thermal_throttle = r.gpu.thermal_throttle;
  return f;
}

Result<RunResult> run_workload(const RunOptions& options) {
  if (options.argv.empty()) return invalid_argument("no command to run");
  if (options.warmup_steps < 0) return invalid_argument("--warmup-steps: must be >= 0");
  if (options.interval < monitor::kMinInterval) {
    return invalid_argument("--interval: below the minimum of 10ms");
  }
  RunResult result;
  result.argv = options.argv;
  result.stdout_log = options.stdout_log;
  result.stderr_log = options.stderr_log;
  Run run(options, result);
  run.setup_telemetry();
  if (Status s = run.launch(); !s) {
    result.outcome = Outcome::launch_error;
    result.launch_error = s.message();
    run.finish();
    return result;
  }
  run.loop();
  run.finish();
  return result;
}

}  // namespace dlprobe::run
