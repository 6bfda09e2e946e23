#include "dry_backend.h"

#include "dlprobe/device/conv_options.h"

namespace dlprobe::memory {
namespace {

class DryBackend final : public Backend {
  // Every slot takes its tensors and does nothing with them.
  using View = const TensorView&;

 public:
  DryBackend(bool fuses, bool fuses_conv, bool recomputes_pool, bool fuses_pool_backward)
      : fuses_(fuses),
        fuses_conv_(fuses_conv),
        recomputes_pool_(recomputes_pool),
        fuses_pool_backward_(fuses_pool_backward) {}

  std::string_view name() const override { return "dry"; }
  DeviceKind device() const override { return DeviceKind::cpu; }
  void set_math_mode(MathMode) override {}

  Status upload(void*, const void*, std::size_t) override { return {}; }
  Status download(void*, const void*, std::size_t) override { return {}; }
  Status copy(void*, const void*, std::size_t) override { return {}; }
  Status synchronize() override { return {}; }

  Status fill(View, double) override { return {}; }
  Status cast(View, View) override { return {}; }
  Status conv2d_forward(View, View, View, const Conv2dParams&) override { return {}; }
  Status conv2d_backward_data(View, View, View, const Conv2dParams&) override { return {}; }
  Status conv2d_backward_weight(View, View, View, const Conv2dParams&) override { return {}; }
  Status batch_norm_train_forward(View, View, View, View, View, View, View, View,
                                  const BatchNormParams&) override {
    return {};
  }
  Status batch_norm_inference_forward(View, View, View, View, View, View,
                                      const BatchNormParams&) override {
    return {};
  }
  Status batch_norm_backward(View, View, View, View, View, View, View, View) override { return {}; }
  bool fuses_batch_norm_relu() const override { return fuses_; }
  Status batch_norm_relu_train_forward(View, View, View, View, View, View, View, View, View,
                                       const BatchNormParams&) override {
    return {};
  }
  Status batch_norm_relu_inference_forward(View, View, View, View, View, View, View,
                                           const BatchNormParams&) override {
    return {};
  }
  Status batch_norm_relu_backward(View, View, View, View, View, View, View, View, View,
                                  View) override {
    return {};
  }
  bool fuses_relu_backward_add() const override { return fuses_; }
  bool fuses_conv_batch_norm(DType, Layout) const override { return fuses_conv_; }
  // As the CUDA backend's, whose plans this one stands in for.
  DType conv_prologue_dtype(DType activation) const override {
    return activation == DType::bf16 ? DType::fp32 : activation;
  }
  // As the CUDA backend's default (`--conv-prologue auto`), which `dlprobe memory` runs: the
  // fp16 normalised inputs of at most kAutoPrologueUpTo bytes, at any batch, and every bf16 and
  // fp32 one.
  bool keeps_normalised_conv_input(const TensorDesc& x) const override {
    return fuses_conv_ && (x.dtype() != DType::fp16 || x.bytes() <= device::kAutoPrologueUpTo);
  }
  bool recomputes_max_pool_input() const override { return recomputes_pool_; }
  // In NHWC only, as the CUDA and reference backends offer it.
  bool fuses_max_pool_batch_norm_backward(const TensorDesc& x,
                                          const MaxPool2dParams&) const override {
    return fuses_pool_backward_ && x.layout() == Layout::nhwc;
  }
  Status batch_norm_relu_max_pool_backward(View, View, View, View, View, View, View, View, View,
                                           View, const MaxPool2dParams&) override {
    return {};
  }
  Status max_pool2d_backward_recomputed(View, View, View, View, View, View, View,
                                        const MaxPool2dParams&) override {
    return {};
  }
  Status batch_norm_relu_max_pool_train_forward(View, View, View, View, View, View, View, View,
                                                View, const BatchNormParams&,
                                                const MaxPool2dParams&) override {
    return {};
  }
  Status conv2d_forward_fused(View, View, View, View, View, View, View,
                              const Conv2dParams&) override {
    return {};
  }
  Status conv2d_backward_weight_fused(View, View, View, View, View, const Conv2dParams&) override {
    return {};
  }
  Status conv2d_backward_data_add_relu(View, View, View, View, View, const Conv2dParams&) override {
    return {};
  }
  Status batch_norm_finalize(const BatchNormFinalize&) override { return {}; }
  Status batch_norm_apply(View, View, View, View, View, View, View, bool) override { return {}; }
  Status batch_norm_apply_add(View, View, View, View, View, View, View, View, View, View,
                              View) override {
    return {};
  }
  Status relu_backward_add(View, View, View, View) override { return {}; }
  Status relu_forward(View, View) override { return {}; }
  Status relu_backward(View, View, View) override { return {}; }
  Status max_pool2d_forward(View, View, const MaxPool2dParams&) override { return {}; }
  Status max_pool2d_backward(View, View, View, View, const MaxPool2dParams&) override { return {}; }
  Status add(View, View, View) override { return {}; }
  Status global_avg_pool_forward(View, View) override { return {}; }
  Status global_avg_pool_backward(View, View) override { return {}; }
  Status linear_forward(View, View, View, View) override { return {}; }
  Status linear_backward(View, View, View, View, View, View) override { return {}; }
  Status cross_entropy_forward(View, View, View) override { return {}; }
  Status cross_entropy_backward(View, View, View, View) override { return {}; }
  Status unscale_gradients(std::span<const TensorView>, View, View) override { return {}; }
  Status sgd_step(std::span<const OptimizerSlot>, const SgdParams&, View, View) override {
    return {};
  }
  Status adamw_step(std::span<const OptimizerSlot>, const AdamWParams&, View, View) override {
    return {};
  }
  Status advance_step(View, const GradScalerOptions*, View) override { return {}; }

 private:
  bool fuses_;
  bool fuses_conv_;
  bool recomputes_pool_;
  bool fuses_pool_backward_;
};

}  // namespace

std::unique_ptr<Backend> make_dry_backend(bool fuses, bool fuses_conv, bool recomputes_pool,
                                          bool fuses_pool_backward) {
  return std::make_unique<DryBackend>(fuses, fuses_conv, recomputes_pool, fuses_pool_backward);
}

}  // namespace dlprobe::memory
