// TrainingStep's life: the configuration checked, the long-lived buffers allocated and
// initialised, the step planned and scheduled; the input set; the kept logits. Running a step is
// runtime.cpp's, the state dict state_dict.cpp's.
#include "dlprobe/step/training_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dlprobe/core/log.h"
#include "planner.h"
#include "schedule.h"
#include "step_state.h"

namespace dlprobe::engine {
namespace {

using memory::Category;
using step_impl::Buffer;

Status check_config(const StepConfig& c) {
  if (c.batch < 1) return invalid_argument(fmt::format("batch must be >= 1, got {}", c.batch));
  if (c.graph && c.memory_plan != MemoryPlan::planned) {
    return invalid_argument("a graph replay needs the planned memory plan (fixed addresses)");
  }
  if (c.streams != 1 && c.streams != 2) {
    return invalid_argument(fmt::format("streams must be 1 or 2, got {}", c.streams));
  }
  if (c.streams > 1 && c.memory_plan != MemoryPlan::planned) {
    return invalid_argument(
        "a second stream needs the planned memory plan (MemoryPlan::planned), or streams = 1");
  }
  if (c.stream_lag < 0) {
    return invalid_argument(fmt::format("stream_lag must be >= 0, got {}", c.stream_lag));
  }
  if (c.stream_lag > 0 && c.streams < 2) {
    return invalid_argument("a stream lag bounds the second stream: it needs streams = 2");
  }
  if (c.streams > 1 && c.recompute_block_outputs) {
    // The second stream's weight gradients keep their operands, the recomputed outputs among
    // them, to the end of the backward pass: nothing would be saved.
    return invalid_argument(
        "recomputed block outputs need one stream (a second keeps them to the end of the "
        "backward pass)");
  }
  if (c.mode == StepMode::train) {
    DLPROBE_RETURN_IF_ERROR(c.optimizer == OptimizerKind::sgd ? sgd_check(c.sgd)
                                                              : adamw_check(c.adamw));
  }
  return grad_scaler_check(c.scaler);
}

}  // namespace

TrainingStep::TrainingStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainingStep::~TrainingStep() {
  if (!impl_) return;
  // The recorded graph's memory is the backend's; a sweep's next configuration on the same
  // backend would carry it (on an H200 one evaluate sweep held 25 GiB of dead graph workspaces
  // by its twentieth configuration).
  if (impl_->graph) impl_->backend.release_graph(*impl_->graph);
  impl_->release_transients();
  impl_->allocator.set_oom_advice({});
}

Result<std::unique_ptr<TrainingStep>> TrainingStep::create(const StepConfig& config,
                                                           Backend& backend,
                                                           memory::CachingAllocator& allocator) {
  DLPROBE_RETURN_IF_ERROR(check_config(config));
  DLPROBE_ASSIGN_OR_RETURN(model::Model m, model::Model::create(config.model));
  DLPROBE_ASSIGN_OR_RETURN(std::vector<Shape> shapes,
                           m.value_shapes(config.batch, config.mode != StepMode::infer));
  // What an out-of-memory message should suggest for this step, beside a smaller batch.
  memory::OomAdvice advice;
  advice.mixed_precision =
      config.precision == Precision::fp16 || config.precision == Precision::bf16;
  advice.planned = config.memory_plan == MemoryPlan::planned;
  const bool recomputable =
      config.mode != StepMode::infer && config.fuse && config.fuse_conv && config.streams == 1 &&
      backend.fuses_conv_batch_norm(activation_dtype(config.precision), config.layout);
  if (recomputable && !config.recompute_block_outputs)
    advice.also = "recomputing the block outputs";
  allocator.set_oom_advice(std::move(advice));
  auto impl = std::make_unique<Impl>(config, std::move(m), backend, allocator);
  backend.set_math_mode(config.precision == Precision::tf32 ? MathMode::tf32
                                                            : MathMode::strict_fp32);
  impl->scale = impl->scaling() ? config.scaler.init_scale : 1.0;
  DLPROBE_RETURN_IF_ERROR(impl->allocate_state());
  DLPROBE_RETURN_IF_ERROR(impl->upload_initial_state());
  log_debug("step: initial state drawn and uploaded");
  step_impl::Planner planner(*impl);
  DLPROBE_RETURN_IF_ERROR(planner.run(shapes));
  log_debug("step: planned");
  // config() then says what runs, and results made from it claim no recomputation where the
  // backend had none to do (no batch norm inside the convolutions).
  if (!planner.recomputes_block_outputs()) impl->config.recompute_block_outputs = false;
  DLPROBE_ASSIGN_OR_RETURN(impl->calls, step_impl::schedule(*impl, planner.take()));
  log_debug("step: scheduled, {} calls", impl->calls.size());
  return std::unique_ptr<TrainingStep>(new TrainingStep(std::move(impl)));
}

const StepConfig& TrainingStep::config() const {
  return impl_->config;
}
const model::Model& TrainingStep::model() const {
  return impl_->model;
}
const std::vector<Call>& TrainingStep::calls() const {
  return impl_->calls;
}
const std::vector<TransientBuffer>& TrainingStep::transients() const {
  return impl_->transients;
}
std::optional<ArenaLayout> TrainingStep::arena() const {
  return impl_->arena_layout;
}
std::size_t TrainingStep::current_call() const {
  return impl_->current_call;
}
bool TrainingStep::graph_recorded() const {
  return impl_->graph.has_value();
}
double TrainingStep::loss_scale() const {
  return impl_->scale;
}
std::int64_t TrainingStep::optimizer_steps() const {
  return impl_->optimizer_steps;
}

Status TrainingStep::set_input(const HostTensor& images, const HostTensor& labels) {
  const StepConfig& c = impl_->config;
  const Shape want{c.batch, 3, c.model.image_size, c.model.image_size};
  if (!(images.shape() == want) || !dtype_is_floating(images.dtype())) {
    return invalid_argument(fmt::format("images must be a floating {} tensor, got {} {}",
                                        want.str(), dtype_name(images.dtype()),
                                        images.shape().str()));
  }
  DLPROBE_RETURN_IF_ERROR(check_labels(labels));
  DLPROBE_RETURN_IF_ERROR(impl_->backend.synchronize());
  DLPROBE_RETURN_IF_ERROR(impl_->upload_to(*impl_->images, images, "images"));
  DLPROBE_RETURN_IF_ERROR(impl_->upload_to(*impl_->labels, labels, "labels"));
  impl_->input_set = true;
  return Status::ok();
}

Status TrainingStep::check_labels(const HostTensor& labels) const {
  const StepConfig& c = impl_->config;
  if (!(labels.shape() == Shape{c.batch}) ||
      (labels.dtype() != DType::int32 && labels.dtype() != DType::int64)) {
    return invalid_argument(fmt::format("labels must be int32 or int64 [{}], got {} [{}]", c.batch,
                                        dtype_name(labels.dtype()), labels.shape().str()));
  }
  return check_label_range(labels, c.model.classes);
}

Status check_label_range(const HostTensor& labels, std::int64_t classes) {
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    const double label = labels.get(i);
    if (label < 0 || label >= static_cast<double>(classes)) {
      return invalid_argument(
          fmt::format("label {} of sample {} is outside [0, {})", label, i, classes));
    }
  }
  return Status::ok();
}

TensorDesc TrainingStep::input_desc() const {
  return impl_->images->view.desc;
}

Status TrainingStep::synchronize() {
  return impl_->backend.synchronize();
}

Status TrainingStep::set_device_input(const void* images, const HostTensor& labels) {
  if (images == nullptr) return invalid_argument("set_device_input: no images");
  DLPROBE_RETURN_IF_ERROR(check_labels(labels));
  // As set_input: the steps queued before are finished first, so that the memory the images come
  // from may be reused once this returns the second time after.
  DLPROBE_RETURN_IF_ERROR(impl_->backend.synchronize());
  Buffer& to = *impl_->images;
  DLPROBE_RETURN_IF_ERROR(impl_->backend.copy(to.view.data, images, to.view.desc.bytes()));
  DLPROBE_RETURN_IF_ERROR(impl_->upload_to(*impl_->labels, labels, "labels"));
  impl_->input_set = true;
  return Status::ok();
}

Status TrainingStep::keep_logits() {
  Impl& s = *impl_;
  if (s.kept_logits != nullptr) return Status::ok();
  const auto loss_forward = std::find_if(s.calls.begin(), s.calls.end(), [](const Call& c) {
    return c.kind == CallKind::cross_entropy_forward;
  });
  if (loss_forward == s.calls.end() || s.logits == nullptr) {
    return error(Errc::internal, "keep_logits: the plan has no loss call");
  }
  DLPROBE_ASSIGN_OR_RETURN(Buffer * kept,
                           s.persistent(s.logits->view.desc, Category::temporaries, "logits"));
  DLPROBE_RETURN_IF_ERROR(s.backend.fill(kept->view, std::nan("")));
  // Right after the loss read them: the logits' buffer is still allocated there in every mode.
  Buffer* src = s.logits;
  s.calls.insert(loss_forward + 1,
                 Call{"loss.logits.keep", CallKind::cast, "loss",
                      [&be = s.backend, src, kept] { return be.cast(src->view, kept->view); }});
  s.kept_logits = kept;
  return Status::ok();
}

Result<HostTensor> TrainingStep::logits() const {
  if (impl_->kept_logits == nullptr) {
    return invalid_argument("logits: keep_logits() must come before the step");
  }
  return impl_->download(*impl_->kept_logits);
}

}  // namespace dlprobe::engine
