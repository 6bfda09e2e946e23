#include "dlprobe/engine/ops.h"

#include <fmt/format.h>

#include <cmath>

namespace dlprobe {
namespace {

Status need_rank(std::string_view op, std::string_view what, const Shape& s, int rank) {
  if (s.rank == rank) return Status::ok();
  return invalid_argument(
      fmt::format("{}: {} must have rank {}, got shape {}", op, what, rank, s.str()));
}

Status need_positive(std::string_view op, std::string_view what,
                     const std::array<std::int64_t, 2>& v, std::int64_t min) {
  if (v[0] >= min && v[1] >= min) return Status::ok();
  return invalid_argument(
      fmt::format("{}: {} must be >= {}, got {}x{}", op, what, min, v[0], v[1]));
}

}  // namespace

Result<Shape> conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d";
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "input", x, 4));
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "weight", w, 4));
  DLPROBE_RETURN_IF_ERROR(need_positive(op, "stride", p.stride, 1));
  DLPROBE_RETURN_IF_ERROR(need_positive(op, "padding", p.pad, 0));
  DLPROBE_RETURN_IF_ERROR(need_positive(op, "dilation", p.dilation, 1));
  if (p.groups < 1) return invalid_argument(fmt::format("{}: groups must be >= 1", op));
  if (x[1] % p.groups != 0 || w[0] % p.groups != 0) {
    return invalid_argument(
        fmt::format("{}: {} input and {} output channels do not split into {} groups", op, x[1],
                    w[0], p.groups));
  }
  if (w[1] * p.groups != x[1]) {
    return invalid_argument(
        fmt::format("{}: weight {} expects {} input channels, the input {} has {}", op, w.str(),
                    w[1] * p.groups, x.str(), x[1]));
  }
  std::array<std::int64_t, 2> out{};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t in = x.dims[2 + i] + 2 * p.pad[i];
    const std::int64_t k = p.dilation[i] * (w.dims[2 + i] - 1) + 1;
    if (in < k) {
      return invalid_argument(
          fmt::format("{}: input {}x{} (padded {}x{}) is smaller than the {}x{} kernel", op, x[2],
                      x[3], x[2] + 2 * p.pad[0], x[3] + 2 * p.pad[1],
                      p.dilation[0] * (w[2] - 1) + 1, p.dilation[1] * (w[3] - 1) + 1));
    }
    out[i] = (in - k) / p.stride[i] + 1;
  }
  return Shape{x[0], w[0], out[0], out[1]};
}

Status batch_norm_check(const Shape& x, const Shape& channel, const BatchNormParams& p,
                        bool training) {
  constexpr std::string_view op = "batch_norm";
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "input", x, 4));
  if (channel.rank != 1 || channel[0] != x[1]) {
    return invalid_argument(
        fmt::format("{}: per-channel tensors must be [{}], got [{}]", op, x[1], channel.str()));
  }
  if (!(p.eps > 0.0)) return invalid_argument(fmt::format("{}: eps must be > 0", op));
  if (!(p.momentum >= 0.0 && p.momentum <= 1.0)) {
    return invalid_argument(fmt::format("{}: momentum must be in [0, 1]", op));
  }
  if (training && x[0] * x[2] * x[3] < 2) {
    return invalid_argument(
        fmt::format("{}: training needs more than 1 value per channel, input {} has {}", op,
                    x.str(), x[0] * x[2] * x[3]));
  }
  return Status::ok();
}

Result<Shape> max_pool2d_output_shape(const Shape& x, const MaxPool2dParams& p) {
  constexpr std::string_view op = "max_pool2d";
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "input", x, 4));
  DLPROBE_RETURN_IF_ERROR(need_positive(op, "kernel", p.kernel, 1));
  DLPROBE_RETURN_IF_ERROR(need_positive(op, "stride", p.stride, 1));
  DLPROBE_RETURN_IF_ERROR(need_positive(op, "padding", p.pad, 0));
  std::array<std::int64_t, 2> out{};
  for (std::size_t i = 0; i < 2; ++i) {
    // PyTorch's rule: otherwise a window could lie entirely in the padding.
    if (p.pad[i] * 2 > p.kernel[i]) {
      return invalid_argument(fmt::format("{}: padding {}x{} is more than half the {}x{} kernel",
                                          op, p.pad[0], p.pad[1], p.kernel[0], p.kernel[1]));
    }
    const std::int64_t in = x.dims[2 + i] + 2 * p.pad[i];
    if (in < p.kernel[i]) {
      return invalid_argument(fmt::format(
          "{}: input {}x{} (padded {}x{}) is smaller than the "
          "{}x{} window",
          op, x[2], x[3], x[2] + 2 * p.pad[0], x[3] + 2 * p.pad[1], p.kernel[0], p.kernel[1]));
    }
    out[i] = (in - p.kernel[i]) / p.stride[i] + 1;
  }
  return Shape{x[0], x[1], out[0], out[1]};
}

Result<Shape> global_avg_pool_output_shape(const Shape& x) {
  DLPROBE_RETURN_IF_ERROR(need_rank("global_avg_pool", "input", x, 4));
  return Shape{x[0], x[1]};
}

Result<Shape> linear_output_shape(const Shape& x, const Shape& w, const Shape& b) {
  constexpr std::string_view op = "linear";
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "input", x, 2));
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "weight", w, 2));
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "bias", b, 1));
  if (w[1] != x[1]) {
    return invalid_argument(fmt::format("{}: weight {} takes {} features, the input {} has {}", op,
                                        w.str(), w[1], x.str(), x[1]));
  }
  if (b[0] != w[0]) {
    return invalid_argument(
        fmt::format("{}: bias [{}] does not match {} outputs", op, b.str(), w[0]));
  }
  return Shape{x[0], w[0]};
}

Status same_shape_check(std::string_view op, const Shape& a, const Shape& b) {
  if (a == b) return Status::ok();
  return invalid_argument(fmt::format("{}: shapes {} and {} differ", op, a.str(), b.str()));
}

Result<Shape> cross_entropy_output_shape(const Shape& logits, const Shape& labels) {
  constexpr std::string_view op = "cross_entropy";
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "logits", logits, 2));
  DLPROBE_RETURN_IF_ERROR(need_rank(op, "labels", labels, 1));
  if (labels[0] != logits[0]) {
    return invalid_argument(
        fmt::format("{}: {} labels for a batch of {}", op, labels[0], logits[0]));
  }
  return Shape{1};
}

Status sgd_check(const SgdParams& p) {
  if (!(p.lr >= 0.0)) return invalid_argument(fmt::format("sgd: invalid lr {}", p.lr));
  if (!(p.momentum >= 0.0)) {
    return invalid_argument(fmt::format("sgd: invalid momentum {}", p.momentum));
  }
  if (!(p.weight_decay >= 0.0)) {
    return invalid_argument(fmt::format("sgd: invalid weight decay {}", p.weight_decay));
  }
  if (p.nesterov && (p.momentum <= 0.0 || p.dampening != 0.0)) {
    return invalid_argument("sgd: nesterov needs momentum > 0 and dampening 0");
  }
  return Status::ok();
}

Status adamw_check(const AdamWParams& p) {
  if (!(p.lr >= 0.0)) return invalid_argument(fmt::format("adamw: invalid lr {}", p.lr));
  if (!(p.eps >= 0.0)) return invalid_argument(fmt::format("adamw: invalid eps {}", p.eps));
  if (!(p.beta1 >= 0.0 && p.beta1 < 1.0) || !(p.beta2 >= 0.0 && p.beta2 < 1.0)) {
    return invalid_argument(
        fmt::format("adamw: betas must be in [0, 1), got ({}, {})", p.beta1, p.beta2));
  }
  if (!(p.weight_decay >= 0.0)) {
    return invalid_argument(fmt::format("adamw: invalid weight decay {}", p.weight_decay));
  }
  return Status::ok();
}

Status grad_scaler_check(const GradScalerOptions& g) {
  if (!(g.init_scale > 0.0) || !std::isfinite(g.init_scale)) {
    return invalid_argument(fmt::format("grad scaler: init scale {} must be > 0", g.init_scale));
  }
  if (!(g.growth_factor > 1.0)) {
    return invalid_argument(
        fmt::format("grad scaler: growth factor {} must be > 1", g.growth_factor));
  }
  if (!(g.backoff_factor > 0.0 && g.backoff_factor < 1.0)) {
    return invalid_argument(
        fmt::format("grad scaler: backoff factor {} must be in (0, 1)", g.backoff_factor));
  }
  if (g.growth_interval < 1) {
    return invalid_argument(
        fmt::format("grad scaler: growth interval {} must be >= 1", g.growth_interval));
  }
  return Status::ok();
}

TensorDesc step_counters_desc() {
  static_assert(sizeof(StepCounters) == 4 * sizeof(double));
  return TensorDesc::make(Shape{4}, DType::fp64).value();
}

Status step_counters_check(std::string_view op, const TensorView& counters) {
  if (counters.data != nullptr && counters.desc.dtype() == DType::fp64 &&
      counters.desc.shape() == Shape{4}) {
    return Status::ok();
  }
  return invalid_argument(fmt::format(
      "{}: the step counters must be an fp64 [4] tensor (step_counters_desc(), holding a "
      "StepCounters), got {}",
      op, counters.data == nullptr ? "none" : counters.desc.str()));
}

void advance_step_counters(StepCounters& c, bool found_inf, const GradScalerOptions* scaler) {
  c.last_loss_scale = c.loss_scale;
  if (scaler == nullptr) {
    c.steps_taken += 1.0;
    return;
  }
  if (found_inf) {
    c.loss_scale *= scaler->backoff_factor;
    c.growth_tracker = 0.0;
    return;
  }
  c.steps_taken += 1.0;
  c.growth_tracker += 1.0;
  if (c.growth_tracker == static_cast<double>(scaler->growth_interval)) {
    // As torch's _amp_update_scale_: a growth that would overflow keeps the scale.
    const double grown = c.loss_scale * scaler->growth_factor;
    if (std::isfinite(grown)) c.loss_scale = grown;
    c.growth_tracker = 0.0;
  }
}

}  // namespace dlprobe
