// `dlprobe run`: runs any workload as a child process and measures it from outside: its process
// tree's GPU memory (NVML, per pid) and host cost (/proc), the GPU's own telemetry, the throughput
// it reports (line protocol or a regex), and how it ended (exit, signal, out of memory, timeout,
// hang). Sweeps run one process per point; --max-batch searches the largest batch that runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/diagnosis/diagnosis.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/run/child_process.h"
#include "dlprobe/run/workload_output.h"

namespace dlprobe::run {

struct RunOptions {
  std::vector<std::string> argv;  // already templated; for --shell: {"/bin/sh", "-c", TEXT}
  std::map<std::string, std::string> env_set;
  bool echo = true;
  std::string stdout_log;  // files for the whole output (empty: none)
  std::string stderr_log;
  std::size_t tail_lines = 200;

  std::optional<std::chrono::nanoseconds> timeout;
  std::chrono::nanoseconds kill_grace = std::chrono::seconds(10);  // SIGTERM/SIGINT -> SIGKILL
  std::optional<std::chrono::nanoseconds> hang_after;  // no output and no GPU activity this long

  std::int64_t warmup_steps = 5;
  std::optional<std::int64_t> batch;  // items per step when the workload does not say
  std::optional<ThroughputRegex> throughput_regex;

  // GPU telemetry; null: the run goes on without it and says so.
  std::shared_ptr<nvml::Library> nvml;
  std::vector<unsigned> gpus;  // empty: every GPU
  std::chrono::nanoseconds interval = std::chrono::milliseconds(100);
  // The early peak (GpuFigures::early_peak_bytes, for the preallocation finding) is the largest
  // figure within this long of the workload's first GPU memory.
  std::chrono::nanoseconds prealloc_window = std::chrono::seconds(5);

  bool subreaper = false;  // the caller made itself a child subreaper (become_subreaper)
  // Other workloads started together share the GPU (--copies): GPU memory is attributed to the
  // workload's own processes only, never to new processes or the device's used memory, which
  // are the others' too.
  bool shared_gpu = false;
  // Set (e.g. by a SIGINT handler) to stop the workload: SIGINT to its group, then SIGTERM and
  // SIGKILL after kill_grace each. The results so far are kept.
  const std::atomic<int>* interrupt = nullptr;
};

enum class Outcome { ok, failed, oom, crashed, timeout, hang, interrupted, launch_error };
std::string_view outcome_name(Outcome o);

// A span of time in seconds since launch, ends included.
struct TimeWindow {
  double start_s = 0;
  double end_s = 0;
  bool holds(double t) const { return t >= start_s && t <= end_s; }
};

// The window widened by the same amount on both sides until it holds at least `k` of the sample
// times (all of them when there are fewer); unchanged when it holds k already.
TimeWindow widen_to_samples(TimeWindow window, const std::vector<double>& sample_times,
                            std::size_t k);

// ---- phases, when the workload prints no steps ----

// One telemetry sample as the phase detector reads it.
struct PhaseSample {
  double t_s = 0;                      // since launch
  std::optional<double> gpu_util_pct;  // the device's utilisation (on the GPUs it uses)
  std::optional<double> cpu_pct;       // the workload's CPU, percent of one core
};

// The detector's thresholds, named so the docs and tests refer to the same values.
inline constexpr double kSteadyActiveShare = 0.5;    // of the activity level
inline constexpr double kSteadyMinLevelPct = 5.0;    // below this the GPU (or CPU) is idle
inline constexpr std::size_t kSteadyMinSamples = 3;  // the fewest a steady window holds
inline constexpr std::size_t kSteadyMaxDip = 2;      // low samples tolerated inside a stretch

// Start-up, warm-up and the steady window, found from telemetry when the workload reports no
// steps. The series is the GPU's utilisation, or the workload's CPU where no sample has a GPU
// figure. Rule: the activity level is the highest median of three consecutive samples (so one
// spike does not set it); a sample is active at or above kSteadyActiveShare of that level; the
// steady window is the longest stretch of active samples (up to kSteadyMaxDip low samples in a
// row inside it do not end it) that ends at or before `end_bound_s` (the arrival of the line
// that reported the throughput, whose timed steps came before it), with at least
// kSteadyMinSamples samples. Start-up ends at the first sample above kSteadyMinLevelPct; warm-up
// is from there to the steady window.
struct Phases {
  std::string series;                   // "gpu_util", "cpu", or empty: no samples
  std::optional<double> level_pct;      // the activity level
  std::optional<double> startup_end_s;  // first activity
  std::optional<TimeWindow> steady;     // none: no steady phase seen
  std::string why_none;                 // when steady is none, why (one line)
};
Phases find_phases(const std::vector<PhaseSample>& samples, std::optional<double> end_bound_s);

// Throughput and step times after warm-up.
struct StepStats {
  std::int64_t steps_seen = 0;
  std::int64_t warmup_dropped = 0;
  std::int64_t steps_measured = 0;
  std::optional<double> items;        // summed batch over measured steps
  std::optional<double> elapsed_s;    // measured steps' time
  std::optional<double> items_per_s;  // headline: items / elapsed (or the reported rate)
  std::string throughput_source;      // "steps", "reported rate", "regex", "printed: FORMAT"
  std::optional<double> step_median_s;
  std::optional<double> step_p90_s;
  std::optional<double> step_mean_s;
  std::optional<double> step_min_s;
  std::optional<double> step_max_s;
  std::optional<double> data_wait_share;  // sum(data_time) / sum(step_time) over measured steps
  std::optional<std::int64_t> batch;      // last batch seen
  // When the measured steps ran, in seconds since launch (from their lines' arrival): the window
  // over which GPU utilisation and power describe the workload rather than its start-up.
  std::optional<double> measured_start_s;
  std::optional<double> measured_end_s;
  // The measured steps' times and items, where every one has both (for the results file).
  std::vector<double> step_seconds;
  std::vector<double> step_items;
};

// One step as the runner saw it.
struct StepRecord {
  std::optional<std::int64_t> step;
  std::optional<double> step_time_s;
  std::optional<double> data_time_s;
  std::optional<std::int64_t> batch;
  std::optional<bool> warmup;
  double arrival_s = 0;  // when its line arrived, from launch
};

// Warm-up is the steps marked `"warmup": true`, or else the first `warmup_steps` steps. Headline
// throughput: items of the measured steps over their time (the sum of step_time_s where every
// step has one, else the arrival time from the last warm-up step to the last step); with no steps
// at all, the median of the rates the workload reported.
StepStats summarize_steps(const std::vector<StepRecord>& steps, const std::vector<double>& rates,
                          std::int64_t warmup_steps, std::optional<std::int64_t> default_batch);

// Where the GPU memory figures come from.
enum class Attribution {
  none,           // no NVML, or no GPU memory seen
  process_tree,   // NVML listed pids of the workload's tree
  new_processes,  // pids outside the tree that appeared after launch (containers)
  device_wide,    // only the device's used memory minus what was used before launch
};
std::string_view attribution_name(Attribution a);

// One GPU's readings in one round of telemetry.
struct GpuReading {
  std::optional<double> util_pct;
  std::optional<double> mem_util_pct;
  std::optional<double> power_w;
  std::optional<double> temperature_c;
  std::optional<unsigned> sm_clock_mhz;
  std::optional<unsigned> mem_clock_mhz;
  std::optional<std::uint64_t> used_bytes;  // the device's, every process's
  std::optional<std::uint64_t> clock_event_reasons;
};

// One point of the run's time line (bounded: thinned when long): each GPU's readings, the
// workload's share of them, and its host cost.
struct TelemetryPoint {
  double t_s = 0;  // since launch
  std::optional<double> tree_sm_util_pct;
  std::optional<std::uint64_t> workload_gpu_bytes;  // per the attribution
  std::optional<double> host_cpu_pct;
  std::optional<double> busiest_process_cpu_pct;
  std::uint64_t rss_bytes = 0;
  std::size_t processes = 0;
  std::map<unsigned, GpuReading> gpus;  // by NVML index
};

// One GPU of a run on several: its share of the memory and the work.
struct PerGpuFigures {
  unsigned index = 0;  // NVML's
  std::optional<std::string> name;
  std::optional<std::uint64_t> peak_bytes;   // the workload's, per the attribution
  std::optional<std::uint64_t> total_bytes;  // the device's
  std::optional<double> util_median_pct;     // over GpuFigures::figures_window
  std::optional<double> power_median_w;
};

struct GpuFigures {
  bool telemetry = false;
  std::string telemetry_note;  // why there is none, or what was limited
  Attribution attribution = Attribution::none;
  std::optional<std::uint64_t> peak_bytes;  // workload, per attribution, summed over GPUs
  // The device-relative figures are the fullest GPU's (the workload's peak over its memory), as
  // a near-OOM or a preallocation happens on one GPU: its index, its peak, what the workload held
  // there within prealloc_window of its first memory, its total, what was in use before, and the
  // most its memory was used (every process's).
  std::optional<unsigned> fullest_gpu;
  std::optional<std::uint64_t> busiest_gpu_peak_bytes;
  std::optional<std::uint64_t> early_peak_bytes;
  double prealloc_window_s = 0;
  std::optional<std::uint64_t> device_total_bytes;
  std::optional<std::uint64_t> device_used_before_bytes;
  std::optional<std::uint64_t> device_peak_used_bytes;
  std::vector<unsigned> gpus_used;     // where the workload's memory was
  std::vector<PerGpuFigures> per_gpu;  // one per GPU in gpus_used
  std::optional<std::string> gpu_name;
  std::optional<int> cc_major;
  // The window the medians and shares below are taken over: the measured steps' (widen_to_samples),
  // else the steady phase found in the telemetry; none when neither (then: while it held memory).
  std::optional<TimeWindow> figures_window;
  std::optional<double> util_median_pct;  // device utilisation over figures_window
  std::optional<double> tree_sm_util_median_pct;
  std::optional<double> power_median_w;
  std::optional<double> power_limit_w;
  std::optional<double> temperature_max_c;
  std::uint64_t clock_events_seen = 0;  // OR of reasons over the run
  // Of one GPU's samples in the window, the GPU used whose share is largest: a power cap or brake,
  // a thermal slowdown.
  diagnosis::ThrottleShare power_throttle;
  diagnosis::ThrottleShare thermal_throttle;
  std::size_t samples = 0;
};

struct HostFigures {
  unsigned cores = 0;
  // Medians over the measured steps where the workload reported enough of them (as the GPU's
  // utilisation), else over the run; the maxima over the whole run.
  std::optional<double> cpu_median_pct;  // percent of one core, summed over the tree
  std::optional<double> cpu_max_pct;
  std::optional<double> busiest_process_median_pct;
  std::uint64_t rss_peak_bytes = 0;
  std::size_t max_processes = 0;
};

struct FrameworkFigures {
  std::optional<std::uint64_t> peak_bytes;  // the largest value reported
  std::optional<std::uint64_t> reserved_bytes;
  std::optional<std::uint64_t> allocated_bytes;
  std::optional<std::string> framework;
  std::optional<std::string> model;
  std::optional<std::string> precision;
  std::optional<bool> channels_last;
};

struct RunResult {
  std::map<std::string, std::string> params;  // the sweep point
  std::vector<std::string> argv;
  Outcome outcome = Outcome::launch_error;
  ExitInfo exit;
  std::string launch_error;
  double wall_s = 0;
  bool end_marker = false;
  std::optional<OomMatch> oom;
  std::optional<std::string> error_line;  // the last error-looking line
  StepStats steps;
  FrameworkFigures framework;
  GpuFigures gpu;
  HostFigures host;
  std::vector<TelemetryPoint> timeline;
  // The window the GPU and host medians and the findings describe: "steps" (the measured steps),
  // "steady phase" (found in the telemetry, `phases.steady`), or "none" (neither: the medians are
  // then over the run and no finding is drawn from them).
  std::string window_source = "none";
  Phases phases;  // found from telemetry when the workload reported no steps
  std::vector<diagnosis::Finding> findings;
  std::deque<std::string> stdout_tail;
  std::deque<std::string> stderr_tail;
  std::vector<std::string> protocol_errors;  // first few malformed dlprobe lines
  // First few problems with what it printed: a throughput of NaN or below zero, a per-step speed
  // without the batch.
  std::vector<std::string> warnings;
  std::string stdout_log;
  std::string stderr_log;
};

// Imbalance between the GPUs of one run. A GPU is idle below kIdleGpuUtilPct (median over the
// figures' window) while the median of the others is at least kBusyGpuUtilPct; one GPU's memory
// is far above the others when its peak exceeds kMemoryImbalanceRatio times the median of the
// others' peaks and by at least kMemoryImbalanceMinBytes.
inline constexpr double kIdleGpuUtilPct = 10.0;
inline constexpr double kBusyGpuUtilPct = 50.0;
inline constexpr double kMemoryImbalanceRatio = 1.5;
inline constexpr std::uint64_t kMemoryImbalanceMinBytes = 1ull << 30;
// `utilisation`: whether the utilisation medians describe the work (a window was found).
std::vector<diagnosis::Finding> gpu_imbalance_findings(const std::vector<PerGpuFigures>& gpus,
                                                       bool utilisation);

// Runs one workload to its end. Errors only for bad options; a workload that cannot start is a
// result with Outcome::launch_error.
Result<RunResult> run_workload(const RunOptions& options);

// The facts the diagnosis rules read, taken from a result.
diagnosis::RunFacts facts_of(const RunResult& result);

// ---- sweeps ----

struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};
// "batch=16,32,64"
Result<SweepAxis> parse_sweep(std::string_view text);
// Every combination, the first axis varying slowest.
std::vector<std::map<std::string, std::string>> sweep_points(const std::vector<SweepAxis>& axes);
// Replaces "{key}" for the keys of `params` in every argument; other braces stay as they are.
std::vector<std::string> substitute(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& params);
// Whether "{key}" occurs in any argument.
bool mentions(const std::vector<std::string>& argv, std::string_view key);
// "amp=bf16 batch=64": a point's keys and values, for progress lines and findings.
std::string point_label(const std::map<std::string, std::string>& point);

}  // namespace dlprobe::run

namespace dlprobe::run {

// A --max-batch search for one point of the other sweep axes.
struct MaxBatchOutcome {
  std::map<std::string, std::string> params;  // without the batch key
  std::optional<std::int64_t> largest_ok;
  std::optional<std::int64_t> smallest_failed;
  bool converged = false;
  int runs = 0;
  std::string note;  // why the search stopped early, when it did
};

// Everything one `dlprobe run` invocation measured.
struct RunReport {
  std::vector<std::string> command;  // as given, with {key} templates
  bool shell = false;
  std::string started_at;  // ISO 8601 UTC
  std::vector<RunResult> runs;
  std::vector<MaxBatchOutcome> max_batch;
  std::vector<diagnosis::Finding> sweep_findings;  // and the shared-GPU findings of --copies
  int copies = 1;  // run together on one GPU (the runs are the copies, params copy=N)
  bool interrupted = false;
};

// The report as JSON, schema "dlprobe.run/1" (docs/external.md describes every field).
std::string report_json(const RunReport& report);
// The human summary: one row per run (status, throughput, median step, peak GPU memory from NVML
// and from the framework, findings), then the findings in full.
std::string report_table(const RunReport& report);

}  // namespace dlprobe::run
