// The step's state by torchvision name: single tensors in and out, and the whole state dict as
// safetensors.torch writes it.
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "dlprobe/step/training_step.h"
#include "step_state.h"

namespace dlprobe::engine {
namespace {

using model::StateKind;
using step_impl::StateSlot;

// The buffers of the state entry `name`.
Result<StateSlot*> slot_named(step_impl::StepState& s, std::string_view name) {
  const int i = s.model.find_state(name);
  if (i < 0) {
    return error(Errc::not_found, fmt::format("{} has no tensor named '{}'",
                                              model::model_name(s.model.config()), name));
  }
  return &s.state[static_cast<std::size_t>(i)];
}

}  // namespace

Result<HostTensor> TrainingStep::tensor(std::string_view name) const {
  DLPROBE_ASSIGN_OR_RETURN(const StateSlot* slot, slot_named(*impl_, name));
  if (slot->master == nullptr) {
    HostTensor t(TensorDesc::make(Shape{1}, DType::int64).value());
    t.set(0, static_cast<double>(slot->num_batches_tracked));
    return t;
  }
  return impl_->download(*slot->master);
}

Result<HostTensor> TrainingStep::gradient(std::string_view name) const {
  DLPROBE_ASSIGN_OR_RETURN(const StateSlot* slot, slot_named(*impl_, name));
  if (slot->grad == nullptr) {
    return invalid_argument(
        fmt::format("'{}' has no gradient in mode {}", name, step_mode_name(impl_->config.mode)));
  }
  return impl_->download(*slot->grad);
}

Status TrainingStep::set_tensor(std::string_view name, const HostTensor& value) {
  DLPROBE_ASSIGN_OR_RETURN(StateSlot * slot, slot_named(*impl_, name));
  if (slot->master == nullptr) {
    if (value.numel() != 1 || dtype_is_floating(value.dtype())) {
      return invalid_argument(fmt::format("{}: expected one integer, got {} [{}]", name,
                                          dtype_name(value.dtype()), value.shape().str()));
    }
    slot->num_batches_tracked = static_cast<std::int64_t>(value.get(0));
    return Status::ok();
  }
  if (!dtype_is_floating(value.dtype())) {
    return invalid_argument(
        fmt::format("{}: expected a floating tensor, got {}", name, dtype_name(value.dtype())));
  }
  DLPROBE_RETURN_IF_ERROR(impl_->backend.synchronize());
  return impl_->upload_to(*slot->master, value, name);
}

Result<safetensors::File> TrainingStep::state_dict() const {
  safetensors::File file;
  for (const model::StateEntry& e : impl_->model.state()) {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor t, tensor(e.name));
    safetensors::Tensor out;
    out.name = e.name;
    out.dtype = t.dtype();
    if (e.kind != StateKind::num_batches_tracked) {
      for (int d = 0; d < e.shape.rank; ++d) out.shape.push_back(e.shape[d]);
    }
    // PyTorch's tensors are contiguous in logical order: NCHW for conv weights.
    const HostTensor contiguous =
        t.layout() == Layout::nchw ? std::move(t) : t.to_layout(Layout::nchw);
    const auto* bytes = static_cast<const std::byte*>(contiguous.data());
    out.data.assign(bytes, bytes + contiguous.desc().bytes());
    file.tensors.push_back(std::move(out));
  }
  return file;
}

Status TrainingStep::load_state_dict(const safetensors::File& file) {
  const model::Model& m = impl_->model;
  for (const safetensors::Tensor& t : file.tensors) {
    if (m.find_state(t.name) < 0) {
      return invalid_argument(fmt::format("unexpected tensor '{}' in the state dict for {}", t.name,
                                          model::model_name(m.config())));
    }
  }
  std::vector<HostTensor> values;
  for (const model::StateEntry& e : m.state()) {
    const safetensors::Tensor* t = file.find(e.name);
    if (t == nullptr) {
      return invalid_argument(fmt::format("missing tensor '{}' in the state dict for {}", e.name,
                                          model::model_name(m.config())));
    }
    std::vector<std::int64_t> want;
    for (int d = 0; d < e.shape.rank; ++d) want.push_back(e.shape[d]);
    const bool scalar = e.kind == StateKind::num_batches_tracked;
    const bool shape_ok = t->shape == want || (scalar && t->shape.empty());
    if (!shape_ok) {
      return invalid_argument(fmt::format("tensor '{}' has shape [{}], the model expects [{}]",
                                          e.name, fmt::join(t->shape, ", "),
                                          fmt::join(want, ", ")));
    }
    if (dtype_is_floating(t->dtype) == scalar) {
      return invalid_argument(fmt::format("tensor '{}' has dtype {}, expected {}", e.name,
                                          safetensors::dtype_code(t->dtype),
                                          scalar ? "an integer" : "a floating type"));
    }
    HostTensor v(TensorDesc::make(e.shape, t->dtype).value());
    if (t->data.size() != v.desc().bytes()) {
      return invalid_argument(fmt::format("tensor '{}' holds {} bytes, its shape needs {}", e.name,
                                          t->data.size(), v.desc().bytes()));
    }
    std::memcpy(v.data(), t->data.data(), v.desc().bytes());
    // A NaN or an infinity would run to a NaN loss and gradients that read as the step's answer.
    for (std::int64_t j = 0; !scalar && j < v.numel(); ++j) {
      if (!std::isfinite(v.get(j))) {
        return invalid_argument(fmt::format("tensor '{}' holds {} at value {}, not a finite number",
                                            e.name, v.get(j), j));
      }
    }
    values.push_back(std::move(v));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    DLPROBE_RETURN_IF_ERROR(set_tensor(m.state()[i].name, values[i]));
  }
  return Status::ok();
}

}  // namespace dlprobe::engine
