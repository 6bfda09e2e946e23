// What a planned step holds, shared by the step's sources: its buffers (long-lived ones own their
// memory, transient ones get theirs from `alloc` entries or the arena), the per-entry slots of the
// model's state, the call list and the counters the calls read when they run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/models/resnet.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::engine::step_impl {

struct Buffer {
  TensorView view;
  memory::Category category = memory::Category::temporaries;
  std::string owner;
  bool transient = false;
  bool gradient = false;         // TransientBuffer::gradient
  memory::DeviceBuffer storage;  // long-lived buffers only
};

// A planned call and the buffers it touches, from which the schedule takes lifetimes.
struct Draft {
  Call call;
  std::vector<Buffer*> uses;
  // A call on stream 1 (call.stream): the buffers of `uses` it writes; it only reads the others.
  std::vector<Buffer*> writes;
};

// A state entry's buffers. Parameters have a master copy, a gradient (train/grads) and optimizer
// state (train); under mixed precision conv and fc parameters also have a working copy.
struct StateSlot {
  Buffer* master = nullptr;
  Buffer* working = nullptr;
  Buffer* grad = nullptr;
  Buffer* state0 = nullptr;
  Buffer* state1 = nullptr;
  std::int64_t num_batches_tracked = 0;
};

// A buffer of `shape` in `layout` where it has one (rank 4), else plain.
Result<TensorDesc> make_desc(const Shape& s, DType dtype, Layout layout);

// Everything a planned step holds; TrainingStep::Impl is this under the header's private name.
struct StepState {
  StepState(const StepConfig& c, model::Model m, Backend& b, memory::CachingAllocator& a)
      : config(c), model(std::move(m)), backend(b), allocator(a) {}

  StepConfig config;
  model::Model model;
  Backend& backend;
  memory::CachingAllocator& allocator;

  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<StateSlot> state;  // parallel to model.state()
  std::vector<Call> calls;
  std::vector<TransientBuffer> transients;
  // MemoryPlan::planned: the block every transient buffer lives in, and its layout's figures.
  memory::DeviceBuffer arena;
  std::optional<ArenaLayout> arena_layout;
  std::size_t current_call = 0;
  // Per call: the backend's ticket for a stream-1 call's work this step (Backend::on_stream).
  std::vector<std::size_t> tickets;

  Buffer* images = nullptr;
  Buffer* labels = nullptr;
  Buffer* loss = nullptr;
  Buffer* found_inf = nullptr;  // fp16 training only
  // StepCounters (the loss scale, the optimizer's step count): fp16 or training only.
  Buffer* counters = nullptr;
  Buffer* logits = nullptr;  // what the loss reads (transient); kept_logits copies it
  Buffer* kept_logits = nullptr;

  // The counters as the last collected step left them (the device's are ahead while steps are
  // queued).
  double scale = 1.0;
  std::int64_t optimizer_steps = 0;
  bool input_set = false;
  bool pending = false;
  // StepConfig::graph: eager runs before the recording (the first one builds plans and measures
  // the workspace the recording shares), the recorded graph, and whether recording failed (then
  // every step runs eagerly).
  std::int64_t eager_runs = 0;
  std::optional<std::size_t> graph;
  bool graph_failed = false;

  bool training() const { return config.mode != StepMode::infer; }
  // fp16 scales the loss before backward in train and grads modes; only train unscales.
  bool scaling() const { return config.precision == Precision::fp16 && training(); }
  DType act() const { return activation_dtype(config.precision); }
  DType master() const { return master_dtype(config.precision); }

  // A buffer that lives as long as the step, its memory taken now.
  Result<Buffer*> persistent(const TensorDesc& desc, memory::Category category, std::string owner);
  // An activation or temporary: its memory comes from the schedule (an `alloc` entry or the
  // arena).
  Buffer* transient(const TensorDesc& desc, memory::Category category, std::string owner);

  Status allocate_state();
  Status upload_initial_state();
  // Queues the call list, with a timing mark before each call and after the last when `marks`
  // points at the first mark's index.
  Status enqueue(const std::size_t* marks);
  // Gives back the transient buffers a failed step left allocated.
  void release_transients();
  Status upload_to(Buffer& b, const HostTensor& value, std::string_view what);
  Result<HostTensor> download(const Buffer& b) const;

 private:
  // StepConfig::graph: records the step at its second run and replays it from then on. Whether
  // this step ran as a replay.
  Result<bool> replay_graph();
  // Call i, on its stream with the waits before it; or with `streams` false on stream 0.
  Status run_call(std::size_t i, bool streams);
  Buffer* add_buffer(const TensorDesc& desc, memory::Category category, std::string owner,
                     bool transient);
};

}  // namespace dlprobe::engine::step_impl

namespace dlprobe::engine {

struct TrainingStep::Impl : step_impl::StepState {
  using StepState::StepState;
};

}  // namespace dlprobe::engine
