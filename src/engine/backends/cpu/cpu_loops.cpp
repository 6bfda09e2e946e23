#include "engine/backends/cpu/cpu_loops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/backends/host_optimizer.h"

namespace dlprobe::cpu {
namespace {

inline float to_float(float v) {
  return v;
}
inline float to_float(BFloat16 v) {
  return bf16_to_float(v);
}
template <class E>
E from_float(float v);
template <>
float from_float<float>(float v) {
  return v;
}
template <>
BFloat16 from_float<BFloat16>(float v) {
  return float_to_bf16(v);
}

template <class E>
void fill_as(const TensorView& t, E value) {
  auto* d = static_cast<E*>(t.data);
  std::fill(d, d + t.desc.numel(), value);
}

// ReLU is written here because oneDNN 2.6's JIT eltwise differs from PyTorch on NaN, and a NaN
// changed there changes what the loss scaler's inf/NaN check sees: its forward turns NaN into 0
// (a max with zero) where torch.relu lets it through, and its backward multiplies dy by the mask
// (NaN * 0 = NaN) where threshold_backward selects 0.
template <class E>
void relu_forward_as(const TensorView& x, const TensorView& y) {
  const auto* in = static_cast<const E*>(x.data);
  auto* o = static_cast<E*>(y.data);
  const std::int64_t count = x.desc.numel();
#pragma omp parallel for simd
  for (std::int64_t i = 0; i < count; ++i) {
    const float v = to_float(in[i]);
    o[i] = from_float<E>(v < 0.0f ? 0.0f : v);
  }
}

// PyTorch's threshold_backward(dy, y, 0): y <= 0 ? 0 : dy. A NaN y passes the gradient.
template <class E>
void relu_backward_as(const TensorView& dy, const TensorView& y, const TensorView& dx) {
  const auto* g = static_cast<const E*>(dy.data);
  const auto* out = static_cast<const E*>(y.data);
  auto* d = static_cast<E*>(dx.data);
  const std::int64_t count = dy.desc.numel();
  // dy is read unconditionally so that the select compiles to a vector blend: a load under the
  // condition kept the loop scalar and branching on the sign of y, about half mispredicted.
#pragma omp parallel for simd
  for (std::int64_t i = 0; i < count; ++i) {
    const E grad = g[i];
    d[i] = to_float(out[i]) <= 0.0f ? E{} : grad;
  }
}

// y = relu(y + residual) in place, or relu(y) when the residual has no data: the rest of a fused
// batch norm after oneDNN's. Same NaN rule as relu_forward_as.
template <class E>
void add_relu_in_place_as(const TensorView& y, const TensorView& residual) {
  auto* o = static_cast<E*>(y.data);
  const auto* r = static_cast<const E*>(residual.data);
  const std::int64_t count = y.desc.numel();
  if (r == nullptr) {
#pragma omp parallel for simd
    for (std::int64_t i = 0; i < count; ++i) {
      const float v = to_float(o[i]);
      o[i] = from_float<E>(v < 0.0f ? 0.0f : v);
    }
    return;
  }
#pragma omp parallel for simd
  for (std::int64_t i = 0; i < count; ++i) {
    const float v = to_float(o[i]) + to_float(r[i]);
    o[i] = from_float<E>(v < 0.0f ? 0.0f : v);
  }
}

// dx = y <= 0 ? 0 : a + b (threshold_backward of the sum), one pass; dx may alias any input.
template <class E>
void relu_backward_add_as(const TensorView& a, const TensorView& b, const TensorView& y,
                          const TensorView& dx) {
  const auto* as = static_cast<const E*>(a.data);
  const auto* bs = static_cast<const E*>(b.data);
  const auto* out = static_cast<const E*>(y.data);
  auto* d = static_cast<E*>(dx.data);
  const std::int64_t count = dx.desc.numel();
#pragma omp parallel for simd
  for (std::int64_t i = 0; i < count; ++i) {
    const float sum = to_float(as[i]) + to_float(bs[i]);
    d[i] = to_float(out[i]) <= 0.0f ? E{} : from_float<E>(sum);
  }
}

// oneDNN's pooling_max differs from PyTorch where it matters to a comparison with it: it starts
// each window from the lowest finite float (an all -inf window gives -3.4e38, not -inf) and its
// `>` comparison drops NaN (PyTorch propagates it). So max pooling is written here: start from
// -inf, move on a strictly greater value or a NaN, and in backward route the gradient to the first
// maximum of the window, as PyTorch's CPU kernel does.
struct WindowMax {
  float value;
  std::int64_t h, w;
};

// The first maximum of output window (oh, ow) in plane (n, c) of x, and where it is.
template <class E>
WindowMax window_max(const TensorView& x, const MaxPool2dParams& p, std::int64_t n, std::int64_t c,
                     std::int64_t oh, std::int64_t ow) {
  const auto* xs = static_cast<const E*>(x.data);
  const TensorDesc& xd = x.desc;
  const std::int64_t h0 = oh * p.stride[0] - p.pad[0];
  const std::int64_t w0 = ow * p.stride[1] - p.pad[1];
  // An all -inf window keeps its first in-bounds element, as PyTorch's does.
  WindowMax best{-std::numeric_limits<float>::infinity(), std::max<std::int64_t>(h0, 0),
                 std::max<std::int64_t>(w0, 0)};
  for (std::int64_t h = best.h; h < std::min(h0 + p.kernel[0], xd.dim(2)); ++h)
    for (std::int64_t w = std::max<std::int64_t>(w0, 0); w < std::min(w0 + p.kernel[1], xd.dim(3));
         ++w) {
      const float v = to_float(xs[xd.offset(n, c, h, w)]);
      if (v > best.value || std::isnan(v)) best = {v, h, w};
    }
  return best;
}

// Calls f(offset of the output in y's storage, n, c, its window's maximum) for every output of
// pooling x into the shape `yd`. The (n, c) planes run in parallel: each reads and writes only its
// own plane.
template <class E, class F>
void for_each_window(const TensorView& x, const TensorDesc& yd, const MaxPool2dParams& p, F&& f) {
#pragma omp parallel for collapse(2)
  for (std::int64_t n = 0; n < yd.dim(0); ++n)
    for (std::int64_t c = 0; c < yd.dim(1); ++c)
      for (std::int64_t oh = 0; oh < yd.dim(2); ++oh)
        for (std::int64_t ow = 0; ow < yd.dim(3); ++ow)
          f(yd.offset(n, c, oh, ow), n, c, window_max<E>(x, p, n, c, oh, ow));
}

// Channels-last pooling (x and y with unit channel stride, as NHWC is): per output position the
// window is walked once for all channels, the inner loop running over contiguous channels. The
// generic loop above walks each (n, c) plane with a stride of C elements, which on NHWC reads a
// cache line per element. Same rule per channel: start from -inf at the first in-bounds element,
// move on a strictly greater value or a NaN. `f(n, oh, ow, best, best_hw)` gets each output
// position's per-channel maxima and, with `kWhere` (backward), where they are as h * W + w.
template <class E, bool kWhere, class F>
void for_each_position_channels_last(const TensorView& x, const TensorDesc& yd,
                                     const MaxPool2dParams& p, F&& f) {
  const auto* xs = static_cast<const E*>(x.data);
  const TensorDesc& xd = x.desc;
  const std::int64_t channels = yd.dim(1);
#pragma omp parallel
  {
    std::vector<float> best(static_cast<std::size_t>(channels));
    std::vector<std::int64_t> best_hw(kWhere ? best.size() : 0);
    const auto position = [&](std::int64_t n, std::int64_t oh, std::int64_t ow) {
      const std::int64_t h0 = oh * p.stride[0] - p.pad[0];
      const std::int64_t w0 = ow * p.stride[1] - p.pad[1];
      const std::int64_t h_begin = std::max<std::int64_t>(h0, 0);
      const std::int64_t w_begin = std::max<std::int64_t>(w0, 0);
      std::fill(best.begin(), best.end(), -std::numeric_limits<float>::infinity());
      std::fill(best_hw.begin(), best_hw.end(), h_begin * xd.dim(3) + w_begin);
      for (std::int64_t h = h_begin; h < std::min(h0 + p.kernel[0], xd.dim(2)); ++h)
        for (std::int64_t w = w_begin; w < std::min(w0 + p.kernel[1], xd.dim(3)); ++w) {
          const E* in = xs + xd.offset(n, 0, h, w);
          if constexpr (kWhere) {
            const std::int64_t hw = h * xd.dim(3) + w;
#pragma omp simd
            for (std::int64_t c = 0; c < channels; ++c) {
              const float v = to_float(in[c]);
              const bool take = v > best[c] || std::isnan(v);
              best[c] = take ? v : best[c];
              best_hw[c] = take ? hw : best_hw[c];
            }
          } else {
#pragma omp simd
            for (std::int64_t c = 0; c < channels; ++c) {
              const float v = to_float(in[c]);
              best[c] = v > best[c] || std::isnan(v) ? v : best[c];
            }
          }
        }
      f(n, oh, ow, best, best_hw);
    };
    if constexpr (!kWhere) {
#pragma omp for collapse(2)
      for (std::int64_t n = 0; n < yd.dim(0); ++n)
        for (std::int64_t oh = 0; oh < yd.dim(2); ++oh)
          for (std::int64_t ow = 0; ow < yd.dim(3); ++ow) position(n, oh, ow);
    } else {
      // Windows overlap, so in backward two positions of one sample can add into one dx element:
      // only samples run in parallel.
#pragma omp for
      for (std::int64_t n = 0; n < yd.dim(0); ++n)
        for (std::int64_t oh = 0; oh < yd.dim(2); ++oh)
          for (std::int64_t ow = 0; ow < yd.dim(3); ++ow) position(n, oh, ow);
    }
  }
}

bool channels_last(const TensorDesc& d) {
  return d.stride(1) == 1;
}

template <class E>
void max_pool_forward_as(const TensorView& x, const TensorView& y, const MaxPool2dParams& p) {
  auto* ys = static_cast<E*>(y.data);
  if (channels_last(x.desc) && channels_last(y.desc)) {
    for_each_position_channels_last<E, false>(
        x, y.desc, p,
        [&](std::int64_t n, std::int64_t oh, std::int64_t ow, const std::vector<float>& best,
            const std::vector<std::int64_t>&) {
          E* out = ys + y.desc.offset(n, 0, oh, ow);
          for (std::size_t c = 0; c < best.size(); ++c) out[c] = from_float<E>(best[c]);
        });
    return;
  }
  for_each_window<E>(x, y.desc, p,
                     [&](std::int64_t at, std::int64_t, std::int64_t, const WindowMax& best) {
                       ys[at] = from_float<E>(best.value);
                     });
}

// Calls add(offset of the first maximum in dx's storage, dy value) for every dy element.
template <class E, class Add>
void max_pool_backward_as(const TensorView& dy, const TensorView& x, const TensorView& dx,
                          const MaxPool2dParams& p, Add&& add) {
  const auto* dys = static_cast<const E*>(dy.data);
  if (channels_last(x.desc) && channels_last(dy.desc) && channels_last(dx.desc)) {
    const std::int64_t width = x.desc.dim(3);
    for_each_position_channels_last<E, true>(
        x, dy.desc, p,
        [&](std::int64_t n, std::int64_t oh, std::int64_t ow, const std::vector<float>&,
            const std::vector<std::int64_t>& best_hw) {
          const E* g = dys + dy.desc.offset(n, 0, oh, ow);
          for (std::size_t c = 0; c < best_hw.size(); ++c) {
            const auto ci = static_cast<std::int64_t>(c);
            add(dx.desc.offset(n, ci, best_hw[c] / width, best_hw[c] % width), to_float(g[c]));
          }
        });
    return;
  }
  for_each_window<E>(x, dy.desc, p,
                     [&](std::int64_t at, std::int64_t n, std::int64_t c, const WindowMax& best) {
                       add(dx.desc.offset(n, c, best.h, best.w), to_float(dys[at]));
                     });
}

std::int64_t label_at(const TensorView& labels, std::int64_t n) {
  const std::int64_t i = labels.desc.offset(n);
  return labels.desc.dtype() == DType::int32 ? static_cast<const std::int32_t*>(labels.data)[i]
                                             : static_cast<const std::int64_t*>(labels.data)[i];
}

Status check_labels(std::string_view op, const TensorView& labels, std::int64_t classes) {
  for (std::int64_t n = 0; n < labels.desc.dim(0); ++n) {
    const std::int64_t label = label_at(labels, n);
    if (label < 0 || label >= classes) {
      return invalid_argument(fmt::format(
          "cpu backend: {}: label {} of sample {} is outside [0, {})", op, label, n, classes));
    }
  }
  return Status::ok();
}

// log(sum_k exp(z_k)) of one row, shifted by its maximum so that no exp overflows. The sum is in
// double: K is at most a few thousand per row, and it keeps the loss as exact as the fp32 logits.
double log_sum_exp(const float* row, std::int64_t classes) {
  const float max = *std::max_element(row, row + classes);
  double sum = 0;
  for (std::int64_t k = 0; k < classes; ++k) sum += std::exp(static_cast<double>(row[k]) - max);
  return max + std::log(sum);
}

float* floats(const TensorView& t) {
  return static_cast<float*>(t.data);
}

}  // namespace

Status fill(const TensorView& t, double value) {
  switch (t.desc.dtype()) {
    case DType::fp64:
      fill_as<double>(t, value);
      return Status::ok();
    case DType::fp32:
      fill_as<float>(t, static_cast<float>(value));
      return Status::ok();
    case DType::bf16:
      fill_as<BFloat16>(t, float_to_bf16(static_cast<float>(value)));
      return Status::ok();
    case DType::fp16:
      fill_as<Half>(t, float_to_half(static_cast<float>(value)));
      return Status::ok();
    case DType::int32:
    case DType::int64:
      break;
  }
  return invalid_argument(
      fmt::format("cpu backend: fill: {} is not a floating dtype", dtype_name(t.desc.dtype())));
}

void relu_forward(const TensorView& x, const TensorView& y) {
  if (x.desc.dtype() == DType::bf16) {
    relu_forward_as<BFloat16>(x, y);
  } else {
    relu_forward_as<float>(x, y);
  }
}

void relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx) {
  if (dy.desc.dtype() == DType::bf16) {
    relu_backward_as<BFloat16>(dy, y, dx);
  } else {
    relu_backward_as<float>(dy, y, dx);
  }
}

void add_relu_in_place(const TensorView& y, const TensorView& residual) {
  if (y.desc.dtype() == DType::bf16) {
    add_relu_in_place_as<BFloat16>(y, residual);
  } else {
    add_relu_in_place_as<float>(y, residual);
  }
}

void relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                       const TensorView& dx) {
  if (dx.desc.dtype() == DType::bf16) {
    relu_backward_add_as<BFloat16>(a, b, y, dx);
  } else {
    relu_backward_add_as<float>(a, b, y, dx);
  }
}

void max_pool2d_forward(const TensorView& x, const TensorView& y, const MaxPool2dParams& p) {
  if (x.desc.dtype() == DType::bf16) {
    max_pool_forward_as<BFloat16>(x, y, p);
  } else {
    max_pool_forward_as<float>(x, y, p);
  }
}

void max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& dx,
                         const MaxPool2dParams& p, std::span<float> accum) {
  if (dx.desc.dtype() == DType::bf16) {
    // Windows overlap, so one dx element can collect several dy values: sum them in fp32 and
    // round once, as PyTorch's bf16 kernel accumulates in float.
    std::fill(accum.begin(), accum.end(), 0.0f);
    max_pool_backward_as<BFloat16>(dy, x, dx, p, [&](std::int64_t i, float g) { accum[i] += g; });
    auto* d = static_cast<BFloat16*>(dx.data);
    for (std::size_t i = 0; i < accum.size(); ++i) d[i] = float_to_bf16(accum[i]);
  } else {
    float* d = floats(dx);
    std::fill(d, d + dx.desc.numel(), 0.0f);
    max_pool_backward_as<float>(dy, x, dx, p, [&](std::int64_t i, float g) { d[i] += g; });
  }
}

Status cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                             const TensorView& loss) {
  const std::int64_t batch = logits.desc.dim(0);
  const std::int64_t classes = logits.desc.dim(1);
  DLPROBE_RETURN_IF_ERROR(check_labels("cross_entropy_forward", labels, classes));
  const float* z = floats(logits);
  double sum = 0;
  for (std::int64_t n = 0; n < batch; ++n) {
    const float* row = z + logits.desc.offset(n, 0);
    sum += log_sum_exp(row, classes) - row[label_at(labels, n)];
  }
  floats(loss)[0] = static_cast<float>(sum / static_cast<double>(batch));
  return Status::ok();
}

Status cross_entropy_backward(const TensorView& logits, const TensorView& labels, double loss_scale,
                              const TensorView& dlogits) {
  const std::int64_t batch = logits.desc.dim(0);
  const std::int64_t classes = logits.desc.dim(1);
  DLPROBE_RETURN_IF_ERROR(check_labels("cross_entropy_backward", labels, classes));
  const double scale = loss_scale / static_cast<double>(batch);
  for (std::int64_t n = 0; n < batch; ++n) {
    const float* row = floats(logits) + logits.desc.offset(n, 0);
    float* out = floats(dlogits) + dlogits.desc.offset(n, 0);
    const double lse = log_sum_exp(row, classes);
    const std::int64_t label = label_at(labels, n);
    for (std::int64_t k = 0; k < classes; ++k) {
      const double softmax = std::exp(static_cast<double>(row[k]) - lse);
      out[k] = static_cast<float>((softmax - (k == label ? 1.0 : 0.0)) * scale);
    }
  }
  return Status::ok();
}

void unscale_gradients(std::span<const TensorView> grads, double inv_scale,
                       const TensorView& found_inf) {
  // Multiplied in fp32 by the fp32 scale, as torch's _amp_foreach_non_finite_check_and_unscale_.
  const auto inv = static_cast<float>(inv_scale);
  bool found = false;
  for (const TensorView& g : grads) {
    float* d = floats(g);
    for (std::int64_t i = 0; i < g.desc.numel(); ++i) {
      if (!std::isfinite(d[i])) found = true;
      d[i] *= inv;
    }
  }
  if (found) floats(found_inf)[0] = 1.0f;
}

bool step_skipped(const TensorView& found_inf) {
  return found_inf.data != nullptr && floats(found_inf)[0] != 0.0f;
}

void sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p, std::int64_t step) {
  const host_optimizer::Sgd<float> sgd(p);
  const bool first = step == 1;
  // Elements are independent: each thread takes a share of every parameter (nowait: no barrier
  // between parameters), the same arithmetic per element as one thread.
#pragma omp parallel
  for (const OptimizerSlot& slot : slots) {
    float* w = floats(slot.param);
    const float* g = floats(slot.grad);
    float* buf = floats(slot.state0);
    float no_buffer = 0.0f;
#pragma omp for nowait
    for (std::int64_t i = 0; i < slot.param.desc.numel(); ++i) {
      sgd.update(w[i], sgd.uses_momentum() ? buf[i] : no_buffer, g[i], first);
    }
  }
}

void adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p, std::int64_t step) {
  const host_optimizer::AdamW<float> adamw(p, step);
  const bool first = step == 1;
#pragma omp parallel
  for (const OptimizerSlot& slot : slots) {
    float* w = floats(slot.param);
    const float* g = floats(slot.grad);
    float* m = floats(slot.state0);
    float* v = floats(slot.state1);
#pragma omp for nowait
    for (std::int64_t i = 0; i < slot.param.desc.numel(); ++i) {
      if (first) {
        m[i] = 0.0f;
        v[i] = 0.0f;
      }
      adamw.update(w[i], m[i], v[i], g[i]);
    }
  }
}

}  // namespace dlprobe::cpu
