// The names of the step's choices and call kinds, as results and call lists print them, and the
// parsers that read them back.
#include <fmt/format.h>

#include <string>

#include "dlprobe/core/named.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/step_plan.h"

namespace dlprobe::engine {
namespace {

constexpr Named<Precision> kPrecisions[] = {{Precision::fp32, "fp32"},
                                            {Precision::tf32, "tf32"},
                                            {Precision::fp16, "fp16"},
                                            {Precision::bf16, "bf16"},
                                            {Precision::fp64, "fp64"}};
constexpr Named<StepMode> kModes[] = {
    {StepMode::train, "train"}, {StepMode::grads, "grads"}, {StepMode::infer, "infer"}};
constexpr Named<OptimizerKind> kOptimizers[] = {{OptimizerKind::sgd, "sgd"},
                                                {OptimizerKind::adamw, "adamw"}};
constexpr Named<MemoryPlan> kMemoryPlans[] = {{MemoryPlan::dynamic, "dynamic"},
                                              {MemoryPlan::planned, "planned"}};

}  // namespace

Result<Precision> parse_precision(std::string_view text) {
  return parse_named(kPrecisions, text, "precision");
}
Result<StepMode> parse_step_mode(std::string_view text) {
  return parse_named(kModes, text, "mode");
}
Result<OptimizerKind> parse_optimizer(std::string_view text) {
  return parse_named(kOptimizers, text, "optimizer");
}

std::string_view precision_name(Precision p) {
  return name_of(kPrecisions, p);
}
std::string_view step_mode_name(StepMode m) {
  return name_of(kModes, m);
}
std::string_view optimizer_name(OptimizerKind o) {
  return name_of(kOptimizers, o);
}
std::string_view memory_plan_name(MemoryPlan p) {
  return name_of(kMemoryPlans, p);
}

DType activation_dtype(Precision p) {
  switch (p) {
    case Precision::fp16:
      return DType::fp16;
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp64:
      return DType::fp64;
    case Precision::fp32:
    case Precision::tf32:
      return DType::fp32;
  }
  return DType::fp32;
}

DType master_dtype(Precision p) {
  return p == Precision::fp64 ? DType::fp64 : DType::fp32;
}

std::string_view call_kind_name(CallKind kind) {
  switch (kind) {
    case CallKind::alloc:
      return "alloc";
    case CallKind::free:
      return "free";
    case CallKind::fill:
      return "fill";
    case CallKind::cast:
      return "cast";
    case CallKind::conv_forward:
      return "conv_forward";
    case CallKind::conv_backward_data:
      return "conv_backward_data";
    case CallKind::conv_backward_weight:
      return "conv_backward_weight";
    case CallKind::conv_forward_fused:
      return "conv_forward_fused";
    case CallKind::conv_backward_weight_fused:
      return "conv_backward_weight_fused";
    case CallKind::conv_backward_data_add_relu:
      return "conv_backward_data_add_relu";
    case CallKind::batch_norm_apply:
      return "batch_norm_apply";
    case CallKind::batch_norm_apply_add:
      return "batch_norm_apply_add";
    case CallKind::batch_norm_train_forward:
      return "batch_norm_train_forward";
    case CallKind::batch_norm_inference_forward:
      return "batch_norm_inference_forward";
    case CallKind::batch_norm_backward:
      return "batch_norm_backward";
    case CallKind::batch_norm_add_backward:
      return "batch_norm_add_backward";
    case CallKind::batch_norm_relu_train_forward:
      return "batch_norm_relu_train_forward";
    case CallKind::batch_norm_relu_inference_forward:
      return "batch_norm_relu_inference_forward";
    case CallKind::batch_norm_relu_backward:
      return "batch_norm_relu_backward";
    case CallKind::batch_norm_relu_max_pool_train_forward:
      return "batch_norm_relu_max_pool_train_forward";
    case CallKind::batch_norm_relu_max_pool_backward:
      return "batch_norm_relu_max_pool_backward";
    case CallKind::relu_forward:
      return "relu_forward";
    case CallKind::relu_backward:
      return "relu_backward";
    case CallKind::relu_backward_add:
      return "relu_backward_add";
    case CallKind::max_pool_forward:
      return "max_pool_forward";
    case CallKind::max_pool_backward:
      return "max_pool_backward";
    case CallKind::add:
      return "add";
    case CallKind::global_avg_pool_forward:
      return "global_avg_pool_forward";
    case CallKind::global_avg_pool_backward:
      return "global_avg_pool_backward";
    case CallKind::linear_forward:
      return "linear_forward";
    case CallKind::linear_backward:
      return "linear_backward";
    case CallKind::cross_entropy_forward:
      return "cross_entropy_forward";
    case CallKind::cross_entropy_backward:
      return "cross_entropy_backward";
    case CallKind::unscale_gradients:
      return "unscale_gradients";
    case CallKind::sgd_step:
      return "sgd_step";
    case CallKind::adamw_step:
      return "adamw_step";
    case CallKind::advance_step:
      return "advance_step";
  }
  return "?";
}

}  // namespace dlprobe::engine
