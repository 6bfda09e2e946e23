// The planned training step: a model, a batch size and a precision turned, once and ahead of time,
// into a flat list of backend calls over buffers from the caching allocator. Running a step runs
// the list; nothing is decided per step except what must be (the loss scale of fp16 training).
//
// Buffers and their memory categories (every one carries its layer as owner label):
//   weights          fp32 master parameters, BN running statistics, and under mixed precision
//                    the fp16/bf16 working copies of conv and fc parameters, cast from the masters
//                    at each layer's forward as autocast does
//   gradients        one fp32 gradient per parameter
//   optimizer_state  SGD momentum buffers or AdamW's exp_avg / exp_avg_sq; the fp16 found_inf flag
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

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/safetensors.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/models/resnet.h"

namespace dlprobe::engine {

// fp32: strict fp32 math. tf32: fp32 tensors, TF32 tensor cores allowed for conv and matmul.
// fp16 / bf16: mixed precision as torch.autocast runs it (fp32 master weights, fp16/bf16 conv, fc
// and batch-norm activations, fp32 loss), fp16 with dynamic loss scaling. fp64: everything in
// double, for gradient checks on the reference backend.
enum class Precision : std::uint8_t { fp32, tf32, fp16, bf16, fp64 };
Result<Precision> parse_precision(std::string_view text, std::string_view flag = "precision");
std::string_view precision_name(Precision p);
// The dtype conv, batch norm and fc activations have under `p`.
DType activation_dtype(Precision p);
// The dtype of master parameters, gradients, optimizer state, BN statistics and the loss.
DType master_dtype(Precision p);

// train: forward, backward, optimizer update. grads: forward and backward only (the benchmark
// protocol; under fp16 the gradients stay multiplied by the loss scale, as after
// scaler.scale(loss).backward()). infer: forward with BN running statistics, and the loss.
enum class StepMode : std::uint8_t { train, grads, infer };
Result<StepMode> parse_step_mode(std::string_view text, std::string_view flag = "mode");
std::string_view step_mode_name(StepMode m);

enum class OptimizerKind : std::uint8_t { sgd, adamw };
Result<OptimizerKind> parse_optimizer(std::string_view text, std::string_view flag = "optimizer");
std::string_view optimizer_name(OptimizerKind o);

// torch.cuda.amp.GradScaler's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

// How the step holds its activations and temporaries.
//   dynamic  `alloc`/`free` entries of the call list take each buffer from the caching allocator
//            just before its first use and give it back after its last (as PyTorch's step does)
//   planned  one block (category arena) taken at create() and laid out by memory::plan_arena from
//            the buffers' lifetimes: every buffer has a fixed address for every step, the call
//            list has no alloc/free entries, and the peak is as low as the lifetimes allow
enum class MemoryPlan : std::uint8_t { dynamic, planned };
std::string_view memory_plan_name(MemoryPlan p);

struct StepConfig {
  model::ModelConfig model;
  std::int64_t batch = 256;
  Precision precision = Precision::fp32;
  Layout layout = Layout::nchw;
  StepMode mode = StepMode::train;
  OptimizerKind optimizer = OptimizerKind::sgd;
  SgdParams sgd{
      .lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 1e-4, .nesterov = false};
  AdamWParams adamw{};
  GradScalerOptions scaler{};  // used under fp16 only
  std::uint64_t seed = 0;      // initial weights (model::initial_state)
  // Run each batch norm with the ReLU after it (and the residual add before that ReLU) as one
  // call where the backend can (Backend::fuses_batch_norm_relu): one pass over the activation
  // instead of two or three, and the BN output never stored. The same math, rounded once.
  bool fuse = true;
  MemoryPlan memory_plan = MemoryPlan::dynamic;
  // Record the step once as a graph (a CUDA graph) and replay it, so the host launches one graph
  // instead of every call. Needs MemoryPlan::planned (the same addresses every step) and mode
  // grads or infer (train's optimizer uploads its table each step and fp16 training changes its
  // loss scale between steps). A backend that cannot record runs the step eagerly, with a
  // warning.
  bool graph = false;
};

// One entry of the planned call list.
enum class CallKind : std::uint8_t {
  alloc,  // an activation or temporary buffer comes to life
  free,   // ... and goes
  fill,
  cast,
  conv_forward,
  conv_backward_data,
  conv_backward_weight,
  batch_norm_train_forward,
  batch_norm_inference_forward,
  batch_norm_backward,
  batch_norm_relu_train_forward,      // batch norm, [residual add,] ReLU in one call
  batch_norm_relu_inference_forward,  // the same with running statistics
  batch_norm_relu_backward,           // ReLU's mask and batch norm's backward in one call
  relu_forward,
  relu_backward,
  relu_backward_add,  // a ReLU's backward from a gradient that arrives as two terms
  max_pool_forward,
  max_pool_backward,
  add,
  global_avg_pool_forward,
  global_avg_pool_backward,
  linear_forward,
  linear_backward,
  cross_entropy_forward,
  cross_entropy_backward,
  unscale_gradients,
  sgd_step,
  adamw_step,
};
std::string_view call_kind_name(CallKind kind);

struct Call {
  std::string name;  // "layer1.0.conv1.forward", "alloc layer1.0.bn1 output", ...
  CallKind kind = CallKind::fill;
  std::string layer;  // owner: a model layer, "loss", "optimizer", "grad_scaler"
  std::function<Status()> run;
};

// An activation or temporary of the plan, and which entries of calls() it lives across: under
// MemoryPlan::dynamic its own alloc and free entries, under planned the first and last calls that
// touch it.
struct TransientBuffer {
  std::string owner;  // the layer
  memory::Category category = memory::Category::temporaries;
  std::uint64_t bytes = 0;
  std::size_t first_call = 0;
  std::size_t last_call = 0;
  std::uint64_t arena_offset = 0;  // planned only
};

// The arena of a planned step: its size, and the most bytes its buffers have live at one call
// (no layout can be smaller; the difference is the cost of the layout).
struct ArenaLayout {
  std::uint64_t bytes = 0;
  std::uint64_t peak_live_bytes = 0;
};

struct StepResult {
  double loss = 0.0;
  // fp16 only: the gradients held inf/NaN, so the optimizer step was skipped and the scale backed
  // off.
  bool skipped = false;
  double loss_scale = 1.0;  // the scale this step ran with (1 without scaling)
};

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

  // Queues one step. Under fp16 the scale of this step depends on whether the last one found
  // inf/NaN, so a step still pending is collected first (a synchronisation); otherwise steps
  // queue back to back.
  Status enqueue();
  // Waits for the last queued step and returns its loss.
  Result<StepResult> collect();
  // enqueue() then collect().
  Result<StepResult> run_step();
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

  double loss_scale() const;
  // Optimizer steps taken (skipped fp16 steps do not count), as the optimizer's step count.
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
  struct Impl;
  explicit TrainingStep(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlprobe::engine
