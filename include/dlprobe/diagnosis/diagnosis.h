// Findings about a workload run, shared by `bench`, `run` and `evaluate`: each rule reads facts
// measured during the run (never guesses) and, when it fires, says what it saw (the numbers), how
// bad it is and what to change. A rule whose facts are unknown stays silent.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/severity.h"

namespace dlprobe::diagnosis {

struct Finding {
  std::string id;  // stable, e.g. "input_bound"
  Severity severity = Severity::info;
  std::string title;                      // one line
  std::string evidence;                   // the numbers, in words
  std::string fix;                        // what to try
  std::map<std::string, double> numbers;  // the evidence, machine-readable
};

// Thresholds, named so the docs and tests refer to the same values.
inline constexpr double kDataWaitModerate = 0.05;
inline constexpr double kDataWaitHigh = 0.20;
inline constexpr double kLowGpuUtilPct = 70.0;
inline constexpr double kCpuSaturatedShare = 0.90;  // of the usable cores, or of one core
// Preallocation: this share of the device within the first seconds (JAX takes 75% by default,
// TensorFlow nearly all), unless the framework says it uses most of that itself: its own peak at
// or above kPreallocUsedShare of the early figure is a workload that needs the memory.
inline constexpr double kPreallocShare = 0.70;
inline constexpr double kPreallocUsedShare = 0.50;
inline constexpr double kNearOomShare = 0.90;
inline constexpr double kThrottleShare = 0.05;  // of samples
inline constexpr double kStillRising = 0.10;    // throughput gain at the largest batch
inline constexpr double kSmallBatchShare = 0.50;
inline constexpr double kFallingShare = 0.95;

// How often one GPU's clocks were held back: the share of its samples in the window, and that GPU
// where the run used several (each GPU is judged alone: one throttling GPU of eight is news).
struct ThrottleShare {
  double share = 0;
  std::size_t samples = 0;
  std::optional<unsigned> gpu;
};

struct RunFacts {
  // Outcome.
  bool oom = false;
  std::optional<std::string> oom_framework;
  std::optional<std::string> oom_line;
  // Ended badly: a non-zero exit status (finding `failed`) or a signal (`crashed`, with `signal`).
  bool failed = false;
  std::optional<int> exit_code;
  std::optional<int> signal;
  bool hang = false;
  bool timeout = false;
  std::optional<double> hang_after_s;
  // Input pipeline.
  std::optional<double> data_wait_share;  // of step time, from the workload's data_time_s
  // Over the measured steps or the steady phase; unknown where neither was seen.
  std::optional<double> gpu_util_median_pct;
  std::optional<double> host_cpu_median_pct;  // percent of one core, over the process tree
  std::optional<double> busiest_process_cpu_pct;
  unsigned host_cores = 0;
  // Why no window of steady work was seen, when none was (the utilisation rules then say so
  // instead of reading medians over start-up).
  std::optional<std::string> no_steady_phase;
  // Memory.
  std::optional<std::uint64_t> peak_gpu_bytes;   // the workload's, as NVML attributes it
  std::optional<std::uint64_t> early_gpu_bytes;  // within the first seconds of its GPU memory
  std::optional<double> prealloc_window_s;
  std::optional<std::uint64_t> device_total_bytes;
  std::optional<std::uint64_t> framework_peak_bytes;
  bool attribution_device_wide = false;  // memory is the whole device's, others included
  bool no_gpu_telemetry = false;
  // Precision and layout, where the workload said.
  std::optional<std::string> precision;
  std::optional<bool> channels_last;
  std::optional<int> cc_major;
  // Clocks.
  ThrottleShare power_throttle;
  ThrottleShare thermal_throttle;
};

std::vector<Finding> diagnose_run(const RunFacts& facts);

struct SweepPointFacts {
  std::int64_t batch = 0;
  bool ran = false;  // finished and measured
  bool oom = false;
  std::optional<double> items_per_s;
};

// Over the points of one batch sweep (any order; points that did not run are OOM or failures).
std::vector<Finding> diagnose_batch_sweep(const std::vector<SweepPointFacts>& points);

// One of several copies of a workload run together on one GPU.
struct SharedCopyFacts {
  int copy = 0;      // from 1
  bool ran = false;  // ended well
  bool oom = false;
  std::string outcome;  // "ok", "oom", "failed", …
  std::optional<double> items_per_s;
  std::optional<std::uint64_t> peak_gpu_bytes;   // its own processes' (NVML)
  std::optional<std::uint64_t> early_gpu_bytes;  // within the first seconds of its GPU memory
  std::optional<std::string> framework;          // as it said, or as its OOM message said
  // When its throughput was measured, in seconds since launch (the copies are launched together):
  // its measured steps, else the steady phase.
  std::optional<double> window_start_s;
  std::optional<double> window_end_s;
  // The GPU its memory was on (the fullest, where several) and that GPU's memory; unknown where
  // NVML did not attribute it.
  std::optional<unsigned> gpu;
  std::optional<std::uint64_t> device_total_bytes;
};

// Over the copies that ran together (device_total_bytes: the GPU's memory where a copy does not
// say its own): one summary (combined throughput of the copies that ran; each one's outcome,
// throughput and peak; the GPUs, where they were on several), and `shared_gpu_preallocation` when
// a copy took more than its share of its GPU (that GPU's total over the copies on it, a copy of
// unknown GPU counted on every GPU) within its first seconds, with the switch that turns that off
// for its framework; an error when another copy could not run, else a warning. Where the copies'
// measured windows did not overlap, the summary is a warning that says so: their sum is then not a
// rate the shared GPU gave.
std::vector<Finding> diagnose_shared_gpu(const std::vector<SharedCopyFacts>& copies,
                                         std::optional<std::uint64_t> device_total_bytes);

}  // namespace dlprobe::diagnosis
