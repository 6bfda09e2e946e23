// Background sampling of NVML: a thread reads every chosen GPU once per interval, keeps the last N
// rounds in a ring (bounded memory) and hands each round to an optional sink as it is taken. Window
// queries and summaries (min / median / max per column, energy over the window) serve `monitor`
// and let a benchmark ask what the GPU did between two of its own timestamps.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "dlprobe/core/named.h"
#include "dlprobe/core/status.h"
#include "dlprobe/monitor/nvml.h"

namespace dlprobe::monitor {

inline constexpr std::chrono::nanoseconds kDefaultInterval = std::chrono::milliseconds(100);
// NVML refreshes most fields every few ms at best; sampling faster only measures the sampler.
inline constexpr std::chrono::nanoseconds kMinInterval = std::chrono::milliseconds(10);

struct ProcessRow {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_bytes;
  std::optional<unsigned> sm_util_pct;  // NVML's latest per-process sample for this pid
  std::optional<unsigned> mem_util_pct;
};

struct GpuReading {
  unsigned gpu = 0;
  nvml::DeviceSample sample;
  // Energy since the sampler started: the driver's energy counter where the GPU has one (with
  // power integrated over the time since its last reading, see energy_interval), else power
  // integrated over time (trapezoids between samples).
  std::optional<double> energy_since_start_j;
  bool energy_from_counter = false;   // whether this round read the counter and took it
  std::vector<ProcessRow> processes;  // only with SamplerOptions::processes
};

// One round over the chosen GPUs.
struct Tick {
  std::uint64_t index = 0;
  std::int64_t timestamp_ns = 0;  // steady clock when the round started
  std::vector<GpuReading> gpus;
};

struct SamplerOptions {
  std::chrono::nanoseconds interval = kDefaultInterval;
  std::vector<unsigned> gpus;  // empty: every GPU NVML sees
  bool processes = false;      // per-process memory and utilisation rows
  bool pcie_throughput = false;
  // How often to read the energy counter (0: every round). Reading it costs milliseconds (see
  // nvml::SampleOptions::energy_counter); between readings power fills the gap.
  std::chrono::nanoseconds energy_interval = std::chrono::seconds(1);
  std::size_t ring_capacity = 6000;  // rounds kept for window queries and summaries
  std::uint64_t max_ticks = 0;       // stop by itself after this many rounds; 0: until stop()
  // Called on the sampler thread after each round; keep it short, the next round waits for it.
  std::function<void(const Tick&)> sink;
};

// The numeric columns a summary covers, in display units.
enum class Column {
  gpu_util_pct,
  mem_util_pct,
  mem_used_mib,
  power_w,
  temperature_c,
  sm_clock_mhz,
  mem_clock_mhz,
  pcie_rx_kbps,
  pcie_tx_kbps,
};
inline constexpr Named<Column> kColumnNames[] = {
    {Column::gpu_util_pct, "gpu_util_pct"},   {Column::mem_util_pct, "mem_util_pct"},
    {Column::mem_used_mib, "mem_used_mib"},   {Column::power_w, "power_w"},
    {Column::temperature_c, "temperature_c"}, {Column::sm_clock_mhz, "sm_clock_mhz"},
    {Column::mem_clock_mhz, "mem_clock_mhz"}, {Column::pcie_rx_kbps, "pcie_rx_kbps"},
    {Column::pcie_tx_kbps, "pcie_tx_kbps"}};
inline constexpr auto kColumns = values_of(kColumnNames);
std::string_view column_name(Column column);
std::optional<double> column_value(const nvml::DeviceSample& sample, Column column);

struct ColumnStats {
  std::size_t count = 0;  // samples that had a value
  double min = 0;
  double median = 0;
  double max = 0;
};

enum class EnergySource { none, counter, power_integral };
std::string_view energy_source_name(EnergySource source);

struct GpuSummary {
  unsigned gpu = 0;
  std::size_t samples = 0;
  // Indexed like kColumns; empty where no sample had a value.
  std::array<std::optional<ColumnStats>, kColumns.size()> columns{};
  std::optional<double> energy_j;  // over the summarised window
  EnergySource energy_source = EnergySource::none;

  const std::optional<ColumnStats>& column(Column c) const {
    return columns[static_cast<std::size_t>(c)];
  }
};

struct Summary {
  std::size_t ticks = 0;
  std::int64_t first_ns = 0;  // timestamps of the first and last round summarised
  std::int64_t last_ns = 0;
  std::vector<GpuSummary> gpus;
};

// Statistics over `ticks` (in time order). Energy: the difference of energy_since_start_j between
// the first and last round where the rounds carry it (as the sampler's do); otherwise the energy
// counter's difference between the first and last reading, else the trapezoid integral of power.
Summary summarize(const std::vector<Tick>& ticks);

// What sampling itself costs, so a user can judge whether it disturbs the measurement.
struct Overhead {
  std::uint64_t ticks = 0;
  std::uint64_t missed_ticks = 0;        // intervals skipped because a round overran
  std::chrono::nanoseconds mean_tick{};  // wall time of one round of NVML calls
  std::chrono::nanoseconds max_tick{};
  std::chrono::nanoseconds thread_cpu{};  // CPU time of the sampler thread
  std::chrono::nanoseconds wall{};        // since start
};

class Sampler {
 public:
  // Validates the options (interval >= kMinInterval, GPUs exist) and starts the thread.
  static Result<std::unique_ptr<Sampler>> start(std::shared_ptr<nvml::Library> nvml,
                                                SamplerOptions options);
  ~Sampler();  // stops and joins
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  void stop();
  // True once sampling has ended (stop(), max_ticks reached, or an error); waits at most `timeout`.
  bool wait_for(std::chrono::nanoseconds timeout) const;
  // The error that ended sampling early, or ok.
  Status status() const;

  const std::vector<unsigned>& gpus() const;
  std::optional<Tick> latest() const;
  // Retained rounds with t0_ns <= timestamp_ns <= t1_ns.
  std::vector<Tick> window(std::int64_t t0_ns, std::int64_t t1_ns) const;
  Summary summary() const;  // over every retained round
  Summary summary(std::int64_t t0_ns, std::int64_t t1_ns) const;
  // Whether the ring has dropped rounds, i.e. summary() no longer covers the whole run.
  bool wrapped() const;
  Overhead overhead() const;

  struct State;

 private:
  explicit Sampler(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace dlprobe::monitor
