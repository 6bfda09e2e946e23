// The training engine's operations as every backend sees them: one parameter struct per op and a
// shape check that validates inputs and gives the output shape, or a one-line error saying why
// not. They are public (not engine-internal) because more than the backends need them: the step
// planner sizes every buffer from them, the memory module estimates activations with them, and the
// CLI must refuse an image size the model cannot take before any backend starts. Each backend
// (reference, oneDNN, CUDA) implements the ops with these structs, so a test can run one op on two
// backends from the same parameters.
//
// Semantics follow PyTorch (torch.nn.functional / torch.optim); docs/engine.md lists them.
// Shapes are logical: activations N, C, H, W; conv weights K, C/groups, R, S.
#pragma once

#include <array>
#include <cstdint>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/tensor.h"

namespace dlprobe {

// Pairs are {height, width}.
struct Conv2dParams {
  std::array<std::int64_t, 2> stride{1, 1};
  std::array<std::int64_t, 2> pad{0, 0};
  std::array<std::int64_t, 2> dilation{1, 1};
  std::int64_t groups = 1;
};
// x [N, C, H, W], w [K, C/groups, R, S] -> y [N, K, P, Q]. No bias: ResNet's convs have none.
Result<Shape> conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p);

struct BatchNormParams {
  double eps = 1e-5;
  double momentum = 0.1;  // PyTorch's: new = (1 - momentum) * old + momentum * batch statistic
};
// x [N, C, H, W] and the per-channel tensors (gamma, beta, running stats) [C]. Training needs more
// than one value per channel (the unbiased variance divides by N*H*W - 1), as PyTorch does.
Status batch_norm_check(const Shape& x, const Shape& channel, const BatchNormParams& p,
                        bool training);

// Max pooling (ceil_mode false, dilation 1); ResNet's stem pool is the default 3x3, stride 2,
// pad 1.
struct MaxPool2dParams {
  std::array<std::int64_t, 2> kernel{3, 3};
  std::array<std::int64_t, 2> stride{2, 2};
  std::array<std::int64_t, 2> pad{1, 1};
};
Result<Shape> max_pool2d_output_shape(const Shape& x, const MaxPool2dParams& p);

// Adaptive average pooling to 1x1 followed by flatten: x [N, C, H, W] -> [N, C].
Result<Shape> global_avg_pool_output_shape(const Shape& x);

// Fully connected, PyTorch's nn.Linear: x [N, IN], w [OUT, IN], b [OUT] -> y = x w^T + b [N, OUT].
Result<Shape> linear_output_shape(const Shape& x, const Shape& w, const Shape& b);

// Elementwise ops (ReLU, residual add): both operands of one logical shape.
Status same_shape_check(std::string_view op, const Shape& a, const Shape& b);

// Softmax cross-entropy with mean reduction over integer class labels: logits [N, K], labels [N]
// -> loss [1]. No ignore_index and no label smoothing: a label outside [0, K) is an error.
Result<Shape> cross_entropy_output_shape(const Shape& logits, const Shape& labels);

// torch.optim.SGD (maximize=False). The first step with momentum sets the buffer to the gradient
// (after weight decay); later steps do buf = momentum * buf + (1 - dampening) * g.
struct SgdParams {
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};
// PyTorch's own refusals: negative lr, momentum or weight decay; nesterov without momentum or
// with dampening.
Status sgd_check(const SgdParams& p);

// torch.optim.AdamW (amsgrad=False, maximize=False): decoupled weight decay p *= 1 - lr * wd
// before the Adam update, with bias correction.
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};
Status adamw_check(const AdamWParams& p);

// torch.cuda.amp.GradScaler's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};
// GradScaler's own constraints.
Status grad_scaler_check(const GradScalerOptions& g);

// A training step's counters, kept where the step runs (a backend tensor of four fp64; the counts
// are exact to 2^53) and read by the calls that need them when they run, as torch's GradScaler
// keeps its scale and growth tracker on the GPU and a capturable optimizer its step count: a
// replayed CUDA graph reads the values of the moment, and no step waits for the host to learn
// whether the last one overflowed.
struct StepCounters {
  double loss_scale = 1.0;       // what the loss's gradient is multiplied by (1 without scaling)
  double last_loss_scale = 1.0;  // the scale of the last step's gradients
  double growth_tracker = 0.0;   // clean steps in a row since the scale last changed
  double steps_taken = 0.0;      // optimizer steps taken; skipped ones do not count
};
// The backend tensor a StepCounters lives in.
TensorDesc step_counters_desc();
// `counters` is such a tensor with data.
Status step_counters_check(std::string_view op, const TensorView& counters);

// After an optimizer call: the step is counted and, under a loss scaler (`scaler` non-null), its
// scale updated as GradScaler.update does: backed off where the step's gradients held inf/NaN
// (`found_inf`; the step was skipped and is not counted), grown after growth_interval clean
// steps in a row where the grown scale is finite.
void advance_step_counters(StepCounters& c, bool found_inf, const GradScalerOptions* scaler);

}  // namespace dlprobe
