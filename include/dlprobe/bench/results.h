// A measured bench configuration in the results schema (dlprobe.results/1): settings, statistics
// over the timed steps, raw step times per window, allocator memory, GPU telemetry over exactly the
// timed windows, achieved TFLOP/s against the measured GEMM ceiling, and the warnings the numbers
// call for. Pure functions of what was measured, so every rule is tested on known values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/bench/runner.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/device.h"
#include "dlprobe/monitor/sampler.h"
#include "dlprobe/results/results.h"

namespace dlprobe::bench {

// Thresholds of the warnings, named so docs/bench.md and the tests use the same values.
inline constexpr double kNoisyCv = 0.05;              // step-time CV above this
inline constexpr std::size_t kFewSteps = 10;          // fewer timed steps than this
inline constexpr double kSlowFirstStep = 1.10;        // first step this many times the median ...
inline constexpr double kWindowSpread = 0.02;         // (max - min) / median of window throughputs
inline constexpr double kCpuContention = 0.10;        // other processes' share of the CPU time
inline constexpr double kClockSpread = 0.05;          // (max - min) / median SM clock in the window
inline constexpr double kLowUtilPct = 70.0;           // median GPU utilisation below this
inline constexpr std::size_t kMinFirstStepSteps = 5;  // the first-step rule needs this many steps

// The GEMM ceiling doctor measured for the dtype a precision computes in.
struct Ceiling {
  std::string dtype;  // "bf16"
  double tflops = 0;
};

// The dtype of doctor's GEMM ceiling that a precision's matrix products run on: fp32 strict on the
// CUDA cores, tf32, fp16 and bf16 on tensor cores; none for fp64.
std::optional<std::string> ceiling_dtype(engine::Precision precision);

// Another process on the GPU during a configuration.
struct OtherProcess {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_bytes;
  std::optional<unsigned> max_sm_util_pct;  // the most NVML saw it use during the windows
};

// What the GPU did during each timed window: the sampler's rounds inside it and the energy
// counter read at its two edges (nullopt where the GPU has none).
struct WindowTelemetry {
  std::vector<monitor::Tick> ticks;
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  std::optional<double> counter_energy_j;
};

// One results::Telemetry over all windows of a configuration, for GPU `gpu` (NVML's index):
// ranges over every round in the windows, throttle reasons seen, a timeline from the first
// window's start, and the energy: the counter's differences summed where every window has one,
// else power integrated over each window's rounds. Nullopt without a single round.
std::optional<results::Telemetry> telemetry_over(const std::vector<WindowTelemetry>& windows,
                                                 unsigned gpu);

// Processes other than this one seen on `gpu` in the windows' rounds (with SamplerOptions::
// processes), by pid. None when NVML never listed `own_pid` (its pids are then another pid
// namespace's, as in a container, and this process cannot be told from the others).
std::vector<OtherProcess> other_processes(const std::vector<WindowTelemetry>& windows, unsigned gpu,
                                          unsigned own_pid);

struct Measured {
  engine::StepConfig step;
  device::Device device;
  device::BackendKind backend = device::BackendKind::reference;
  results::RunStatus status = results::RunStatus::ok;
  std::string error;  // why it did not finish; empty when ok
  // Each run from scratch, in order (bench --repeat); empty when nothing ran (an error before
  // timing).
  std::vector<const BenchResult*> runs;
  std::optional<memory::MemoryStats> memory;  // the allocator's, also after an out-of-memory
  std::optional<results::Telemetry> telemetry;
  std::optional<double> flops_per_item;
  std::optional<Ceiling> ceiling;
  std::vector<OtherProcess> others;
  std::string gpu_memory;  // --gpu-memory as given
  std::string input;       // the step's input setting ("" synthetic, "jpeg-gpu", "jpeg-cpu")
};

// The settings of a step as the results file records them.
results::Settings settings_of(const engine::StepConfig& step, const device::Device& device,
                              device::BackendKind backend);

// The configuration with its statistics (stats::summarize over every timed step of every run),
// samples, each run's warm-up, the spread between runs (two or more), memory, telemetry, compute
// figures and findings.
results::Configuration to_configuration(const Measured& measured);

// Training from JPEGs (`fed`, with the feed's facts) beside the same configuration on the synthetic
// batch: input_bound (a warning, with what binds and what to try) when it runs below 95 % of the
// synthetic throughput, else input_keeps_up (information), each with the numbers.
results::Finding input_finding(const results::Configuration& synthetic,
                               const results::Configuration& fed, const InputFacts& facts);

// The warnings a configuration's own numbers call for (ids: slow_first_step, warmup_not_steady,
// noisy_steps, few_steps, windows_disagree, cpu_contention, clock_events, clock_changed,
// other_process, low_gpu_util); each says what it saw and what to do, for the device it ran on.
std::vector<results::Finding> findings_of(const results::Configuration& configuration,
                                          const std::vector<OtherProcess>& others);

}  // namespace dlprobe::bench
