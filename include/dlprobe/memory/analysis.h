// Memory analysis of the native training step (`dlprobe memory`): where the device memory of one
// step goes, measured on a device and predicted without one.
//
// Following a step. follow_step() runs one step with an allocation hook on the caching allocator
// and places every allocation and free at the entry of the call list that made it. From that
// come the step's peak (its breakdown by category, the layer, call and phase where it happens),
// rounding waste and fragmentation at the peak, and a timeline with one point per visit of a
// layer (its forward calls, later its backward calls) at the highest moment of the visit. Under
// MemoryPlan::planned the allocator sees one arena; the plan says which of its buffers are live at
// each call, so the arena is split into activations, temporaries and its unused rest (category
// arena) at every point.
//
// Predicting. simulate_step() plans the same step on a backend that computes nothing, over the
// same allocator policy with fake addresses, and follows one step of it: the allocator's figures
// for any model, batch and precision, exactly as the device's allocator would see them, with no
// device. Two things are not in the plan and come from a measurement on a device (a Calibration):
// the workspace the backend takes (cuDNN/cuBLAS workspaces and kernel scratch: what it holds
// through the step, and what each call takes beyond that while it runs), and what the process
// holds outside the allocator (CUDA context, library handles, kernels loaded on first launch),
// which NVML sees.
// Without a calibration a prediction covers the allocator's own categories only and says so.
//
// Measuring. A Session holds one device (backend, allocator and, on a GPU, NVML) for many runs, so
// that one out-of-memory run leaves the process usable for the next: each measure() plans the
// step, warms it up, follows one step, reconciles the allocator with NVML's figure for this
// process, then frees the step and empties the cache.
//
// Max batch. search_largest() finds the largest batch that a monotone "fits" test accepts, from
// a first guess, and checks the next batch fails; predict_max_batch() runs it on simulations,
// and the command verifies the prediction with measure() runs under the allocator's limit mode.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/conv_tuning.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/step_plan.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::nvml {
class Library;
}

namespace dlprobe::memory {

enum class Phase : std::uint8_t { forward, backward, update };
std::string_view phase_name(Phase phase);

// The phase of every entry of a call list: forward up to the loss, backward from the loss
// gradient, update from the gradient unscale or optimizer call. An alloc entry belongs with the
// call after it, a free entry with the call before it.
std::vector<Phase> call_phases(std::span<const engine::Call> calls);

using CategoryBytes = std::array<std::int64_t, kCategoryCount>;

// The allocator's state at one moment of a step.
struct MemoryMoment {
  CategoryBytes by_category{};  // allocated bytes
  std::int64_t allocated_bytes = 0;
  std::int64_t requested_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t largest_free_block_bytes = 0;
  // Rounding and unsplit remainders: allocated - requested.
  std::int64_t waste_bytes() const { return allocated_bytes - requested_bytes; }
  // 1 - largest free block / cached free bytes (reserved - allocated); 0 with no free cache.
  double fragmentation() const;
  std::int64_t operator[](Category c) const { return by_category[static_cast<std::size_t>(c)]; }
};

// Consecutive calls of one layer in one phase, at their highest moment.
struct LayerVisit {
  std::string layer;
  Phase phase = Phase::forward;
  std::size_t first_call = 0;
  std::size_t last_call = 0;
  MemoryMoment high;
};

struct StepMemory {
  MemoryMoment peak;
  std::size_t peak_call = 0;  // the entry of calls() during which the peak happened
  std::string peak_call_name;
  std::string peak_layer;
  Phase peak_phase = Phase::forward;
  std::vector<LayerVisit> timeline;
  std::int64_t workspace_peak_bytes = 0;  // the most workspace allocated at one moment
  // Per entry of calls(): the most workspace allocated at one moment of the call.
  std::vector<std::int64_t> workspace_by_call;
  std::int64_t reserved_peak_bytes = 0;  // the most reserved at one moment
  std::int64_t events = 0;               // allocations and frees during the step
  std::optional<engine::ArenaLayout> arena;
};

// Runs one step (input set, warmed up) with a hook on `allocator`, which must be the step's. The
// allocator's peak statistics are reset first, so afterwards they are this step's.
Result<StepMemory> follow_step(engine::TrainingStep& step, CachingAllocator& allocator);

// ---- prediction ----

// What a device run measured that the plan cannot know, for predictions at other batches and on
// other machines.
struct Calibration {
  std::string device;  // "cuda:0 (NVIDIA H200)", "cpu (reference)"
  std::string model;
  std::string precision;
  std::int64_t batch = 0;
  // The most workspace allocated at one moment of the measured step.
  std::int64_t workspace_bytes = 0;
  // The workspace through the step: what was held at every call (the least at any call), and per
  // call what it took beyond that, as (call, bytes) for the calls that took any. Calls are counted
  // without the plan's alloc/free entries (which take no workspace), so a profile of the dynamic
  // plan fits the planned one; `calls` is how many there were. The model, precision, mode, layout
  // and optimizer fix the list; the batch does not change it.
  std::int64_t workspace_held_bytes = 0;
  std::vector<std::pair<std::size_t, std::int64_t>> workspace_by_call;
  std::size_t calls = 0;
  // Whether the measured backend fused batch norm with its ReLU (Backend::fuses_batch_norm_relu):
  // the call list, so the profile, depends on it. A file without the key reads as true.
  bool fused = true;
  // NVML's figure for the process less the allocator's reserved bytes, read together after the
  // step: CUDA context, library handles, lazily loaded kernels. None without NVML (and on a CPU).
  std::optional<std::int64_t> outside_allocator_bytes;
};

struct SimulationOptions {
  engine::StepConfig step;
  // The allocator as the device would run it; in limit mode overhead_bytes is what the process
  // holds outside the allocator.
  AllocatorOptions allocator;
  // Held through the step as one block, as a backend holds a persistent workspace.
  std::uint64_t workspace_bytes = 0;
  // The simulated device's memory (preallocate fractions are of it); 0: unbounded.
  std::uint64_t device_bytes = 0;
};

// Plans and follows one step on the dry backend over fake addresses (after one warm-up pass, as
// measure() follows a warmed-up step). With a calibration whose profile fits the plan's call
// list, each call also takes its measured workspace beyond what is held, while it runs, as the
// backend did; `workspace_model` (when given) says how the workspace went in. Out of memory under
// a limit is Errc::out_of_memory with the allocator's report.
Result<StepMemory> simulate_step(const SimulationOptions& options,
                                 const Calibration* calibration = nullptr,
                                 std::string* workspace_model = nullptr);

struct Prediction {
  StepMemory step;
  std::int64_t workspace_bytes = 0;  // included in `step`, from the calibration (0 without)
                                     // How the calibration's workspace went in: "per call" (its
                                     // profile fits this plan), "held" (its
  // peak held through the step, where its call list differs from this plan's), "none".
  std::string workspace_model = "none";
  bool calibrated = false;                              // a calibration was given
  std::optional<std::int64_t> outside_allocator_bytes;  // from the calibration
  // The allocator's reserved peak plus what the process holds outside it: what NVML would show.
  std::optional<std::int64_t> process_bytes() const;
};

// `calibration` may be null: then the prediction holds the allocator's own categories only. A
// calibration must be of the same model and precision (workspaces differ between precisions).
// `allocator` is the mode the device runs (a limit's overhead, when 0, is the calibration's
// outside-the-allocator bytes); `device_bytes` the device's memory, for preallocated fractions.
// Not fitting a limit or preallocation is Errc::out_of_memory.
Result<Prediction> predict(const engine::StepConfig& step, const Calibration* calibration,
                           const AllocatorOptions& allocator = {}, std::uint64_t device_bytes = 0);

// The largest batch in [1, upper] for which `fits` holds, starting from `guess` and assuming that
// fits is monotone (true up to some batch, false above): probes upward or downward from the guess
// by doubling steps, then bisects. Returns 0 when batch 1 does not fit. Only batches between the
// largest seen to fit and the smallest seen to fail are probed, so the answer was seen to fit and
// its next batch to fail (unless it is `upper`) even where fits is not monotone. Each probe is
// recorded in `probes` (batch, fitted) when given. An error from `fits` ends the search.
Result<std::int64_t> search_largest(std::int64_t guess, std::int64_t upper,
                                    const std::function<Result<bool>(std::int64_t)>& fits,
                                    std::vector<std::pair<std::int64_t, bool>>* probes = nullptr);

// The largest batch whose simulated step fits a process limit of `limit_bytes`: the allocator in
// limit mode with the calibration's outside-allocator bytes as overhead and its workspace held.
Result<std::int64_t> predict_max_batch(const engine::StepConfig& step, std::uint64_t limit_bytes,
                                       const Calibration* calibration,
                                       std::int64_t upper = 1 << 16);

// ---- measuring on a device ----

enum class BackendKind : std::uint8_t { reference, onednn, cuda };
struct Device {
  BackendKind backend = BackendKind::reference;
  int index = 0;  // cuda only
};
// "cpu" (the reference backend), "cpu:onednn" (builds with oneDNN), "cuda" or "cuda:N".
Result<Device> parse_device(std::string_view text, std::string_view flag = "--device");
std::string device_name(const Device& device);

struct SessionOptions {
  Device device;
  // growth, preallocate or limit. In limit mode overhead_bytes is measured by the session (on a
  // GPU: NVML's figure for the process less the allocator's reserved bytes) and kept current.
  AllocatorOptions allocator;
  // CUDA: how convolution engines are chosen (as `dlprobe bench`).
  ConvEngineChoice conv_algo = ConvEngineChoice::autotune;
  bool deterministic = true;
  std::shared_ptr<ConvTuningCache> tuning = nullptr;  // may be null
  // NVML for the reconciliation; the session opens it itself on a GPU when null. Tests pass the
  // fake NVML here.
  std::shared_ptr<nvml::Library> nvml;
};

// NVML's view of the process beside the allocator's, read together after a measured step.
struct Reconciliation {
  std::int64_t allocated_peak_bytes = 0;  // in the step, workspace included
  std::int64_t workspace_peak_bytes = 0;
  std::int64_t reserved_bytes = 0;  // when NVML was read
  // What the process held outside the allocator right after the backend was made: the CUDA
  // context and the cuDNN/cuBLAS handles.
  std::int64_t context_bytes = 0;
  std::int64_t nvml_process_bytes = 0;
  // "process": NVML's used memory of this pid; "device": the device's used memory less what it
  // used before this process made its context (NVML does not list this pid, e.g. in a container
  // with its own pid namespace).
  std::string nvml_source;
  // What CUDA and the libraries took since start-up (kernels loaded on first launch, library
  // buffers): NVML's figure less the reserved bytes and the context.
  std::int64_t lazy_bytes() const { return nvml_process_bytes - reserved_bytes - context_bytes; }
};

struct Measurement {
  engine::StepConfig step;
  StepMemory memory;
  MemoryStats stats;  // the allocator's over the followed step
  Calibration calibration;
  std::optional<Reconciliation> reconciliation;
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> open(const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Plans `step`, runs `warmup` steps, follows one more, reconciles. Out of memory (the
  // allocator's report; under a limit on a GPU also NVML seeing the process above the limit) is
  // Errc::out_of_memory, and the session stays usable: the step and the cache are freed whatever
  // happens.
  Result<Measurement> measure(const engine::StepConfig& step, int warmup = 1);

  std::string device_name() const;  // "cuda:0 (NVIDIA H200)", "cpu (reference)"
  CachingAllocator& allocator();

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The largest batch that completes a full training step under a process limit, predicted and
// then verified by measured runs.
struct MaxBatchTrial {
  std::int64_t batch = 0;
  bool fits = false;
  std::string why;  // the out-of-memory report when it did not fit
  std::optional<std::int64_t> peak_allocated_bytes;
  std::optional<std::int64_t> reserved_peak_bytes;
  std::optional<std::int64_t> nvml_process_bytes;
};
struct MaxBatchResult {
  std::uint64_t limit_bytes = 0;
  std::int64_t predicted = 0;         // from simulations; 0 when not even batch 1 fits
  std::int64_t found = 0;             // measured: `found` ran and found + 1 did not
  bool next_fails = false;            // false only when `found` is the search's upper bound
  std::vector<MaxBatchTrial> trials;  // in the order they ran
  std::optional<Measurement> at_found;
};

// `session` must run the allocator in limit mode with `limit_bytes`; `calibration` (from a run on
// the same session) feeds the prediction. Trials that run out of memory are results, not errors.
Result<MaxBatchResult> find_max_batch(Session& session, const engine::StepConfig& step,
                                      std::uint64_t limit_bytes, const Calibration* calibration,
                                      std::int64_t upper = 1 << 16, int warmup = 1);

// ---- JSON for the results file (memory.analysis; docs/results-schema.md) ----

nlohmann::json to_json(const StepMemory& memory);
nlohmann::json to_json(const Calibration& calibration);
nlohmann::json to_json(const Reconciliation& reconciliation);
nlohmann::json to_json(const Prediction& prediction);
nlohmann::json to_json(const MaxBatchResult& result);

// One configuration's memory.analysis object: every part may be absent (null).
struct AnalysisRecord {
  std::string gpu_memory;   // --gpu-memory as given
  std::string memory_plan;  // "dynamic" or "planned"
  const Measurement* measured = nullptr;
  const Prediction* predicted = nullptr;
  const Calibration* calibration = nullptr;  // the one the prediction used
  const MaxBatchResult* max_batch = nullptr;
};
nlohmann::json to_json(const AnalysisRecord& record);
// Reads a calibration back (from an earlier run's results file); errors name the JSON path.
Result<Calibration> calibration_from_json(const nlohmann::json& json, std::string_view path);

}  // namespace dlprobe::memory
