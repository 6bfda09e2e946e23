// A bench sweep: every combination of the list-valued settings (models, precisions, modes,
// layouts, batches), each configuration from a clean state on one engine per device, with GPU
// telemetry over its timed windows. An out-of-memory configuration is recorded with the allocator's
// report and the sweep goes on; `auto` batches walk upward until the first out-of-memory; an
// interrupt ends the configuration being timed, keeps what it measured, and stops.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/allocator/gpu_memory_option.h"
#include "dlprobe/bench/results.h"
#include "dlprobe/bench/runner.h"
#include "dlprobe/bench/telemetry.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"
#include "dlprobe/diagnosis/diagnosis.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/results/results.h"

namespace dlprobe::bench {

// Everything of a configuration but the batch, and the batches to run it at.
struct SweepGroup {
  // step.batch is ignored; so are step.streams and step.stream_lag where left open.
  engine::StepConfig step;
  // Left open by `auto`, settled at each batch from the fastest settings' two values:
  //   streams_open: StepConfig::streams 2 at batches up to two_streams_up_to; above, 2 where
  //     stream_lag_above is set, else 1;
  //   stream_lag_open: on two streams, StepConfig::stream_lag 0 (no bound) at batches up to
  //     two_streams_up_to and stream_lag_above above.
  bool streams_open = false;
  bool stream_lag_open = false;
  std::int64_t two_streams_up_to = 0;
  std::int64_t stream_lag_above = 0;

  // The step of the configuration at `batch`, its stream choices settled.
  engine::StepConfig step_at(std::int64_t batch) const {
    engine::StepConfig s = step;
    s.batch = batch;
    const bool above = batch > two_streams_up_to;
    if (streams_open) s.streams = !above || stream_lag_above > 0 ? 2 : 1;
    if (stream_lag_open) s.stream_lag = above ? stream_lag_above : 0;
    // A lag given bounds a second stream wherever one runs; one stream has none to bound.
    if (s.streams < 2) s.stream_lag = 0;
    return s;
  }
  std::vector<std::int64_t> batches;  // in order; ignored when auto_batch
  bool auto_batch = false;
};

// `--batch auto`: start, 2 start, 4 start, ... up to limit, stopping after the first that runs out
// of memory.
struct AutoBatch {
  std::int64_t start = 16;
  std::int64_t limit = 4096;
};
// The batches an auto walk tries, in order.
std::vector<std::int64_t> auto_batches(const AutoBatch& a);

// The list-valued settings; every combination is a configuration. A choice left open takes, per
// configuration, the fastest the engine knows for the device, precision and mode
// (device::fastest_settings).
struct SweepAxes {
  std::vector<model::Arch> models;
  std::vector<engine::Precision> precisions;
  std::vector<engine::StepMode> modes;
  std::vector<Layout> layouts;  // empty: each precision's fastest
  std::vector<std::int64_t> batches;
  bool auto_batch = false;
  // How the engine takes memory; nullopt: the planned arena where it is the fastest (one choice
  // for the sweep, whose engine and allocator serve every configuration), else growth.
  std::optional<memory::GpuMemoryOption> memory;
  // Replay each step as a graph; nullopt: wherever the mode allows one and the arena is planned.
  std::optional<bool> graph;
  // StepConfig::streams; nullopt: the fastest where the arena is planned, else 1.
  std::optional<int> streams;
  // StepConfig::stream_lag wherever two streams run; nullopt: the fastest at each batch.
  std::optional<std::int64_t> stream_lag;
  engine::StepConfig base;  // image size, classes, optimizer, seeds
};

// The configurations of a sweep, and how its engine takes memory.
struct Expanded {
  // Models outermost, then precisions, modes, layouts; batches innermost (so that an auto walk and
  // a throughput-vs-batch curve are contiguous).
  std::vector<SweepGroup> groups;
  memory::AllocatorOptions allocation;
  std::string gpu_memory;  // as given, or what was picked ("planned", "grow")
  // What the open choices became, e.g. "layout nhwc, gpu-memory planned, graph on", or "layout
  // nchw for fp32 and nhwc for fp16" where they differ; empty when every choice was given.
  std::string picked;
};
// A graph asked for over memory that is not planned, or to train with AdamW, is an error (the
// step replays fixed addresses, and the values its calls were recorded with, where AdamW's bias
// correction changes every step); so are two streams over memory that is not planned.
Result<Expanded> expand(const SweepAxes& axes, DeviceKind device);

struct Sweep {
  std::vector<SweepGroup> groups;
  AutoBatch auto_batch;
  device::Device device;
  device::BackendKind backend = device::BackendKind::reference;
  device::ConvOptions conv;
  Protocol protocol;
  // Runs of each configuration (bench --repeat). One runs on the sweep's engine; more each run
  // from scratch on an engine of their own (its allocator, streams and handles new; the tuning
  // cache, which names the algorithms, is shared), and the results carry their spread.
  int runs = 1;
  std::string weights;
  std::int64_t profile_steps = 0;
  memory::AllocatorOptions allocation;  // the engine's allocator mode (growth unless limited)
  std::string gpu_memory;               // --gpu-memory as given, for the results ("" is grow)
  // Each configuration also trains from these JPEGs, recorded as a configuration of its own
  // (input jpeg-gpu or jpeg-cpu) right after the synthetic one, with an input finding.
  std::optional<JpegInput> data;
};

// Configurations the sweep runs: exact without auto groups; with them, their longest walks.
std::size_t planned_configurations(const Sweep& sweep);

struct SweepProgress {
  std::size_t index = 0;  // 1-based configuration number
  std::size_t planned = 0;
  std::string label;  // results::describe of the configuration
  Progress step;
  double elapsed_s = 0;         // since the sweep started
  std::optional<double> eta_s;  // from the configurations done so far
};

struct SweepCallbacks {
  std::function<void(const SweepProgress&)> progress;
  // After every configuration, with the ones so far (the last is new) and how many the sweep now
  // plans (an auto walk that ended plans no more): write the results files. A failure stops the
  // sweep.
  std::function<Status(const std::vector<results::Configuration>&, std::size_t planned)> done;
};

struct SweepOutcome {
  std::vector<results::Configuration> configurations;
  // Parallel to configurations: each configuration's runs (bench --repeat), those that finished
  // timing; empty for errors before timing.
  std::vector<std::vector<BenchResult>> runs;
  // Findings over each group of configurations that differ only in batch (diagnosis's batch sweep
  // rules: throughput still rising, falling, out of memory...).
  std::vector<diagnosis::Finding> findings;
  bool interrupted = false;
  // Configurations that did not finish, leaving out the out-of-memory that ends an auto walk (the
  // walk's purpose is to find it).
  std::size_t incomplete = 0;
  Status status;  // a failure that stopped the sweep (engine creation, writing results)
};

struct SweepEnvironment {
  const TelemetrySource* telemetry = nullptr;  // null: no GPU telemetry
  std::map<engine::Precision, Ceiling> ceilings;
  const std::atomic<int>* interrupt = nullptr;
};

SweepOutcome run_sweep(const Sweep& sweep, const SweepEnvironment& environment,
                       const SweepCallbacks& callbacks = {});

}  // namespace dlprobe::bench
