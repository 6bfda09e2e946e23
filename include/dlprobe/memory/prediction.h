// Predicting a step's memory without a device.
//
// simulate_step() plans the step on a backend that computes nothing, over the same allocator
// policy with fake addresses, and follows one step of it: the allocator's figures for any model,
// batch and precision, exactly as the device's allocator would see them, with no device. Two
// things are not in the plan and come from a measurement on a device (a Calibration): the
// workspace the backend takes (cuDNN/cuBLAS workspaces and kernel scratch: what it holds through
// the step, and what each call takes beyond that while it runs), and what the process holds
// outside the allocator (CUDA context, library handles, kernels loaded on first launch), which
// NVML sees. Without a calibration a prediction covers the allocator's own categories only and
// says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/memory/step_memory.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::memory {

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
  // Whether it ran batch norm inside the convolutions (Backend::fuses_conv_batch_norm at the
  // measured precision and layout). A file without the key came from before that fusion: false.
  bool fused_conv = false;
  // Whether its max pool's backward recomputed its input (Backend::recomputes_max_pool_input), so
  // the step never stored it, as the CUDA and reference backends do. A file without the key came
  // from before that and reads as false.
  bool recomputed_pool = true;
  // Whether that pool's backward ran with its batch norm's in one call (the measured step held a
  // batch_norm_relu_max_pool_backward call: the reference backend in NHWC, the CUDA backend under
  // bench's --stem-backward fused). A file without the key reads as false.
  bool fused_pool_backward = false;
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
// Session::measure() follows a warmed-up step). With a calibration whose profile fits the plan's
// call list, each call also takes its measured workspace beyond what is held, while it runs, as
// the backend did; `workspace_model` (when given) says how the workspace went in. Out of memory
// under a limit is Errc::out_of_memory with the allocator's report.
Result<StepMemory> simulate_step(const SimulationOptions& options,
                                 const Calibration* calibration = nullptr,
                                 std::string* workspace_model = nullptr);

struct Prediction {
  StepMemory step;
  std::int64_t workspace_bytes = 0;  // included in `step`, from the calibration (0 without)
  // How the calibration's workspace went in: "per call" (its profile fits this plan), "held" (its
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

}  // namespace dlprobe::memory
