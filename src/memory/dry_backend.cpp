#include "dry_backend.h"

namespace dlprobe::memory {
namespace {

class DryBackend final : public Backend {
 public:
  std::string_view name() const override { return "dry"; }
  DeviceKind device() const override { return DeviceKind::cpu; }
  void set_math_mode(MathMode /*mode*/) override {}

  Status upload(void* /*dst*/, const void* /*src*/, std::size_t /*bytes*/) override { return {}; }
  Status download(void* /*dst*/, const void* /*src*/, std::size_t /*bytes*/) override { return {}; }
  Status synchronize() override { return {}; }

  Status fill(const TensorView& /*t*/, double /*value*/) override { return {}; }
  Status cast(const TensorView& /*src*/, const TensorView& /*dst*/) override { return {}; }
  Status conv2d_forward(const TensorView& /*x*/, const TensorView& /*w*/, const TensorView& /*y*/,
                        const Conv2dParams& /*p*/) override {
    return {};
  }
  Status conv2d_backward_data(const TensorView& /*dy*/, const TensorView& /*w*/,
                              const TensorView& /*dx*/, const Conv2dParams& /*p*/) override {
    return {};
  }
  Status conv2d_backward_weight(const TensorView& /*x*/, const TensorView& /*dy*/,
                                const TensorView& /*dw*/, const Conv2dParams& /*p*/) override {
    return {};
  }
  Status batch_norm_train_forward(const TensorView& /*x*/, const TensorView& /*gamma*/,
                                  const TensorView& /*beta*/, const TensorView& /*running_mean*/,
                                  const TensorView& /*running_var*/, const TensorView& /*y*/,
                                  const TensorView& /*save_mean*/,
                                  const TensorView& /*save_invstd*/,
                                  const BatchNormParams& /*p*/) override {
    return {};
  }
  Status batch_norm_inference_forward(const TensorView& /*x*/, const TensorView& /*gamma*/,
                                      const TensorView& /*beta*/,
                                      const TensorView& /*running_mean*/,
                                      const TensorView& /*running_var*/, const TensorView& /*y*/,
                                      const BatchNormParams& /*p*/) override {
    return {};
  }
  Status batch_norm_backward(const TensorView& /*dy*/, const TensorView& /*x*/,
                             const TensorView& /*gamma*/, const TensorView& /*save_mean*/,
                             const TensorView& /*save_invstd*/, const TensorView& /*dx*/,
                             const TensorView& /*dgamma*/, const TensorView& /*dbeta*/) override {
    return {};
  }
  explicit DryBackend(bool fuses) : fuses_(fuses) {}

  bool fuses_batch_norm_relu() const override { return fuses_; }
  Status batch_norm_relu_train_forward(
      const TensorView& /*x*/, const TensorView& /*gamma*/, const TensorView& /*beta*/,
      const TensorView& /*running_mean*/, const TensorView& /*running_var*/,
      const TensorView& /*residual*/, const TensorView& /*y*/, const TensorView& /*save_mean*/,
      const TensorView& /*save_invstd*/, const BatchNormParams& /*p*/) override {
    return {};
  }
  Status batch_norm_relu_inference_forward(const TensorView& /*x*/, const TensorView& /*gamma*/,
                                           const TensorView& /*beta*/,
                                           const TensorView& /*running_mean*/,
                                           const TensorView& /*running_var*/,
                                           const TensorView& /*residual*/, const TensorView& /*y*/,
                                           const BatchNormParams& /*p*/) override {
    return {};
  }
  Status batch_norm_relu_backward(const TensorView& /*dy*/, const TensorView& /*y*/,
                                  const TensorView& /*x*/, const TensorView& /*gamma*/,
                                  const TensorView& /*save_mean*/,
                                  const TensorView& /*save_invstd*/, const TensorView& /*dx*/,
                                  const TensorView& /*dgamma*/,
                                  const TensorView& /*dbeta*/) override {
    return {};
  }
  bool fuses_relu_backward_add() const override { return fuses_; }
  Status relu_backward_add(const TensorView& /*a*/, const TensorView& /*b*/,
                           const TensorView& /*y*/, const TensorView& /*dx*/) override {
    return {};
  }
  Status relu_forward(const TensorView& /*x*/, const TensorView& /*y*/) override { return {}; }
  Status relu_backward(const TensorView& /*dy*/, const TensorView& /*y*/,
                       const TensorView& /*dx*/) override {
    return {};
  }
  Status max_pool2d_forward(const TensorView& /*x*/, const TensorView& /*y*/,
                            const MaxPool2dParams& /*p*/) override {
    return {};
  }
  Status max_pool2d_backward(const TensorView& /*dy*/, const TensorView& /*x*/,
                             const TensorView& /*y*/, const TensorView& /*dx*/,
                             const MaxPool2dParams& /*p*/) override {
    return {};
  }
  Status add(const TensorView& /*a*/, const TensorView& /*b*/, const TensorView& /*y*/) override {
    return {};
  }
  Status global_avg_pool_forward(const TensorView& /*x*/, const TensorView& /*y*/) override {
    return {};
  }
  Status global_avg_pool_backward(const TensorView& /*dy*/, const TensorView& /*dx*/) override {
    return {};
  }
  Status linear_forward(const TensorView& /*x*/, const TensorView& /*w*/, const TensorView& /*b*/,
                        const TensorView& /*y*/) override {
    return {};
  }
  Status linear_backward(const TensorView& /*dy*/, const TensorView& /*x*/, const TensorView& /*w*/,
                         const TensorView& /*dx*/, const TensorView& /*dw*/,
                         const TensorView& /*db*/) override {
    return {};
  }
  Status cross_entropy_forward(const TensorView& /*logits*/, const TensorView& /*labels*/,
                               const TensorView& /*loss*/) override {
    return {};
  }
  Status cross_entropy_backward(const TensorView& /*logits*/, const TensorView& /*labels*/,
                                double /*loss_scale*/, const TensorView& /*dlogits*/) override {
    return {};
  }
  Status unscale_gradients(std::span<const TensorView> /*grads*/, double /*inv_scale*/,
                           const TensorView& /*found_inf*/) override {
    return {};
  }
  Status sgd_step(std::span<const OptimizerSlot> /*slots*/, const SgdParams& /*p*/,
                  std::int64_t /*step*/, const TensorView& /*found_inf*/) override {
    return {};
  }
  Status adamw_step(std::span<const OptimizerSlot> /*slots*/, const AdamWParams& /*p*/,
                    std::int64_t /*step*/, const TensorView& /*found_inf*/) override {
    return {};
  }

 private:
  bool fuses_;
};

}  // namespace

std::unique_ptr<Backend> make_dry_backend(bool fuses) {
  return std::make_unique<DryBackend>(fuses);
}

}  // namespace dlprobe::memory
