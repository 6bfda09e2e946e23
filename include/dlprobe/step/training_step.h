// The planned training step: a model, a batch size and a precision turned, once and ahead of time,
// into a flat list of backend calls over buffers from the caching allocator. Running a step runs
// the list; nothing is decided per step on the host: what changes from step to step (fp16's loss
// scale, the optimizer's step count) lives in counters on the backend that the calls read and
// advance, so steps queue back to back and a recorded step replays as it ran.
//
// Buffers and their memory categories (every one carries its layer as owner label):
//   weights          fp32 master parameters, BN running statistics, and under mixed precision
//                    the fp16/bf16 working copies of conv and fc parameters, cast from the masters
//                    at each layer's forward as autocast does
//   gradients        one fp32 gradient per parameter
//   optimizer_state  SGD momentum buffers or AdamW's exp_avg / exp_avg_sq; the fp16 found_inf flag;
//                    the step counters (StepCounters: loss scale, step count)
//   input            images (fp32) and labels (int64), as a data loader hands them over
//   activations      forward values some layer saves for its backward pass
//   temporaries      forward values nobody saves, activation gradients, low-precision parameter
//                    gradients before their cast to fp32, the loss
//   workspace        whatever the backend asks for inside a call
// Weights, gradients, optimizer state and input live as long as the step; activations and
// temporaries are allocated by `alloc` entries of the call list just before their first use and
// released by `free` entries right after their last, so the allocator's peak follows the step as
// PyTorch's caching allocator sees it (MemoryPlan::planned puts them in one arena instead).
// docs/engine-step.md has the details.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/safetensors.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/models/resnet.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/step_plan.h"

namespace dlprobe::engine {

struct StepResult {
  double loss = 0.0;
  // fp16 only: the gradients held inf/NaN, so the optimizer step was skipped and the scale backed
  // off.
  bool skipped = false;
  double loss_scale = 1.0;  // the scale this step ran with (1 without scaling)
};

// Every label of `labels` (any length) within [0, classes), the first one outside named by its
// index: what a step checks of each batch, and `dlprobe step` of a whole input file.
Status check_label_range(const HostTensor& labels, std::int64_t classes);

class TrainingStep {
 public:
  // Plans the step and allocates everything that lives as long as it, initialised from
  // model::initial_state(config.seed). `backend` and `allocator` must outlive the step; the
  // allocator must hand out memory the backend can address.
  static Result<std::unique_ptr<TrainingStep>> create(const StepConfig& config, Backend& backend,
                                                      memory::CachingAllocator& allocator);
  ~TrainingStep();
  TrainingStep(const TrainingStep&) = delete;
  TrainingStep& operator=(const TrainingStep&) = delete;

  const StepConfig& config() const;
  const model::Model& model() const;
  const std::vector<Call>& calls() const;
  // Every activation and temporary, in order of first use.
  const std::vector<TransientBuffer>& transients() const;
  // Planned steps only.
  std::optional<ArenaLayout> arena() const;
  // The entry of calls() running now, or the last one run: an allocator hook reads it to place
  // each allocation in the step.
  std::size_t current_call() const;
  // StepConfig::graph only: whether the step has been recorded and now runs as a graph replay.
  // False until the second step, and for good after a capture that failed (the step then runs
  // eagerly and has said why in a warning).
  bool graph_recorded() const;

  // images: [batch, 3, size, size] of any floating dtype and either layout; labels: [batch]
  // int32 or int64 in [0, classes). Converted to fp32 (fp64 under Precision::fp64) and int64.
  Status set_input(const HostTensor& images, const HostTensor& labels);
  // The images buffer's element type and layout: what set_device_input() copies as is.
  TensorDesc input_desc() const;
  // The images already in the backend's memory (a GPU input pipeline's batch) in input_desc()'s
  // type and layout, copied in queue order; labels as set_input() takes them. As set_input(), it
  // first waits for the steps queued before, so `images` may be written again once the next call
  // has returned.
  Status set_device_input(const void* images, const HostTensor& labels);
  // Waits for every step queued so far (set_input() and set_device_input() do so first).
  Status synchronize();

  // Queues one step; steps queue back to back (the loss scale and step count they read are on the
  // backend, advanced by the step before).
  Status enqueue();
  // Waits for the last queued step and returns its loss.
  Result<StepResult> collect();
  // enqueue() then collect().
  Result<StepResult> run_step();
  // `steps` steps over a data set of whole batches: `images` [k * batch, 3, size, size] and
  // `labels` [k * batch] as set_input() takes them, step i on batch i mod k (images i mod k *
  // batch onwards, in order), each step's result in order. The same as set_input() of each batch
  // then run_step(), step by step, so a loss curve over a fixed image set is one call (`dlprobe
  // step --steps`). The last batch stays set.
  Result<std::vector<StepResult>> run_steps(const HostTensor& images, const HostTensor& labels,
                                            std::int64_t steps);
  // One step as run_step(), with a backend timing mark before every call and after the last
  // (marks first_mark .. first_mark + calls().size()), and the time of each call in ms, parallel
  // to calls(): what the device spent from the end of the call before to the end of this one.
  // The marks cost a little; profile, then time without them.
  Result<std::vector<double>> profile_step(std::size_t first_mark = 0);

  // State-dict entries by torchvision name, logical shape, in the engine's layout: parameters and
  // BN statistics in their master dtype, num_batches_tracked as int64 [1].
  Result<HostTensor> tensor(std::string_view name) const;
  // The gradient of a parameter (master dtype) as the last step left it.
  Result<HostTensor> gradient(std::string_view name) const;
  // Replaces a state entry; any floating dtype and layout of the right logical shape.
  Status set_tensor(std::string_view name, const HostTensor& value);

  // The state dict in torchvision's order and format (fp32 contiguous NCHW, num_batches_tracked
  // a 0-dimensional int64), as safetensors.torch.save_file(model.state_dict()) writes it.
  Result<safetensors::File> state_dict() const;
  // Loads a state dict by name: every entry of the model must be there with its shape (F64, F32,
  // F16 or BF16 for floating entries; I64 or I32 for num_batches_tracked, shape [] or [1]), and
  // nothing else. Errors name the tensor.
  Status load_state_dict(const safetensors::File& file);

  // The loss scale the next step runs with, and the optimizer steps taken (skipped fp16 steps do
  // not count, as the optimizer's step count), both as of the last collect().
  double loss_scale() const;
  std::int64_t optimizer_steps() const;

  // From the next step on, copies the logits the loss reads (master dtype: fp32 after
  // autocast's cast of fp16/bf16 logits, fp64 under Precision::fp64) into a buffer that outlives
  // the step, for comparing a step with another framework's (`dlprobe step`). Off by default, so
  // bench times and measures the step without the copy.
  Status keep_logits();
  // Those logits [batch, classes] as the last step left them: NaN before the first step after
  // keep_logits(), an error without it.
  Result<HostTensor> logits() const;

 private:
  Status check_labels(const HostTensor& labels) const;
  struct Impl;
  explicit TrainingStep(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlprobe::engine
