#include "engine/backends/reference/reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/backends/host_optimizer.h"

namespace dlprobe::reference {
namespace {

template <class T>
Status need_dtype(std::string_view op, std::string_view what, DType dtype) {
  if (dtype == dtype_of<T>) return Status::ok();
  return invalid_argument(fmt::format("{}: {} is {} but the compute type is {}", op, what,
                                      dtype_name(dtype), dtype_name(dtype_of<T>)));
}

// The operands' dtypes by name, checked in order.
template <class T>
Status need_dtypes(std::string_view op,
                   std::initializer_list<std::pair<std::string_view, DType>> operands) {
  for (const auto& [what, dtype] : operands)
    DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, what, dtype));
  return Status::ok();
}

Status need_labels(std::string_view op, const HostTensor& labels, std::int64_t classes) {
  if (labels.dtype() != DType::int32 && labels.dtype() != DType::int64) {
    return invalid_argument(
        fmt::format("{}: labels must be int32 or int64, got {}", op, dtype_name(labels.dtype())));
  }
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    const double label = labels.get(i);
    if (label < 0 || label >= static_cast<double>(classes)) {
      return invalid_argument(
          fmt::format("{}: label {} of sample {} is outside [0, {})", op, label, i, classes));
    }
  }
  return Status::ok();
}

Status need_same_desc(std::string_view op, std::string_view what, const TensorDesc& got,
                      const TensorDesc& want) {
  if (got == want) return Status::ok();
  return invalid_argument(
      fmt::format("{}: {} is {}, expected {}", op, what, got.str(), want.str()));
}

Result<TensorDesc> output_desc(const Shape& shape, DType dtype, Layout layout) {
  return TensorDesc::make(shape, dtype, shape.rank == 4 ? layout : Layout::nchw);
}

// One term of a convolution's sum: output element (n, k, p, q) takes input element
// (n, ci, ih, iw) times weight (k, c, r, s), where ci is input channel c of output channel k's
// group. All three
// passes sum over exactly these terms, so they share the index arithmetic; taps that land in the
// zero padding contribute nothing and are skipped.
struct ConvTap {
  std::int64_t n, k, p, q, ci, c, r, s, ih, iw;
};

template <class F>
void for_each_conv_tap(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& prm,
                       F&& f) {
  const std::int64_t out_per_group = w[0] / prm.groups;
  for (std::int64_t n = 0; n < y[0]; ++n) {
    for (std::int64_t k = 0; k < y[1]; ++k) {
      const std::int64_t group = k / out_per_group;
      for (std::int64_t p = 0; p < y[2]; ++p) {
        for (std::int64_t q = 0; q < y[3]; ++q) {
          for (std::int64_t c = 0; c < w[1]; ++c) {
            for (std::int64_t r = 0; r < w[2]; ++r) {
              const std::int64_t h = p * prm.stride[0] - prm.pad[0] + r * prm.dilation[0];
              if (h < 0 || h >= x[2]) continue;
              for (std::int64_t s = 0; s < w[3]; ++s) {
                const std::int64_t wi = q * prm.stride[1] - prm.pad[1] + s * prm.dilation[1];
                if (wi < 0 || wi >= x[3]) continue;
                f(ConvTap{n, k, p, q, group * w[1] + c, c, r, s, h, wi});
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

template <class T>
Result<HostTensor> conv2d_forward(const HostTensor& x, const HostTensor& w, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_forward";
  DLPROBE_RETURN_IF_ERROR(need_dtypes<T>(op, {{"x", x.dtype()}, {"w", w.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, conv2d_output_shape(x.shape(), w.shape(), p));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc yd, output_desc(ys, dtype_of<T>, x.layout()));
  HostTensor y = HostTensor::zeros(yd);
  for_each_conv_tap(x.shape(), w.shape(), ys, p, [&](const ConvTap& t) {
    y.at<T>(t.n, t.k, t.p, t.q) += x.at<T>(t.n, t.ci, t.ih, t.iw) * w.at<T>(t.k, t.c, t.r, t.s);
  });
  return y;
}

template <class T>
Result<HostTensor> conv2d_backward_data(const HostTensor& dy, const HostTensor& w,
                                        const TensorDesc& x_desc, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_data";
  DLPROBE_RETURN_IF_ERROR(
      need_dtypes<T>(op, {{"dy", dy.dtype()}, {"w", w.dtype()}, {"dx", x_desc.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, conv2d_output_shape(x_desc.shape(), w.shape(), p));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), ys));
  HostTensor dx = HostTensor::zeros(x_desc);
  for_each_conv_tap(x_desc.shape(), w.shape(), ys, p, [&](const ConvTap& t) {
    dx.at<T>(t.n, t.ci, t.ih, t.iw) += dy.at<T>(t.n, t.k, t.p, t.q) * w.at<T>(t.k, t.c, t.r, t.s);
  });
  return dx;
}

template <class T>
Result<HostTensor> conv2d_backward_weight(const HostTensor& x, const HostTensor& dy,
                                          const TensorDesc& w_desc, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_weight";
  DLPROBE_RETURN_IF_ERROR(
      need_dtypes<T>(op, {{"x", x.dtype()}, {"dy", dy.dtype()}, {"dw", w_desc.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, conv2d_output_shape(x.shape(), w_desc.shape(), p));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), ys));
  HostTensor dw = HostTensor::zeros(w_desc);
  for_each_conv_tap(x.shape(), w_desc.shape(), ys, p, [&](const ConvTap& t) {
    dw.at<T>(t.k, t.c, t.r, t.s) += dy.at<T>(t.n, t.k, t.p, t.q) * x.at<T>(t.n, t.ci, t.ih, t.iw);
  });
  return dw;
}

namespace {

template <class T>
Status check_batch_norm(std::string_view op, const HostTensor& x,
                        std::initializer_list<const HostTensor*> channel, const BatchNormParams& p,
                        bool training) {
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, "x", x.dtype()));
  for (const HostTensor* t : channel) {
    DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, "a per-channel tensor", t->dtype()));
    DLPROBE_RETURN_IF_ERROR(batch_norm_check(x.shape(), t->shape(), p, training));
  }
  return Status::ok();
}

}  // namespace

template <class T>
Result<BatchNormTrainOutput> batch_norm_train_forward(const HostTensor& x, const HostTensor& gamma,
                                                      const HostTensor& beta,
                                                      const HostTensor& running_mean,
                                                      const HostTensor& running_var,
                                                      const BatchNormParams& p) {
  DLPROBE_RETURN_IF_ERROR(check_batch_norm<T>(
      "batch_norm_train_forward", x, {&gamma, &beta, &running_mean, &running_var}, p, true));
  const Shape& s = x.shape();
  const TensorDesc cd = gamma.desc();
  BatchNormTrainOutput out{HostTensor(x.desc()), HostTensor(cd), HostTensor(cd), HostTensor(cd),
                           HostTensor(cd)};
  const std::int64_t count = s[0] * s[2] * s[3];
  const T eps = static_cast<T>(p.eps);
  const T momentum = static_cast<T>(p.momentum);
  for (std::int64_t c = 0; c < s[1]; ++c) {
    // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels. The
    // sums accumulate in double whatever T, as PyTorch's CPU batch norm does: a serial fp32 sum
    // over a channel's values puts the statistics ~1e-6 off, which a ReLU decision downstream can
    // turn into per-cent gradient differences on a small network.
    double sum = 0;
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) sum += static_cast<double>(x.at<T>(n, c, h, w));
    const double mean_exact = sum / static_cast<double>(count);
    double sq = 0;
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) {
          const double d = static_cast<double>(x.at<T>(n, c, h, w)) - mean_exact;
          sq += d * d;
        }
    const auto mean = static_cast<T>(mean_exact);
    const auto var_biased = static_cast<T>(sq / static_cast<double>(count));
    const auto var_unbiased = static_cast<T>(sq / static_cast<double>(count - 1));
    const T invstd = T{1} / std::sqrt(var_biased + eps);
    const T g = gamma.at<T>(c);
    const T b = beta.at<T>(c);
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w)
          out.y.at<T>(n, c, h, w) = (x.at<T>(n, c, h, w) - mean) * invstd * g + b;
    out.save_mean.at<T>(c) = mean;
    out.save_invstd.at<T>(c) = invstd;
    out.running_mean.at<T>(c) = (T{1} - momentum) * running_mean.at<T>(c) + momentum * mean;
    out.running_var.at<T>(c) = (T{1} - momentum) * running_var.at<T>(c) + momentum * var_unbiased;
  }
  return out;
}

template <class T>
Result<HostTensor> batch_norm_inference_forward(const HostTensor& x, const HostTensor& gamma,
                                                const HostTensor& beta,
                                                const HostTensor& running_mean,
                                                const HostTensor& running_var,
                                                const BatchNormParams& p) {
  DLPROBE_RETURN_IF_ERROR(check_batch_norm<T>(
      "batch_norm_inference_forward", x, {&gamma, &beta, &running_mean, &running_var}, p, false));
  const Shape& s = x.shape();
  HostTensor y(x.desc());
  for (std::int64_t c = 0; c < s[1]; ++c) {
    const T invstd = T{1} / std::sqrt(running_var.at<T>(c) + static_cast<T>(p.eps));
    const T mean = running_mean.at<T>(c);
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w)
          y.at<T>(n, c, h, w) =
              (x.at<T>(n, c, h, w) - mean) * invstd * gamma.at<T>(c) + beta.at<T>(c);
  }
  return y;
}

template <class T>
Result<BatchNormGrads> batch_norm_backward(const HostTensor& dy, const HostTensor& x,
                                           const HostTensor& gamma, const HostTensor& save_mean,
                                           const HostTensor& save_invstd) {
  constexpr std::string_view op = "batch_norm_backward";
  DLPROBE_RETURN_IF_ERROR(
      check_batch_norm<T>(op, x, {&gamma, &save_mean, &save_invstd}, BatchNormParams{}, true));
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, "dy", dy.dtype()));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), x.shape()));
  const Shape& s = x.shape();
  const TensorDesc cd = gamma.desc();
  BatchNormGrads g{HostTensor(x.desc()), HostTensor(cd), HostTensor(cd)};
  const auto count = static_cast<T>(s[0] * s[2] * s[3]);
  for (std::int64_t c = 0; c < s[1]; ++c) {
    const T mean = save_mean.at<T>(c);
    const T invstd = save_invstd.at<T>(c);
    // Sums in double, as in the forward.
    double sum_dy_exact = 0;
    double sum_dy_xhat_exact = 0;
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) {
          const T d = dy.at<T>(n, c, h, w);
          sum_dy_exact += static_cast<double>(d);
          sum_dy_xhat_exact += static_cast<double>(d * (x.at<T>(n, c, h, w) - mean) * invstd);
        }
    const auto sum_dy = static_cast<T>(sum_dy_exact);
    const auto sum_dy_xhat = static_cast<T>(sum_dy_xhat_exact);
    // dx = gamma * invstd / M * (M * dy - sum(dy) - xhat * sum(dy * xhat)): the batch statistics
    // depend on every x, which gives the two subtracted terms.
    const T scale = gamma.at<T>(c) * invstd / count;
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) {
          const T xhat = (x.at<T>(n, c, h, w) - mean) * invstd;
          g.dx.at<T>(n, c, h, w) =
              scale * (count * dy.at<T>(n, c, h, w) - sum_dy - xhat * sum_dy_xhat);
        }
    g.dgamma.at<T>(c) = sum_dy_xhat;
    g.dbeta.at<T>(c) = sum_dy;
  }
  return g;
}

template <class T>
Result<HostTensor> relu_forward(const HostTensor& x) {
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>("relu_forward", "x", x.dtype()));
  HostTensor y(x.desc());
  auto in = x.values<T>();
  auto out = y.values<T>();
  // `v < 0 ? 0 : v` lets NaN through, as torch.relu does.
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] < T{0} ? T{0} : in[i];
  return y;
}

template <class T>
Result<HostTensor> relu_backward(const HostTensor& dy, const HostTensor& y) {
  constexpr std::string_view op = "relu_backward";
  DLPROBE_RETURN_IF_ERROR(need_dtypes<T>(op, {{"dy", dy.dtype()}, {"y", y.dtype()}}));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), y.shape()));
  const HostTensor yl = y.to_layout(dy.layout());
  HostTensor dx(dy.desc());
  auto g = dy.values<T>();
  auto out = yl.values<T>();
  auto d = dx.values<T>();
  for (std::size_t i = 0; i < g.size(); ++i) d[i] = out[i] > T{0} ? g[i] : T{0};
  return dx;
}

namespace {

// The maximum of output window (oh, ow) in plane (n, c) of x, and where it is. PyTorch starts
// from the window's first in-bounds element with -inf and moves only on a strictly greater value
// (or NaN), so the first maximum wins.
template <class T>
struct WindowMax {
  T value;
  std::int64_t h, w;
};

template <class T>
WindowMax<T> window_max(const HostTensor& x, const MaxPool2dParams& p, std::int64_t n,
                        std::int64_t c, std::int64_t oh, std::int64_t ow) {
  const Shape& xs = x.shape();
  WindowMax<T> best{-std::numeric_limits<T>::infinity(),
                    std::max<std::int64_t>(oh * p.stride[0] - p.pad[0], 0),
                    std::max<std::int64_t>(ow * p.stride[1] - p.pad[1], 0)};
  for (std::int64_t r = 0; r < p.kernel[0]; ++r) {
    const std::int64_t h = oh * p.stride[0] - p.pad[0] + r;
    if (h < 0 || h >= xs[2]) continue;
    for (std::int64_t s = 0; s < p.kernel[1]; ++s) {
      const std::int64_t w = ow * p.stride[1] - p.pad[1] + s;
      if (w < 0 || w >= xs[3]) continue;
      const T v = x.at<T>(n, c, h, w);
      if (v > best.value || std::isnan(v)) best = {v, h, w};
    }
  }
  return best;
}

// A tensor shaped as the pool's output, each element f(window's maximum, oh, ow).
template <class T, class F>
Result<HostTensor> per_window(std::string_view op, const HostTensor& x, const MaxPool2dParams& p,
                              F&& f) {
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, "x", x.dtype()));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, max_pool2d_output_shape(x.shape(), p));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc yd, output_desc(ys, dtype_of<T>, x.layout()));
  HostTensor y(yd);
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t c = 0; c < ys[1]; ++c)
      for (std::int64_t oh = 0; oh < ys[2]; ++oh)
        for (std::int64_t ow = 0; ow < ys[3]; ++ow)
          y.at<T>(n, c, oh, ow) = f(window_max<T>(x, p, n, c, oh, ow), oh, ow);
  return y;
}

}  // namespace

template <class T>
Result<HostTensor> max_pool2d_forward(const HostTensor& x, const MaxPool2dParams& p) {
  return per_window<T>(
      "max_pool2d_forward", x, p,
      [](const WindowMax<T>& best, std::int64_t, std::int64_t) { return best.value; });
}

template <class T>
Result<HostTensor> max_pool2d_backward(const HostTensor& dy, const HostTensor& x,
                                       const MaxPool2dParams& p) {
  constexpr std::string_view op = "max_pool2d_backward";
  DLPROBE_RETURN_IF_ERROR(need_dtypes<T>(op, {{"dy", dy.dtype()}, {"x", x.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, max_pool2d_output_shape(x.shape(), p));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), ys));
  HostTensor dx = HostTensor::zeros(x.desc());
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t c = 0; c < ys[1]; ++c)
      for (std::int64_t oh = 0; oh < ys[2]; ++oh)
        for (std::int64_t ow = 0; ow < ys[3]; ++ow) {
          const WindowMax<T> best = window_max<T>(x, p, n, c, oh, ow);
          dx.at<T>(n, c, best.h, best.w) += dy.at<T>(n, c, oh, ow);
        }
  return dx;
}

template <class T>
Result<HostTensor> max_pool2d_positions(const HostTensor& x, const MaxPool2dParams& p) {
  return per_window<T>("max_pool2d_positions", x, p,
                       [&p](const WindowMax<T>& best, std::int64_t oh, std::int64_t ow) {
                         const std::int64_t r = best.h - (oh * p.stride[0] - p.pad[0]);
                         const std::int64_t s = best.w - (ow * p.stride[1] - p.pad[1]);
                         return static_cast<T>(r * p.kernel[1] + s);
                       });
}

template <class T>
Result<HostTensor> max_pool2d_backward_at(const HostTensor& dy, const HostTensor& positions,
                                          const TensorDesc& x, const MaxPool2dParams& p) {
  constexpr std::string_view op = "max_pool2d_backward_at";
  DLPROBE_RETURN_IF_ERROR(
      need_dtypes<T>(op, {{"dy", dy.dtype()}, {"positions", positions.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, max_pool2d_output_shape(x.shape(), p));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), ys));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, positions.shape(), ys));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc xd, TensorDesc::make(x.shape(), dtype_of<T>, x.layout()));
  HostTensor dx = HostTensor::zeros(xd);
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t c = 0; c < ys[1]; ++c)
      for (std::int64_t oh = 0; oh < ys[2]; ++oh)
        for (std::int64_t ow = 0; ow < ys[3]; ++ow) {
          const T at = positions.at<T>(n, c, oh, ow);
          const bool place = std::isfinite(at) && at >= 0 &&
                             at < static_cast<T>(p.kernel[0] * p.kernel[1]) && std::floor(at) == at;
          const std::int64_t k = place ? static_cast<std::int64_t>(at) : 0;
          const std::int64_t h = oh * p.stride[0] - p.pad[0] + k / p.kernel[1];
          const std::int64_t w = ow * p.stride[1] - p.pad[1] + k % p.kernel[1];
          if (!place || h < 0 || h >= x.dim(2) || w < 0 || w >= x.dim(3)) {
            return invalid_argument(
                fmt::format("{}: position {} of window ({}, {}, {}, {}) is no input of its window",
                            op, static_cast<double>(at), n, c, oh, ow));
          }
          dx.at<T>(n, c, h, w) += dy.at<T>(n, c, oh, ow);
        }
  return dx;
}

template <class T>
Result<HostTensor> add(const HostTensor& a, const HostTensor& b) {
  constexpr std::string_view op = "add";
  DLPROBE_RETURN_IF_ERROR(need_dtypes<T>(op, {{"a", a.dtype()}, {"b", b.dtype()}}));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, a.shape(), b.shape()));
  const HostTensor bl = b.to_layout(a.layout());
  HostTensor out(a.desc());
  auto x = a.values<T>();
  auto y = bl.values<T>();
  auto z = out.values<T>();
  for (std::size_t i = 0; i < x.size(); ++i) z[i] = x[i] + y[i];
  return out;
}

template <class T>
Result<HostTensor> global_avg_pool_forward(const HostTensor& x) {
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>("global_avg_pool_forward", "x", x.dtype()));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, global_avg_pool_output_shape(x.shape()));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc yd, TensorDesc::make(ys, dtype_of<T>));
  HostTensor y(yd);
  const Shape& s = x.shape();
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c) {
      T sum = 0;
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) sum += x.at<T>(n, c, h, w);
      y.at<T>(n, c) = sum / static_cast<T>(s[2] * s[3]);
    }
  return y;
}

template <class T>
Result<HostTensor> global_avg_pool_backward(const HostTensor& dy, const TensorDesc& x_desc) {
  constexpr std::string_view op = "global_avg_pool_backward";
  DLPROBE_RETURN_IF_ERROR(need_dtypes<T>(op, {{"dy", dy.dtype()}, {"dx", x_desc.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, global_avg_pool_output_shape(x_desc.shape()));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), ys));
  HostTensor dx(x_desc);
  const Shape& s = x_desc.shape();
  const auto area = static_cast<T>(s[2] * s[3]);
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) dx.at<T>(n, c, h, w) = dy.at<T>(n, c) / area;
  return dx;
}

template <class T>
Result<HostTensor> linear_forward(const HostTensor& x, const HostTensor& w, const HostTensor& b) {
  constexpr std::string_view op = "linear_forward";
  DLPROBE_RETURN_IF_ERROR(
      need_dtypes<T>(op, {{"x", x.dtype()}, {"w", w.dtype()}, {"b", b.dtype()}}));
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, linear_output_shape(x.shape(), w.shape(), b.shape()));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc yd, TensorDesc::make(ys, dtype_of<T>));
  HostTensor y(yd);
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t o = 0; o < ys[1]; ++o) {
      T sum = 0;
      for (std::int64_t i = 0; i < x.shape()[1]; ++i) sum += x.at<T>(n, i) * w.at<T>(o, i);
      y.at<T>(n, o) = sum + b.at<T>(o);
    }
  return y;
}

template <class T>
Result<LinearGrads> linear_backward(const HostTensor& dy, const HostTensor& x,
                                    const HostTensor& w) {
  constexpr std::string_view op = "linear_backward";
  DLPROBE_RETURN_IF_ERROR(
      need_dtypes<T>(op, {{"dy", dy.dtype()}, {"x", x.dtype()}, {"w", w.dtype()}}));
  const Shape bias{w.shape().rank == 2 ? w.shape()[0] : 1};
  DLPROBE_ASSIGN_OR_RETURN(Shape ys, linear_output_shape(x.shape(), w.shape(), bias));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dy.shape(), ys));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc bd, TensorDesc::make(bias, dtype_of<T>));
  LinearGrads g{HostTensor(x.desc()), HostTensor(w.desc()), HostTensor(bd)};
  const std::int64_t batch = ys[0];
  const std::int64_t outs = ys[1];
  const std::int64_t ins = x.shape()[1];
  for (std::int64_t n = 0; n < batch; ++n)
    for (std::int64_t i = 0; i < ins; ++i) {
      T sum = 0;
      for (std::int64_t o = 0; o < outs; ++o) sum += dy.at<T>(n, o) * w.at<T>(o, i);
      g.dx.at<T>(n, i) = sum;
    }
  for (std::int64_t o = 0; o < outs; ++o) {
    for (std::int64_t i = 0; i < ins; ++i) {
      T sum = 0;
      for (std::int64_t n = 0; n < batch; ++n) sum += dy.at<T>(n, o) * x.at<T>(n, i);
      g.dw.at<T>(o, i) = sum;
    }
    T sum = 0;
    for (std::int64_t n = 0; n < batch; ++n) sum += dy.at<T>(n, o);
    g.db.at<T>(o) = sum;
  }
  return g;
}

namespace {

// log(sum_k exp(z_k)) for row n, shifted by the row's maximum so that no exp overflows.
template <class T>
T log_sum_exp(const HostTensor& logits, std::int64_t n) {
  const std::int64_t classes = logits.shape()[1];
  T max = logits.at<T>(n, 0);
  for (std::int64_t k = 1; k < classes; ++k) max = std::max(max, logits.at<T>(n, k));
  T sum = 0;
  for (std::int64_t k = 0; k < classes; ++k) sum += std::exp(logits.at<T>(n, k) - max);
  return max + std::log(sum);
}

template <class T>
Status check_cross_entropy(std::string_view op, const HostTensor& logits,
                           const HostTensor& labels) {
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, "logits", logits.dtype()));
  DLPROBE_RETURN_IF_ERROR(cross_entropy_output_shape(logits.shape(), labels.shape()).status());
  return need_labels(op, labels, logits.shape()[1]);
}

std::int64_t label_of(const HostTensor& labels, std::int64_t n) {
  return static_cast<std::int64_t>(labels.get(n));
}

}  // namespace

template <class T>
Result<HostTensor> cross_entropy_forward(const HostTensor& logits, const HostTensor& labels) {
  DLPROBE_RETURN_IF_ERROR(check_cross_entropy<T>("cross_entropy_forward", logits, labels));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc ld, TensorDesc::make(Shape{1}, dtype_of<T>));
  const std::int64_t batch = logits.shape()[0];
  T sum = 0;
  for (std::int64_t n = 0; n < batch; ++n) {
    sum += log_sum_exp<T>(logits, n) - logits.at<T>(n, label_of(labels, n));
  }
  HostTensor loss(ld);
  loss.at<T>(0) = sum / static_cast<T>(batch);
  return loss;
}

template <class T>
Result<HostTensor> cross_entropy_backward(const HostTensor& logits, const HostTensor& labels,
                                          const HostTensor& dloss) {
  constexpr std::string_view op = "cross_entropy_backward";
  DLPROBE_RETURN_IF_ERROR(check_cross_entropy<T>(op, logits, labels));
  DLPROBE_RETURN_IF_ERROR(need_dtype<T>(op, "dloss", dloss.dtype()));
  DLPROBE_RETURN_IF_ERROR(same_shape_check(op, dloss.shape(), Shape{1}));
  const std::int64_t batch = logits.shape()[0];
  const std::int64_t classes = logits.shape()[1];
  const T scale = dloss.at<T>(0) / static_cast<T>(batch);
  HostTensor dz(logits.desc());
  for (std::int64_t n = 0; n < batch; ++n) {
    const T lse = log_sum_exp<T>(logits, n);
    const std::int64_t label = label_of(labels, n);
    for (std::int64_t k = 0; k < classes; ++k) {
      const T softmax = std::exp(logits.at<T>(n, k) - lse);
      dz.at<T>(n, k) = (softmax - (k == label ? T{1} : T{0})) * scale;
    }
  }
  return dz;
}

namespace {

template <class T>
Status check_optimizer(std::string_view op, const HostTensor& param, const HostTensor& grad) {
  DLPROBE_RETURN_IF_ERROR(need_dtypes<T>(op, {{"param", param.dtype()}, {"grad", grad.dtype()}}));
  return same_shape_check(op, param.shape(), grad.shape());
}

}  // namespace

template <class T>
Result<SgdStep> sgd_step(const HostTensor& param, const HostTensor& grad, const SgdState& state,
                         const SgdParams& p) {
  constexpr std::string_view op = "sgd_step";
  DLPROBE_RETURN_IF_ERROR(sgd_check(p));
  DLPROBE_RETURN_IF_ERROR(check_optimizer<T>(op, param, grad));
  if (state.momentum_buffer) {
    DLPROBE_RETURN_IF_ERROR(
        need_same_desc(op, "momentum buffer", state.momentum_buffer->desc(), param.desc()));
  }
  const HostTensor g = grad.to_layout(param.layout());
  SgdStep out{param, state};
  const host_optimizer::Sgd<T> sgd(p);
  if (sgd.uses_momentum() && !out.state.momentum_buffer) {
    out.state.momentum_buffer.emplace(param.desc());
  }
  const bool first = !state.momentum_buffer;
  auto w = out.param.values<T>();
  auto gv = g.values<T>();
  T no_buffer{};
  for (std::size_t i = 0; i < w.size(); ++i) {
    T& buf = sgd.uses_momentum() ? out.state.momentum_buffer->values<T>()[i] : no_buffer;
    sgd.update(w[i], buf, gv[i], first);
  }
  return out;
}

template <class T>
Result<AdamWStep> adamw_step(const HostTensor& param, const HostTensor& grad,
                             const AdamWState& state, const AdamWParams& p) {
  constexpr std::string_view op = "adamw_step";
  DLPROBE_RETURN_IF_ERROR(adamw_check(p));
  DLPROBE_RETURN_IF_ERROR(check_optimizer<T>(op, param, grad));
  if (state.exp_avg.has_value() != (state.step > 0) ||
      state.exp_avg_sq.has_value() != (state.step > 0)) {
    return invalid_argument(fmt::format(
        "{}: state at step {} must have moments exactly when step > 0", op, state.step));
  }
  if (state.step > 0) {
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "exp_avg", state.exp_avg->desc(), param.desc()));
    DLPROBE_RETURN_IF_ERROR(
        need_same_desc(op, "exp_avg_sq", state.exp_avg_sq->desc(), param.desc()));
  }
  const HostTensor g = grad.to_layout(param.layout());
  AdamWStep out{param, state};
  if (state.step == 0) {
    out.state.exp_avg = HostTensor::zeros(param.desc());
    out.state.exp_avg_sq = HostTensor::zeros(param.desc());
  }
  const host_optimizer::AdamW<T> adamw(p, ++out.state.step);
  auto w = out.param.values<T>();
  auto gv = g.values<T>();
  auto m = out.state.exp_avg->values<T>();
  auto v = out.state.exp_avg_sq->values<T>();
  for (std::size_t i = 0; i < w.size(); ++i) adamw.update(w[i], m[i], v[i], gv[i]);
  return out;
}

#define DLPROBE_REFERENCE_INSTANTIATE(T)                                                          \
  template Result<HostTensor> conv2d_forward<T>(const HostTensor&, const HostTensor&,             \
                                                const Conv2dParams&);                             \
  template Result<HostTensor> conv2d_backward_data<T>(const HostTensor&, const HostTensor&,       \
                                                      const TensorDesc&, const Conv2dParams&);    \
  template Result<HostTensor> conv2d_backward_weight<T>(const HostTensor&, const HostTensor&,     \
                                                        const TensorDesc&, const Conv2dParams&);  \
  template Result<BatchNormTrainOutput> batch_norm_train_forward<T>(                              \
      const HostTensor&, const HostTensor&, const HostTensor&, const HostTensor&,                 \
      const HostTensor&, const BatchNormParams&);                                                 \
  template Result<HostTensor> batch_norm_inference_forward<T>(                                    \
      const HostTensor&, const HostTensor&, const HostTensor&, const HostTensor&,                 \
      const HostTensor&, const BatchNormParams&);                                                 \
  template Result<BatchNormGrads> batch_norm_backward<T>(const HostTensor&, const HostTensor&,    \
                                                         const HostTensor&, const HostTensor&,    \
                                                         const HostTensor&);                      \
  template Result<HostTensor> relu_forward<T>(const HostTensor&);                                 \
  template Result<HostTensor> relu_backward<T>(const HostTensor&, const HostTensor&);             \
  template Result<HostTensor> max_pool2d_forward<T>(const HostTensor&, const MaxPool2dParams&);   \
  template Result<HostTensor> max_pool2d_backward<T>(const HostTensor&, const HostTensor&,        \
                                                     const MaxPool2dParams&);                     \
  template Result<HostTensor> max_pool2d_positions<T>(const HostTensor&, const MaxPool2dParams&); \
  template Result<HostTensor> max_pool2d_backward_at<T>(                                          \
      const HostTensor&, const HostTensor&, const TensorDesc&, const MaxPool2dParams&);           \
  template Result<HostTensor> add<T>(const HostTensor&, const HostTensor&);                       \
  template Result<HostTensor> global_avg_pool_forward<T>(const HostTensor&);                      \
  template Result<HostTensor> global_avg_pool_backward<T>(const HostTensor&, const TensorDesc&);  \
  template Result<HostTensor> linear_forward<T>(const HostTensor&, const HostTensor&,             \
                                                const HostTensor&);                               \
  template Result<LinearGrads> linear_backward<T>(const HostTensor&, const HostTensor&,           \
                                                  const HostTensor&);                             \
  template Result<HostTensor> cross_entropy_forward<T>(const HostTensor&, const HostTensor&);     \
  template Result<HostTensor> cross_entropy_backward<T>(const HostTensor&, const HostTensor&,     \
                                                        const HostTensor&);                       \
  template Result<SgdStep> sgd_step<T>(const HostTensor&, const HostTensor&, const SgdState&,     \
                                       const SgdParams&);                                         \
  template Result<AdamWStep> adamw_step<T>(const HostTensor&, const HostTensor&,                  \
                                           const AdamWState&, const AdamWParams&);

DLPROBE_REFERENCE_INSTANTIATE(double)
DLPROBE_REFERENCE_INSTANTIATE(float)
#undef DLPROBE_REFERENCE_INSTANTIATE

}  // namespace dlprobe::reference
