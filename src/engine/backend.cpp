#include "dlprobe/engine/backend.h"

#include <fmt/format.h>

namespace dlprobe {

Status Backend::mark(std::size_t index) {
  if (index >= host_marks_.size()) {
    host_marks_.resize(index + 1);
    host_marked_.resize(index + 1, false);
  }
  host_marks_[index] = std::chrono::steady_clock::now();
  host_marked_[index] = true;
  return Status::ok();
}

Result<double> Backend::elapsed_ms(std::size_t from, std::size_t to) {
  for (const std::size_t i : {from, to}) {
    if (i >= host_marked_.size() || !host_marked_[i]) {
      return invalid_argument(fmt::format("timing mark {} was never recorded", i));
    }
  }
  return std::chrono::duration<double, std::milli>(host_marks_[to] - host_marks_[from]).count();
}

Status Backend::wait_for_mark(std::size_t index) {
  if (index >= host_marked_.size() || !host_marked_[index]) {
    return invalid_argument(fmt::format("timing mark {} was never recorded", index));
  }
  return Status::ok();  // the defaults' calls finished before they returned
}

Result<std::size_t> Backend::capture(const std::function<Status()>& /*record*/) {
  return error(Errc::unsupported, fmt::format("the {} backend cannot record graphs", name()));
}

Status Backend::replay(std::size_t /*graph*/) {
  return error(Errc::unsupported, fmt::format("the {} backend cannot replay graphs", name()));
}

void Backend::release_graph(std::size_t /*graph*/) {}  // the defaults record none

void Backend::reset_call_workspace_peak() {}  // nor do they keep workspace

Result<std::size_t> Backend::on_stream(int stream, const std::function<Status()>& run) {
  if (stream < 0 || stream >= streams()) {
    return invalid_argument(
        fmt::format("the {} backend has no stream {} ({} in all)", name(), stream, streams()));
  }
  DLPROBE_RETURN_IF_ERROR(run());
  return std::size_t{0};  // the work is done: nothing to join
}

namespace {

Status no_fusion(const Backend& b, std::string_view op) {
  return error(Errc::unsupported,
               fmt::format("{}: the {} backend does not fuse batch norm and ReLU", op, b.name()));
}

Status no_conv_fusion(const Backend& b, std::string_view op) {
  return error(
      Errc::unsupported,
      fmt::format("{}: the {} backend does not fuse batch norm into convolutions", op, b.name()));
}

}  // namespace

Status Backend::batch_norm_relu_train_forward(const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView&,
                                              const TensorView&, const BatchNormParams&) {
  return no_fusion(*this, "batch_norm_relu_train_forward");
}

Status Backend::batch_norm_relu_inference_forward(const TensorView&, const TensorView&,
                                                  const TensorView&, const TensorView&,
                                                  const TensorView&, const TensorView&,
                                                  const TensorView&, const BatchNormParams&) {
  return no_fusion(*this, "batch_norm_relu_inference_forward");
}

Status Backend::cast_many(std::span<const TensorView> src, std::span<const TensorView> dst) {
  if (src.size() != dst.size()) {
    return invalid_argument(
        fmt::format("cast_many: {} sources and {} destinations", src.size(), dst.size()));
  }
  for (std::size_t i = 0; i < src.size(); ++i) DLPROBE_RETURN_IF_ERROR(cast(src[i], dst[i]));
  return Status::ok();
}

Status Backend::batch_norm_relu_backward(const TensorView&, const TensorView&, const TensorView&,
                                         const TensorView&, const TensorView&, const TensorView&,
                                         const TensorView&, const TensorView&, const TensorView&,
                                         const TensorView&) {
  return no_fusion(*this, "batch_norm_relu_backward");
}

Status Backend::conv2d_forward_fused(const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&, const Conv2dParams&) {
  return no_conv_fusion(*this, "conv2d_forward_fused");
}

Status Backend::conv2d_backward_weight_fused(const TensorView&, const TensorView&,
                                             const TensorView&, const TensorView&,
                                             const TensorView&, const Conv2dParams&) {
  return no_conv_fusion(*this, "conv2d_backward_weight_fused");
}

Status Backend::conv2d_backward_data_add_relu(const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView&,
                                              const TensorView&, const Conv2dParams&) {
  return no_conv_fusion(*this, "conv2d_backward_data_add_relu");
}

Status Backend::batch_norm_finalize(const BatchNormFinalize&) {
  return no_conv_fusion(*this, "batch_norm_finalize");
}

Status Backend::conv2d_forward_finalize_fused(const BatchNormFinalize& f, const TensorView& x,
                                              const TensorView& w, const TensorView& y,
                                              const TensorView& sum, const TensorView& sqsum,
                                              const Conv2dParams& p) {
  DLPROBE_RETURN_IF_ERROR(batch_norm_finalize(f));
  return conv2d_forward_fused(x, f.scale, f.bias, w, y, sum, sqsum, p);
}

Status Backend::batch_norm_finalize_apply(const BatchNormFinalize& f, const TensorView& x,
                                          const TensorView& residual, const TensorView& y,
                                          bool relu) {
  DLPROBE_RETURN_IF_ERROR(batch_norm_finalize(f));
  return batch_norm_apply(x, f.gamma, f.beta, f.save_mean, f.save_invstd, residual, y, relu);
}

Status Backend::batch_norm_apply_add(const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&, const TensorView&) {
  return no_conv_fusion(*this, "batch_norm_apply_add");
}

Status Backend::batch_norm_finalize_apply_add(const BatchNormFinalize& f, const TensorView& x,
                                              const BatchNormFinalize& rf, const TensorView& r,
                                              const TensorView& y) {
  DLPROBE_RETURN_IF_ERROR(batch_norm_finalize(f));
  DLPROBE_RETURN_IF_ERROR(batch_norm_finalize(rf));
  return batch_norm_apply_add(x, f.gamma, f.beta, f.save_mean, f.save_invstd, r, rf.gamma, rf.beta,
                              rf.save_mean, rf.save_invstd, y);
}

Status Backend::batch_norm_add_backward(const TensorView& dy, const BatchNormGrads& x,
                                        const BatchNormGrads& r) {
  for (const BatchNormGrads* g : {&x, &r}) {
    DLPROBE_RETURN_IF_ERROR(batch_norm_backward(dy, g->x, g->gamma, g->save_mean, g->save_invstd,
                                                g->dx, g->dgamma, g->dbeta));
  }
  return Status::ok();
}

Status Backend::batch_norm_apply(const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, bool) {
  return no_conv_fusion(*this, "batch_norm_apply");
}

Status Backend::relu_backward_add(const TensorView&, const TensorView&, const TensorView&,
                                  const TensorView&) {
  return no_fusion(*this, "relu_backward_add");
}

Status Backend::max_pool2d_backward_recomputed(const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const TensorView&, const MaxPool2dParams&) {
  return no_fusion(*this, "max_pool2d_backward_recomputed");
}

Status Backend::batch_norm_relu_max_pool_backward(const TensorView&, const TensorView&,
                                                  const TensorView&, const TensorView&,
                                                  const TensorView&, const TensorView&,
                                                  const TensorView&, const TensorView&,
                                                  const TensorView&, const TensorView&,
                                                  const MaxPool2dParams&) {
  return no_fusion(*this, "batch_norm_relu_max_pool_backward");
}

Status Backend::batch_norm_relu_max_pool_train_forward(const TensorView&, const TensorView&,
                                                       const TensorView&, const TensorView&,
                                                       const TensorView&, const TensorView&,
                                                       const TensorView&, const TensorView&,
                                                       const TensorView&, const BatchNormParams&,
                                                       const MaxPool2dParams&) {
  return no_fusion(*this, "batch_norm_relu_max_pool_train_forward");
}

}  // namespace dlprobe
