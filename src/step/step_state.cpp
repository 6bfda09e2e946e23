// The step's long-lived buffers: the model's state in its master dtype (and the mixed-precision
// working copies), gradients, optimizer state, input, the loss and the fp16 found_inf flag, and
// moving tensors between them and the host.
#include <fmt/format.h>

#include "step_state.h"

namespace dlprobe::engine::step_impl {

using memory::Category;
using model::StateKind;

namespace {

bool is_mixed(Precision p) {
  return p == Precision::fp16 || p == Precision::bf16;
}

}  // namespace

Result<TensorDesc> make_desc(const Shape& s, DType dtype, Layout layout) {
  return TensorDesc::make(s, dtype, s.rank == 4 ? layout : Layout::nchw);
}

Buffer* StepState::add_buffer(const TensorDesc& desc, Category category, std::string owner,
                              bool transient) {
  auto b = std::make_unique<Buffer>();
  b->view.desc = desc;
  b->category = category;
  b->owner = std::move(owner);
  b->transient = transient;
  buffers.push_back(std::move(b));
  return buffers.back().get();
}

Result<Buffer*> StepState::persistent(const TensorDesc& desc, Category category,
                                      std::string owner) {
  Buffer* b = add_buffer(desc, category, std::move(owner), false);
  DLPROBE_ASSIGN_OR_RETURN(b->storage, allocator.allocate_buffer(desc.bytes(), category, b->owner));
  b->view.data = b->storage.data();
  return b;
}

Buffer* StepState::transient(const TensorDesc& desc, Category category, std::string owner) {
  return add_buffer(desc, category, std::move(owner), true);
}

Status StepState::allocate_state() {
  const Layout layout = config.layout;
  state.resize(model.state().size());
  for (std::size_t i = 0; i < model.state().size(); ++i) {
    const model::StateEntry& e = model.state()[i];
    if (e.kind == StateKind::num_batches_tracked) continue;  // a host-side counter
    const std::string& owner = model.layers()[static_cast<std::size_t>(e.layer)].name;
    DLPROBE_ASSIGN_OR_RETURN(TensorDesc desc, make_desc(e.shape, master(), layout));
    StateSlot& slot = state[i];
    DLPROBE_ASSIGN_OR_RETURN(slot.master, persistent(desc, Category::weights, owner));
    if (!model::is_parameter(e.kind)) continue;
    const bool low_precision_copy =
        is_mixed(config.precision) &&
        (e.kind == StateKind::conv_weight || e.kind == StateKind::fc_weight ||
         e.kind == StateKind::fc_bias);
    if (low_precision_copy) {
      DLPROBE_ASSIGN_OR_RETURN(slot.working,
                               persistent(desc.with_dtype(act()), Category::weights, owner));
    }
    if (!training()) continue;
    DLPROBE_ASSIGN_OR_RETURN(slot.grad, persistent(desc, Category::gradients, owner));
    if (config.mode != StepMode::train) continue;
    const bool first = config.optimizer == OptimizerKind::adamw || config.sgd.momentum != 0.0;
    if (first) {
      DLPROBE_ASSIGN_OR_RETURN(slot.state0, persistent(desc, Category::optimizer_state, owner));
      DLPROBE_RETURN_IF_ERROR(backend.fill(slot.state0->view, 0.0));
    }
    if (config.optimizer == OptimizerKind::adamw) {
      DLPROBE_ASSIGN_OR_RETURN(slot.state1, persistent(desc, Category::optimizer_state, owner));
      DLPROBE_RETURN_IF_ERROR(backend.fill(slot.state1->view, 0.0));
    }
  }
  const std::int64_t n = config.batch;
  const std::int64_t hw = config.model.image_size;
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc images_desc,
                           TensorDesc::make(Shape{n, 3, hw, hw}, master(), layout));
  DLPROBE_ASSIGN_OR_RETURN(images, persistent(images_desc, Category::input, "images"));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc labels_desc, TensorDesc::make(Shape{n}, DType::int64));
  DLPROBE_ASSIGN_OR_RETURN(labels, persistent(labels_desc, Category::input, "labels"));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc scalar, TensorDesc::make(Shape{1}, master()));
  DLPROBE_ASSIGN_OR_RETURN(loss, persistent(scalar, Category::temporaries, "loss"));
  if (scaling() && config.mode == StepMode::train) {
    DLPROBE_ASSIGN_OR_RETURN(found_inf, persistent(scalar.with_dtype(DType::fp32),
                                                   Category::optimizer_state, "grad_scaler"));
  }
  if (scaling() || config.mode == StepMode::train) {
    DLPROBE_ASSIGN_OR_RETURN(
        counters, persistent(step_counters_desc(), Category::optimizer_state, "step_counters"));
    StepCounters start;
    start.loss_scale = scale;
    start.last_loss_scale = scale;
    DLPROBE_RETURN_IF_ERROR(backend.upload(counters->view.data, &start, sizeof start));
  }
  return Status::ok();
}

Status StepState::upload_initial_state() {
  const std::vector<HostTensor> init = model::initial_state(model, config.seed);
  for (std::size_t i = 0; i < init.size(); ++i) {
    if (state[i].master == nullptr) continue;
    DLPROBE_RETURN_IF_ERROR(upload_to(*state[i].master, init[i], model.state()[i].name));
  }
  return Status::ok();
}

Status StepState::upload_to(Buffer& b, const HostTensor& value, std::string_view what) {
  if (!(value.shape() == b.view.desc.shape())) {
    return invalid_argument(fmt::format("{}: shape [{}] does not match the model's [{}]", what,
                                        value.shape().str(), b.view.desc.shape().str()));
  }
  if (value.dtype() == b.view.desc.dtype() && value.layout() == b.view.desc.layout()) {
    return backend.upload(b.view.data, value.data(), b.view.desc.bytes());
  }
  DLPROBE_ASSIGN_OR_RETURN(HostTensor converted, value.to_dtype(b.view.desc.dtype()));
  const HostTensor laid_out = converted.to_layout(b.view.desc.layout());
  return backend.upload(b.view.data, laid_out.data(), b.view.desc.bytes());
}

Result<HostTensor> StepState::download(const Buffer& b) const {
  DLPROBE_RETURN_IF_ERROR(backend.synchronize());
  HostTensor t(b.view.desc);
  DLPROBE_RETURN_IF_ERROR(backend.download(t.data(), b.view.data, b.view.desc.bytes()));
  return t;
}

void StepState::release_transients() {
  // A planned step's buffers point into its arena, which lives as long as the step.
  if (arena_layout) return;
  for (const auto& b : buffers) {
    if (!b->transient || b->view.data == nullptr) continue;
    // Already failing: the first error is the one to report.
    (void)allocator.deallocate(b->view.data);
    b->view.data = nullptr;
  }
}

}  // namespace dlprobe::engine::step_impl
