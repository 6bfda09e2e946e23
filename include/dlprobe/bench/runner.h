// `dlprobe bench`'s runner: one configuration of the native training step (model, batch,
// precision, mode, layout) planned on an engine, warmed up, and timed over one or more windows.
//
// Protocol (docs/bench.md):
//   warm-up   fixed: at least `warmup_steps` steps and at least `warmup_seconds` of them. Until
//             steady: at least `warmup_steps`, then on while stats::steady_state says the step
//             times still fall, for at most `warmup_seconds` and `warmup_max_steps`. Each step is
//             waited for, and its host time is the warm-up curve. The allocator's peak is reset
//             after it, so memory figures describe a steady training loop.
//   restart   until steady, a first window whose leading steps are unsettled (above
//             steady.slow_step times its median) goes to the warm-up curve and is timed again, at
//             most `max_restarts` times: the timed window does not start in the warm-up.
//   window    at least `min_steps` steps and at least `min_seconds` (host clock, which the device
//             cannot finish ahead of); `repeat` windows, each after a synchronisation.
//   step time a backend timing mark before each step is queued and one after the last, read once
//             the window has finished: CUDA events on the GPU (no host synchronisation per step),
//             the host clock on the CPU backends. Step k's time runs from its mark to the next, so
//             any wait between steps (the fp16 loss scaler's inf check, a host that cannot keep up)
//             counts against the step that waited.
// The headline throughput is images over the windows' total time (stats::summarize), never a mean
// of per-step rates.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/bench/input_feed.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/engine.h"
#include "dlprobe/memory/step_memory.h"
#include "dlprobe/results/results.h"
#include "dlprobe/stats/steady_state.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/step_plan.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::bench {

struct Protocol {
  std::int64_t warmup_steps = 5;
  double warmup_seconds = 1.0;
  std::int64_t min_steps = 30;
  double min_seconds = 2.0;
  int repeat = 1;
  // A window stops here even before min_seconds: tiny steps must not fill memory with marks.
  std::int64_t max_steps = 100'000;
  // Warm-up until steady (see above); false: the fixed warm-up the user asked for.
  bool until_steady = false;
  std::int64_t warmup_max_steps = 10'000;
  int max_restarts = 2;
  stats::SteadyRule steady;
};
// Every field in range, or a one-line error naming it.
Status check_protocol(const Protocol& protocol);

// What the runner is doing, for a progress line.
struct Progress {
  enum class Phase { planning, warmup, timing } phase = Phase::planning;
  int window = 0;             // timing: which window, from 0
  std::int64_t steps = 0;     // steps queued so far in this phase (or window)
  double host_seconds = 0.0;  // since the phase (or window) began
  double images_per_s = 0.0;  // timing: images queued / host seconds, a running estimate
};

// Called on the runner's thread; keep them short. Window edges come after the synchronisation that
// ends warm-up or the previous window, and after the one that ends the window, so that what they
// read (an energy counter) brackets exactly the timed steps.
struct Hooks {
  std::function<void(const Progress&)> progress;
  std::function<void(int window)> window_begin;
  std::function<void(int window)> window_end;
  // After window_end: the window started unsettled and is timed again (Protocol::max_restarts).
  std::function<void(int window)> window_discarded;
};

// The warm-up, apart from the engine: `step` runs one step to its end and returns its seconds.
struct Warmup {
  std::vector<double> step_seconds;  // the curve, one per step
  double seconds = 0;                // their sum
  bool steady = false;               // until steady: the test passed (false: a bound ended it)
  bool interrupted = false;
};
// Runs `protocol`'s warm-up (fixed or until steady); a step's error ends it as the error.
// `progress` (may be empty) hears the steps and seconds so far after each step.
Result<Warmup> warm_up(const Protocol& protocol, const std::function<Result<double>()>& step,
                       const std::atomic<int>* interrupt,
                       const std::function<void(std::int64_t, double)>& progress = {});

struct BenchOptions {
  engine::StepConfig step;
  Protocol protocol;
  std::string weights;  // a safetensors state dict to start from; empty: seeded initialisation
  std::uint64_t data_seed = 0;  // the synthetic batch
  // After the timed windows, this many more steps with a timing mark around every call; the
  // per-call times are the median over them.
  std::int64_t profile_steps = 0;
  // Set (by a signal handler) to stop: the window in progress ends after the step being queued and
  // what was timed so far is returned with `interrupted`.
  const std::atomic<int>* interrupt = nullptr;
  // Train on these JPEGs (a feed opened on the step once it is planned) instead of the synthetic
  // batch; null: the synthetic batch.
  const JpegInput* data = nullptr;
};

// What feeding the step from JPEGs cost, over the timed windows.
struct InputFacts {
  std::string input;    // "jpeg-gpu", "jpeg-cpu"
  std::string decoder;  // the feed's decoder
  int threads = 0;
  // Seconds the host spent getting batches ready (waiting for the loader, decoding on the GPU,
  // sending a host batch up through the staging on a CUDA device), over the timed steps: a step
  // waits for its input only where this is longer than the step before it.
  double fetch_seconds = 0;
  // Seconds spent handing the batches to the step once the step before had ended (a copy on the
  // device from the staging or the GPU decoder's buffer; on the CPU, set_input's copy): the
  // device waits through it.
  double upload_seconds = 0;
  std::int64_t batches = 0;
  std::vector<data::SkippedFile> skipped;
  // GPU decoding: CUDA_DEVICE_MAX_CONNECTIONS where the user's environment asks for fewer hardware
  // queues than decoding beside a step needs (dlprobe/data/cuda_queues.h).
  std::optional<int> cuda_queues;
};

struct Window {
  std::vector<double> step_seconds;
  std::int64_t host_begin_ns = 0;  // steady clock, around the window (for telemetry)
  std::int64_t host_end_ns = 0;
  // CPU seconds other processes on the host used during the window (host_cpu.h); nullopt where
  // /proc could not be read.
  std::optional<double> other_cpu_seconds;
};

struct BenchResult {
  double setup_seconds = 0.0;  // planning the step and uploading its state and input
  std::int64_t warmup_steps = 0;
  double warmup_seconds = 0.0;
  std::vector<double> warmup_step_seconds;  // the warm-up curve, restarted windows at its end
  bool until_steady = false;                // the protocol's warm-up mode
  bool warmup_steady = false;               // until steady: the test passed
  int restarts = 0;                         // windows that started unsettled, timed again
  std::vector<Window> windows;              // empty when interrupted before timing
  engine::StepResult last;                  // the last timed step's loss
  memory::MemoryStats memory;               // peaks over the timed windows
  // Planned steps: what the arena holds when most of it is live, by category (the allocator sees
  // the arena as one block, so `memory` cannot tell).
  std::optional<memory::ArenaMoment> arena_fullest;
  // Where a profiled step's time goes: parallel to the step's calls; empty unless profiled.
  std::vector<results::CallTime> profile;
  bool interrupted = false;
  // StepConfig::graph: the timed steps ran as graph replays (false: the capture failed, and the
  // step ran eagerly after a warning saying why).
  bool graph_replayed = false;
  // StepConfig::recompute_block_outputs as the step ran it: false where it had nothing to
  // recompute.
  bool recomputed_block_outputs = false;
  std::optional<InputFacts> input;  // with BenchOptions::data

  std::int64_t timed_steps() const;
  std::vector<double> step_seconds() const;  // every window's, in order
  double timed_seconds() const;
};

// Bad options, a precision the engine cannot run, a weights file that does not fit the model and
// running out of memory are errors (the last is Errc::out_of_memory with the allocator's report as
// its message; engine.allocator().stats() and last_oom() still tell where memory was). Each run
// starts from a clean allocator (cache emptied, peaks reset), so one engine serves a whole sweep.
Result<BenchResult> run_bench(device::Engine& engine, const BenchOptions& options,
                              const Hooks& hooks = {});

// Matrix-multiply FLOPs of one image through the model (2 per multiply-add of every convolution
// and of the fully connected layer; batch norm, ReLU, pooling and the optimizer are left out, as in
// the usual "ResNet-50 is 4.1 GMACs" count). Training and grads add the backward pass: the weight
// gradient of every layer and the input gradient of every layer but the first convolution, whose
// input (the images) needs none.
Result<double> flops_per_image(const model::ModelConfig& config, engine::StepMode mode);

}  // namespace dlprobe::bench
