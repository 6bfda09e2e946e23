// The optimizers' per-element formulas on the host, one copy for the reference functions, the
// reference backend's in-place path and the oneDNN backend's loops, so that all three compute the
// same expressions in the same order as torch.optim's single-tensor implementation (the CUDA
// kernels write the same terms in their device form). T is the compute type, float or double.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "dlprobe/engine/ops.h"

namespace dlprobe::host_optimizer {

// torch.lerp's formula: from whichever end is nearer the weight, which keeps lerp(a, b, 1) == b.
template <class T>
T lerp(T self, T end, T weight) {
  const T diff = end - self;
  return std::abs(weight) < T{0.5} ? self + weight * diff : end - diff * (T{1} - weight);
}

// torch.optim.SGD's step for one element.
template <class T>
class Sgd {
 public:
  explicit Sgd(const SgdParams& p)
      : p_(p),
        lr_(static_cast<T>(p.lr)),
        wd_(static_cast<T>(p.weight_decay)),
        momentum_(static_cast<T>(p.momentum)),
        dampening_(static_cast<T>(p.dampening)) {}

  bool uses_momentum() const { return p_.momentum != 0.0; }

  // Updates `w` from its gradient `g`. With momentum, `buf` is the element's momentum buffer,
  // which the first step (`first`) sets to the gradient instead of reading; without, it is
  // neither read nor written.
  void update(T& w, T& buf, T g, bool first) const {
    T d = g;
    if (p_.weight_decay != 0.0) d = d + wd_ * w;
    if (uses_momentum()) {
      // The first step copies the gradient: no dampening on it, as torch.optim.SGD does.
      buf = first ? d : momentum_ * buf + (T{1} - dampening_) * d;
      d = p_.nesterov ? d + momentum_ * buf : buf;
    }
    w = w - lr_ * d;
  }

 private:
  SgdParams p_;
  T lr_, wd_, momentum_, dampening_;
};

// torch.optim.AdamW's step `step` (1 for the first) for one element.
template <class T>
class AdamW {
 public:
  // The per-step scalars are Python floats (double) in torch.optim; they meet the tensors in T.
  AdamW(const AdamWParams& p, std::int64_t step)
      : step_size_(static_cast<T>(p.lr / (1.0 - std::pow(p.beta1, static_cast<double>(step))))),
        bias_correction2_sqrt_(
            static_cast<T>(std::sqrt(1.0 - std::pow(p.beta2, static_cast<double>(step))))),
        decay_(static_cast<T>(1.0 - p.lr * p.weight_decay)),
        weight1_(static_cast<T>(1.0 - p.beta1)),
        beta2_(static_cast<T>(p.beta2)),
        weight2_(static_cast<T>(1.0 - p.beta2)),
        eps_(static_cast<T>(p.eps)) {}

  // Updates `w` and its moments `m` (exp_avg) and `v` (exp_avg_sq) from its gradient `g`. The
  // first step starts both moments from zero: the caller passes them as 0.
  void update(T& w, T& m, T& v, T g) const {
    w = w * decay_;
    m = lerp(m, g, weight1_);  // exp_avg.lerp_(grad, 1 - beta1)
    v = v * beta2_ + weight2_ * g * g;
    const T denom = std::sqrt(v) / bias_correction2_sqrt_ + eps_;
    w = w - step_size_ * m / denom;
  }

 private:
  T step_size_, bias_correction2_sqrt_, decay_, weight1_, beta2_, weight2_, eps_;
};

// A host backend's step counters (in host memory, checked by step_counters_check), copied in
// and out as bytes: they were written as an array of doubles.
inline StepCounters read_counters(const TensorView& counters) {
  StepCounters c;
  std::memcpy(&c, counters.data, sizeof c);
  return c;
}
// advance_step_counters over the counters in place.
inline void advance_counters(const TensorView& counters, bool found_inf,
                             const GradScalerOptions* scaler) {
  StepCounters c = read_counters(counters);
  advance_step_counters(c, found_inf, scaler);
  std::memcpy(counters.data, &c, sizeof c);
}
// The loss scale the loss's gradient takes: the counters' where the step passes them, 1 where it
// passes none (no scaling); bad counters are an error naming `op`.
inline Result<double> loss_scale_of(std::string_view op, const TensorView& counters) {
  if (counters.data == nullptr) return 1.0;
  DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
  return read_counters(counters).loss_scale;
}
// The optimizer step that `counters` is at (1 for the first).
inline std::int64_t step_of(const TensorView& counters) {
  return static_cast<std::int64_t>(read_counters(counters).steps_taken) + 1;
}

}  // namespace dlprobe::host_optimizer
