// The Backend adapter over the reference functions. The reference ops are pure functions on
// HostTensor (they return new tensors), and the Backend slots write into caller-owned memory, so
// each slot copies its inputs into host tensors of the compute type, calls the op, and copies the
// results out in the output's dtype and layout. The copies cost time, not correctness, and this
// backend exists for correctness; they live on the C++ heap, not in the caching allocator, since
// they are an artefact of this adapter, not memory the training step needs.
//
// Convolutions are the exception to "call the reference function": the reference's one-tap-at-a-
// time loop runs ResNet-18 on 32x32 images at seconds per step, too slow for CI to train a network
// end to end. For the case ResNet has (groups 1, dilation 1) this file loops over the same sum with
// the channel dimension innermost and contiguous, which the compiler vectorises; any other case
// goes to the reference function. Likewise SGD and AdamW over fp32/fp64 parameters run the
// reference's per-element formula, in the same order, directly on the buffers, without the eight
// whole-model copies the pure-function form costs. The tests compare both against the reference.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "dlprobe/engine/reference_backend.h"
#include "engine/backends/host_backend.h"
#include "engine/backends/host_optimizer.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe {
namespace {

HostTensor load(const TensorView& v) {
  HostTensor t(v.desc);
  std::memcpy(t.data(), v.data, v.desc.bytes());
  return t;
}

// Floating tensors in the compute type T; integer tensors (labels) as they are.
template <class T>
Result<HostTensor> load_as(const TensorView& v) {
  HostTensor t = load(v);
  if (!dtype_is_floating(t.dtype()) || t.dtype() == dtype_of<T>) return t;
  return t.to_dtype(dtype_of<T>);
}

Status store(HostTensor result, const TensorView& dst) {
  if (!(result.shape() == dst.desc.shape())) {
    return error(Errc::internal, fmt::format("reference backend: result {} does not fit {}",
                                             result.desc().str(), dst.desc.str()));
  }
  if (result.dtype() != dst.desc.dtype()) {
    DLPROBE_ASSIGN_OR_RETURN(result, result.to_dtype(dst.desc.dtype()));
  }
  if (result.layout() != dst.desc.layout()) result = result.to_layout(dst.desc.layout());
  std::memcpy(dst.data, result.data(), dst.desc.bytes());
  return Status::ok();
}

// Most ops: `op`, one of reference.h's, on the operands read in T, its result stored into `out`.
template <class T, class Op, class... Operands>
Status run_reference(const TensorView& out, const Op& op, const Operands&... operands) {
  std::array<Result<HostTensor>, sizeof...(operands)> in{load_as<T>(operands)...};
  for (const Result<HostTensor>& r : in) {
    if (!r.has_value()) return r.status();
  }
  DLPROBE_ASSIGN_OR_RETURN(HostTensor result,
                           std::apply([&](auto&... loaded) { return op(*loaded...); }, in));
  return store(std::move(result), out);
}

double read_elem(const TensorView& v, std::int64_t i);

bool flag_set(const TensorView& found_inf) {
  return found_inf.data != nullptr && read_elem(found_inf, 0) != 0.0;
}

bool fast_conv(const Conv2dParams& p) {
  return p.groups == 1 && p.dilation[0] == 1 && p.dilation[1] == 1;
}

// One element by storage index, as double (exact for every dtype here); writing rounds to the
// tensor's dtype (fp64 reaches fp16/bf16 through fp32, as HostTensor::to_dtype does). The fast
// paths below use these on the buffers directly: building a HostTensor costs a pass over its
// elements before any work is done.
double read_elem(const TensorView& v, std::int64_t i) {
  const auto k = static_cast<std::size_t>(i);
  switch (v.desc.dtype()) {
    case DType::fp64:
      return static_cast<const double*>(v.data)[k];
    case DType::fp32:
      return static_cast<const float*>(v.data)[k];
    case DType::fp16:
      return half_to_float(static_cast<const Half*>(v.data)[k]);
    case DType::bf16:
      return bf16_to_float(static_cast<const BFloat16*>(v.data)[k]);
    case DType::int32:
      return static_cast<const std::int32_t*>(v.data)[k];
    case DType::int64:
      return static_cast<double>(static_cast<const std::int64_t*>(v.data)[k]);
  }
  return 0.0;
}
void write_elem(const TensorView& v, std::int64_t i, double x) {
  const auto k = static_cast<std::size_t>(i);
  switch (v.desc.dtype()) {
    case DType::fp64:
      static_cast<double*>(v.data)[k] = x;
      return;
    case DType::fp32:
      static_cast<float*>(v.data)[k] = static_cast<float>(x);
      return;
    case DType::fp16:
      static_cast<Half*>(v.data)[k] = float_to_half(static_cast<float>(x));
      return;
    case DType::bf16:
      static_cast<BFloat16*>(v.data)[k] = float_to_bf16(static_cast<float>(x));
      return;
    case DType::int32:
      static_cast<std::int32_t*>(v.data)[k] = static_cast<std::int32_t>(x);
      return;
    case DType::int64:
      static_cast<std::int64_t*>(v.data)[k] = static_cast<std::int64_t>(x);
      return;
  }
}

// Calls f(storage offset, channel) for every element of a rank-4 tensor.
template <class F>
void for_each_channel(const TensorDesc& d, F&& f) {
  const Shape& s = d.shape();
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) f(d.offset(n, c, h, w), c);
}

// Calls f(src_offset, dst_offset) for every logical index of two tensors of one shape.
template <class F>
void for_each_pair(const TensorDesc& a, const TensorDesc& b, F&& f) {
  if (a.rank() != 4 || a.layout() == b.layout()) {
    for (std::int64_t i = 0; i < a.numel(); ++i) f(i, i);
    return;
  }
  const Shape& s = a.shape();
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w) f(a.offset(n, c, h, w), b.offset(n, c, h, w));
}

// The elements in storage order, in the compute type; one typed pass for fp32/fp64 storage.
template <class T>
std::vector<T> to_vector(const TensorView& v) {
  const auto n = static_cast<std::size_t>(v.desc.numel());
  std::vector<T> out(n);
  if (v.desc.dtype() == DType::fp32) {
    const auto* src = static_cast<const float*>(v.data);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(src[i]);
  } else if (v.desc.dtype() == DType::fp64) {
    const auto* src = static_cast<const double*>(v.data);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(read_elem(v, static_cast<std::int64_t>(i)));
  }
  return out;
}
template <class T>
void from_vector(const std::vector<T>& src, const TensorView& v) {
  const std::size_t n = src.size();
  if (v.desc.dtype() == DType::fp32) {
    auto* dst = static_cast<float*>(v.data);
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  } else if (v.desc.dtype() == DType::fp64) {
    auto* dst = static_cast<double*>(v.data);
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<double>(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i)
      write_elem(v, static_cast<std::int64_t>(i), static_cast<double>(src[i]));
  }
}

// An activation [N, C, H, W] copied into N, H, W, C order (C contiguous), in the compute type.
template <class T>
std::vector<T> channels_last(const TensorView& v) {
  const Shape& s = v.desc.shape();
  const std::vector<T> src = to_vector<T>(v);
  std::vector<T> out(src.size());
  std::size_t i = 0;
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t h = 0; h < s[2]; ++h)
      for (std::int64_t w = 0; w < s[3]; ++w)
        for (std::int64_t c = 0; c < s[1]; ++c)
          out[i++] = src[static_cast<std::size_t>(v.desc.offset(n, c, h, w))];
  return out;
}

// A weight [K, C, R, S] copied into R, S, K, C order when `k_outer`, else R, S, C, K.
template <class T>
std::vector<T> weight_rs(const TensorView& v, bool k_outer) {
  const Shape& s = v.desc.shape();
  const std::vector<T> src = to_vector<T>(v);
  std::vector<T> out(src.size());
  std::size_t i = 0;
  for (std::int64_t r = 0; r < s[2]; ++r)
    for (std::int64_t q = 0; q < s[3]; ++q)
      for (std::int64_t a = 0; a < (k_outer ? s[0] : s[1]); ++a)
        for (std::int64_t b = 0; b < (k_outer ? s[1] : s[0]); ++b)
          out[i++] = src[static_cast<std::size_t>(k_outer ? v.desc.offset(a, b, r, q)
                                                          : v.desc.offset(b, a, r, q))];
  return out;
}

// Stores an N, H, W, C (or, for weights, R, S, K, C) ordered result into `dst` of logical shape
// [N, C, H, W] (or [K, C, R, S]).
template <class T>
void store_channels_last(const std::vector<T>& v, const TensorView& dst, bool weight) {
  const Shape& s = dst.desc.shape();
  const TensorDesc& d = dst.desc;
  std::vector<T> out(v.size());
  const auto at = [&](std::int64_t offset) -> T& { return out[static_cast<std::size_t>(offset)]; };
  std::size_t i = 0;
  if (weight) {
    for (std::int64_t r = 0; r < s[2]; ++r)
      for (std::int64_t q = 0; q < s[3]; ++q)
        for (std::int64_t k = 0; k < s[0]; ++k)
          for (std::int64_t c = 0; c < s[1]; ++c) at(d.offset(k, c, r, q)) = v[i++];
  } else {
    for (std::int64_t n = 0; n < s[0]; ++n)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t w = 0; w < s[3]; ++w)
          for (std::int64_t c = 0; c < s[1]; ++c) at(d.offset(n, c, h, w)) = v[i++];
  }
  from_vector(out, dst);
}

// The geometry the three passes share; (h, w) = (p * stride - pad + r, q * stride - pad + s).
struct ConvGeometry {
  std::int64_t n, c, h, w, k, r, s, p, q;
  std::int64_t sh, sw, ph, pw;
  ConvGeometry(const Shape& x, const Shape& wt, const Shape& y, const Conv2dParams& prm)
      : n(x[0]),
        c(x[1]),
        h(x[2]),
        w(x[3]),
        k(wt[0]),
        r(wt[2]),
        s(wt[3]),
        p(y[2]),
        q(y[3]),
        sh(prm.stride[0]),
        sw(prm.stride[1]),
        ph(prm.pad[0]),
        pw(prm.pad[1]) {}
  // Calls f(x_offset, y_offset, weight tap) for every tap inside the image, offsets in channels-
  // last element units (before the channel index).
  template <class F>
  void for_each_tap(F&& f) const {
    for (std::int64_t in = 0; in < n; ++in)
      for (std::int64_t ip = 0; ip < p; ++ip)
        for (std::int64_t iq = 0; iq < q; ++iq) {
          const std::int64_t yo = ((in * p + ip) * q + iq) * k;
          for (std::int64_t ir = 0; ir < r; ++ir) {
            const std::int64_t ih = ip * sh - ph + ir;
            if (ih < 0 || ih >= h) continue;
            for (std::int64_t is = 0; is < s; ++is) {
              const std::int64_t iw = iq * sw - pw + is;
              if (iw < 0 || iw >= w) continue;
              f(((in * h + ih) * w + iw) * c, yo, ir * s + is);
            }
          }
        }
  }
};

// The fast passes that apply the weights, channels-last: the forward (x's C channels in, y's K
// out) and the backward data (dy's K in, dx's C out). At each tap, the output's channels gain the
// input's channels times that tap's block of `ws`, [input channel][output channel].
template <class T>
std::vector<T> apply_weights(const ConvGeometry& g, const std::vector<T>& in,
                             const std::vector<T>& ws, std::int64_t out_numel, bool forward) {
  std::vector<T> out(static_cast<std::size_t>(out_numel), T{0});
  const std::int64_t ins = forward ? g.c : g.k;
  const std::int64_t outs = forward ? g.k : g.c;
  g.for_each_tap([&](std::int64_t xo, std::int64_t yo, std::int64_t tap) {
    const T* src = in.data() + (forward ? xo : yo);
    T* dst = out.data() + (forward ? yo : xo);
    for (std::int64_t i = 0; i < ins; ++i) {
      const T v = src[i];
      const T* wr = ws.data() + (tap * ins + i) * outs;
      for (std::int64_t j = 0; j < outs; ++j) dst[j] += v * wr[j];
    }
  });
  return out;
}

// Parameters, gradients and optimizer state of one dtype (fp32 or fp64) and one description, so
// element i of each is the same logical element: the case the optimizers run in place.
bool same_master_desc(const OptimizerSlot& s, bool with_state0, bool with_state1) {
  const DType t = s.param.desc.dtype();
  if (t != DType::fp32 && t != DType::fp64) return false;
  if (!(s.grad.desc == s.param.desc)) return false;
  if (with_state0 && !(s.state0.desc == s.param.desc)) return false;
  if (with_state1 && !(s.state1.desc == s.param.desc)) return false;
  return true;
}

template <class T>
T get_elem(const TensorView& v, std::size_t i) {
  if (v.desc.dtype() == DType::fp64) return static_cast<T>(static_cast<const double*>(v.data)[i]);
  return static_cast<T>(static_cast<const float*>(v.data)[i]);
}
template <class T>
void set_elem(const TensorView& v, std::size_t i, T value) {
  if (v.desc.dtype() == DType::fp64) {
    static_cast<double*>(v.data)[i] = static_cast<double>(value);
  } else {
    static_cast<float*>(v.data)[i] = static_cast<float>(value);
  }
}

template <class T>
class ReferenceBackend final : public HostBackend {
 public:
  ReferenceBackend(int streams, bool keeps_normalised)
      : streams_(streams), keeps_normalised_(keeps_normalised) {}

  std::string_view name() const override { return "reference"; }
  Status synchronize() override { return Status::ok(); }

  // Stream 1's work runs at the join that covers it, the latest a device may run it, so a caller
  // that reads its results, or reuses its operands' memory, before joining computes wrong values.
  int streams() const override { return streams_; }
  Result<std::size_t> on_stream(int stream, const std::function<Status()>& run) override {
    if (stream != 1 || streams_ < 2) return Backend::on_stream(stream, run);
    late_.emplace_back(next_ticket_, run);
    return next_ticket_++;
  }
  Status join_through(std::size_t ticket) override {
    while (!late_.empty() && late_.front().first <= ticket) {
      const std::function<Status()> run = std::move(late_.front().second);
      late_.pop_front();
      DLPROBE_RETURN_IF_ERROR(run());
    }
    return Status::ok();
  }
  Status join() override { return late_.empty() ? Status::ok() : join_through(late_.back().first); }

  Status fill(const TensorView& t, double value) override {
    for (std::int64_t i = 0; i < t.desc.numel(); ++i) write_elem(t, i, value);
    return Status::ok();
  }
  Status cast(const TensorView& src, const TensorView& dst) override {
    if (!(src.desc.shape() == dst.desc.shape())) {
      return invalid_argument(
          fmt::format("cast: {} and {} differ in shape", src.desc.str(), dst.desc.str()));
    }
    if (dtype_is_floating(src.desc.dtype()) != dtype_is_floating(dst.desc.dtype())) {
      return invalid_argument(
          fmt::format("cast: {} to {} mixes values and integers", src.desc.str(), dst.desc.str()));
    }
    for_each_pair(src.desc, dst.desc,
                  [&](std::int64_t a, std::int64_t b) { write_elem(dst, b, read_elem(src, a)); });
    return Status::ok();
  }

  Status conv2d_forward(const TensorView& x, const TensorView& w, const TensorView& y,
                        const Conv2dParams& p) override {
    if (!fast_conv(p)) {
      return run_reference<T>(
          y,
          [&](const HostTensor& xt, const HostTensor& wt) {
            return reference::conv2d_forward<T>(xt, wt, p);
          },
          x, w);
    }
    const ConvGeometry g(x.desc.shape(), w.desc.shape(), y.desc.shape(), p);
    const std::vector<T> ws = weight_rs<T>(w, false);  // R, S, C, K
    store_channels_last(apply_weights(g, channels_last<T>(x), ws, y.desc.numel(), true), y, false);
    return Status::ok();
  }
  Status conv2d_backward_data(const TensorView& dy, const TensorView& w, const TensorView& dx,
                              const Conv2dParams& p) override {
    if (!fast_conv(p)) {
      return run_reference<T>(
          dx,
          [&](const HostTensor& dyt, const HostTensor& wt) {
            return reference::conv2d_backward_data<T>(dyt, wt, dx.desc.with_dtype(dtype_of<T>), p);
          },
          dy, w);
    }
    const ConvGeometry g(dx.desc.shape(), w.desc.shape(), dy.desc.shape(), p);
    const std::vector<T> ws = weight_rs<T>(w, true);  // R, S, K, C
    store_channels_last(apply_weights(g, channels_last<T>(dy), ws, dx.desc.numel(), false), dx,
                        false);
    return Status::ok();
  }
  Status conv2d_backward_weight(const TensorView& x, const TensorView& dy, const TensorView& dw,
                                const Conv2dParams& p) override {
    if (!fast_conv(p)) {
      return run_reference<T>(
          dw,
          [&](const HostTensor& xt, const HostTensor& dyt) {
            return reference::conv2d_backward_weight<T>(xt, dyt, dw.desc.with_dtype(dtype_of<T>),
                                                        p);
          },
          x, dy);
    }
    const std::vector<T> xs = channels_last<T>(x);
    const std::vector<T> dys = channels_last<T>(dy);
    const ConvGeometry g(x.desc.shape(), dw.desc.shape(), dy.desc.shape(), p);
    std::vector<T> dws(static_cast<std::size_t>(dw.desc.numel()), T{0});  // R, S, K, C
    g.for_each_tap([&](std::int64_t xo, std::int64_t yo, std::int64_t tap) {
      const T* xr = xs.data() + xo;
      for (std::int64_t k = 0; k < g.k; ++k) {
        const T gv = dys[static_cast<std::size_t>(yo + k)];
        T* out = dws.data() + (tap * g.k + k) * g.c;
        for (std::int64_t c = 0; c < g.c; ++c) out[c] += gv * xr[c];
      }
    });
    store_channels_last(dws, dw, true);
    return Status::ok();
  }

  Status batch_norm_train_forward(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, const TensorView& running_mean,
                                  const TensorView& running_var, const TensorView& y,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const BatchNormParams& p) override {
    return bn_train(x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd, p,
                    nullptr);
  }
  Status batch_norm_inference_forward(const TensorView& x, const TensorView& gamma,
                                      const TensorView& beta, const TensorView& running_mean,
                                      const TensorView& running_var, const TensorView& y,
                                      const BatchNormParams& p) override {
    return bn_inference(x, gamma, beta, running_mean, running_var, y, p, nullptr);
  }
  Status batch_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                             const TensorView& save_mean, const TensorView& save_invstd,
                             const TensorView& dx, const TensorView& dgamma,
                             const TensorView& dbeta) override {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor dyt, load_as<T>(dy));
    return bn_backward(dyt, x, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  }

  // The fused slots compose the plain ops in the compute type and round once, as a fused kernel
  // does; the step tests plan fused steps on this backend too.
  bool fuses_batch_norm_relu() const override { return true; }
  Status batch_norm_relu_train_forward(const TensorView& x, const TensorView& gamma,
                                       const TensorView& beta, const TensorView& running_mean,
                                       const TensorView& running_var, const TensorView& residual,
                                       const TensorView& y, const TensorView& save_mean,
                                       const TensorView& save_invstd,
                                       const BatchNormParams& p) override {
    return bn_train(x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd, p,
                    &residual);
  }
  Status batch_norm_relu_inference_forward(const TensorView& x, const TensorView& gamma,
                                           const TensorView& beta, const TensorView& running_mean,
                                           const TensorView& running_var,
                                           const TensorView& residual, const TensorView& y,
                                           const BatchNormParams& p) override {
    return bn_inference(x, gamma, beta, running_mean, running_var, y, p, &residual);
  }
  Status batch_norm_relu_backward(const TensorView& dy, const TensorView& y, const TensorView& x,
                                  const TensorView& gamma, const TensorView& beta,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const TensorView& dx, const TensorView& dgamma,
                                  const TensorView& dbeta) override {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor dyt, load_as<T>(dy));
    HostTensor yt;
    if (y.data != nullptr) {
      DLPROBE_ASSIGN_OR_RETURN(yt, load_as<T>(y));
    } else {
      // Never stored: the ReLU's input recomputed from x, as the forward computed it.
      DLPROBE_ASSIGN_OR_RETURN(HostTensor xt, load_as<T>(x));
      DLPROBE_ASSIGN_OR_RETURN(yt, normalise(xt, gamma, beta, save_mean, save_invstd));
    }
    DLPROBE_ASSIGN_OR_RETURN(HostTensor masked, reference::relu_backward<T>(dyt, yt));
    return bn_backward(masked, x, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  }

  bool fuses_relu_backward_add() const override { return true; }
  Status relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                           const TensorView& dx) override {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor at, load_as<T>(a));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor bt, load_as<T>(b));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor sum, reference::add<T>(at, bt));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor yt, load_as<T>(y));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out, reference::relu_backward<T>(sum, yt));
    return store(std::move(out), dx);
  }

  // The conv-fusion slots compose the plain ones: the prologue's input is computed in T and
  // rounded to x's dtype, as a fused kernel feeds its tensor cores, and the sums are taken over y
  // as stored. Offered for fp64 NHWC steps, which the step tests plan it in; every other step
  // keeps the plan that memory predictions without a device assume and that the CLI tests
  // compare across layouts.
  bool fuses_conv_batch_norm(DType activation, Layout layout) const override {
    return activation == DType::fp64 && layout == Layout::nhwc;
  }
  bool keeps_normalised_conv_input(const TensorDesc& /*x*/) const override {
    return keeps_normalised_;
  }
  Status conv2d_forward_fused(const TensorView& x, const TensorView& scale, const TensorView& bias,
                              const TensorView& w, const TensorView& y, const TensorView& sum,
                              const TensorView& sqsum, const Conv2dParams& p) override {
    constexpr std::string_view op = "conv2d_forward_fused";
    DLPROBE_RETURN_IF_ERROR(check_pair(op, "scale", scale, "bias", bias));
    DLPROBE_RETURN_IF_ERROR(check_pair(op, "sum", sum, "sqsum", sqsum));
    HostTensor normalised;
    TensorView in = x;
    if (scale.data != nullptr) {
      DLPROBE_ASSIGN_OR_RETURN(normalised, prologue(op, x, scale, bias));
      in = normalised.view();
    }
    DLPROBE_RETURN_IF_ERROR(conv2d_forward(in, w, y, p));
    if (sum.data == nullptr) return Status::ok();
    if (sum.desc.numel() != y.desc.dim(1) || sqsum.desc.numel() != y.desc.dim(1)) {
      return invalid_argument(
          fmt::format("{}: sum and sqsum need one value per channel of y {}", op, y.desc.str()));
    }
    std::vector<double> sums(static_cast<std::size_t>(y.desc.dim(1)), 0.0);
    std::vector<double> squares(sums.size(), 0.0);
    for_each_channel(y.desc, [&](std::int64_t i, std::int64_t c) {
      const double v = read_elem(y, i);
      sums[static_cast<std::size_t>(c)] += v;
      squares[static_cast<std::size_t>(c)] += v * v;
    });
    for (std::size_t c = 0; c < sums.size(); ++c) {
      write_elem(sum, static_cast<std::int64_t>(c), sums[c]);
      write_elem(sqsum, static_cast<std::int64_t>(c), squares[c]);
    }
    return Status::ok();
  }
  Status conv2d_backward_weight_fused(const TensorView& x, const TensorView& scale,
                                      const TensorView& bias, const TensorView& dy,
                                      const TensorView& dw, const Conv2dParams& p) override {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor normalised,
                             prologue("conv2d_backward_weight_fused", x, scale, bias));
    return conv2d_backward_weight(normalised.view(), dy, dw, p);
  }
  Status conv2d_backward_data_add_relu(const TensorView& dy, const TensorView& w,
                                       const TensorView& add, const TensorView& relu_y,
                                       const TensorView& dx, const Conv2dParams& p) override {
    HostTensor grad(dx.desc);
    DLPROBE_RETURN_IF_ERROR(conv2d_backward_data(dy, w, grad.view(), p));
    return relu_backward_add(add, grad.view(), relu_y, dx);
  }
  Status batch_norm_finalize(const BatchNormFinalize& f) override {
    constexpr std::string_view op = "batch_norm_finalize";
    const auto& [sum, sqsum, count, gamma, beta, running_mean, running_var, save_mean, save_invstd,
                 scale, bias, p] = f;
    DLPROBE_RETURN_IF_ERROR(check_pair(op, "scale", scale, "bias", bias));
    if (count < 2) {
      return invalid_argument(fmt::format("{}: {} values a channel (at least 2)", op, count));
    }
    const std::int64_t channels = gamma.desc.numel();
    for (const TensorView* v :
         {&sum, &sqsum, &beta, &running_mean, &running_var, &save_mean, &save_invstd}) {
      if (v->desc.numel() != channels) {
        return invalid_argument(
            fmt::format("{}: {} does not have gamma's {} channels", op, v->desc.str(), channels));
      }
    }
    const auto n = static_cast<T>(count);
    const auto eps = static_cast<T>(p.eps);
    const auto momentum = static_cast<T>(p.momentum);
    for (std::int64_t c = 0; c < channels; ++c) {
      const auto mean = static_cast<T>(read_elem(sum, c)) / n;
      // The sums' form of the variance cancels where the mean is large against the deviation;
      // clamped at zero so that rounding cannot make it negative.
      const T var_biased = std::max(static_cast<T>(read_elem(sqsum, c)) / n - mean * mean, T{0});
      const T var_unbiased = var_biased * n / (n - T{1});
      const T invstd = T{1} / std::sqrt(var_biased + eps);
      write_elem(save_mean, c, static_cast<double>(mean));
      write_elem(save_invstd, c, static_cast<double>(invstd));
      write_elem(
          running_mean, c,
          static_cast<double>((T{1} - momentum) * static_cast<T>(read_elem(running_mean, c)) +
                              momentum * mean));
      write_elem(running_var, c,
                 static_cast<double>((T{1} - momentum) * static_cast<T>(read_elem(running_var, c)) +
                                     momentum * var_unbiased));
      if (scale.data == nullptr) continue;
      const T k = static_cast<T>(read_elem(gamma, c)) * invstd;
      write_elem(scale, c, static_cast<double>(k));
      write_elem(bias, c, static_cast<double>(static_cast<T>(read_elem(beta, c)) - mean * k));
    }
    return Status::ok();
  }
  Status batch_norm_apply(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                          const TensorView& save_mean, const TensorView& save_invstd,
                          const TensorView& residual, const TensorView& y, bool relu) override {
    if (residual.data != nullptr && !relu) {
      return invalid_argument("batch_norm_apply: a residual comes only with the ReLU");
    }
    DLPROBE_ASSIGN_OR_RETURN(HostTensor xt, load_as<T>(x));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor bn, normalise(xt, gamma, beta, save_mean, save_invstd));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out, epilogue(std::move(bn), relu ? &residual : nullptr));
    return store(std::move(out), y);
  }

  Status batch_norm_apply_add(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                              const TensorView& save_mean, const TensorView& save_invstd,
                              const TensorView& r, const TensorView& r_gamma,
                              const TensorView& r_beta, const TensorView& r_mean,
                              const TensorView& r_invstd, const TensorView& y) override {
    HostTensor shortcut(r.desc);
    DLPROBE_RETURN_IF_ERROR(
        batch_norm_apply(r, r_gamma, r_beta, r_mean, r_invstd, {}, shortcut.view(), false));
    return batch_norm_apply(x, gamma, beta, save_mean, save_invstd, shortcut.view(), y, true);
  }

  Status relu_forward(const TensorView& x, const TensorView& y) override {
    return run_reference<T>(y, reference::relu_forward<T>, x);
  }
  Status relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx) override {
    return run_reference<T>(dx, reference::relu_backward<T>, dy, y);
  }

  Status max_pool2d_forward(const TensorView& x, const TensorView& y,
                            const MaxPool2dParams& p) override {
    return run_reference<T>(
        y, [&](const HostTensor& xt) { return reference::max_pool2d_forward<T>(xt, p); }, x);
  }
  Status max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& /*y*/,
                             const TensorView& dx, const MaxPool2dParams& p) override {
    return run_reference<T>(
        dx,
        [&](const HostTensor& dyt, const HostTensor& xt) {
          return reference::max_pool2d_backward<T>(dyt, xt, p);
        },
        dy, x);
  }

  bool recomputes_max_pool_input() const override { return true; }
  Status max_pool2d_backward_recomputed(const TensorView& dy, const TensorView& bn_x,
                                        const TensorView& gamma, const TensorView& beta,
                                        const TensorView& save_mean, const TensorView& save_invstd,
                                        const TensorView& dx, const MaxPool2dParams& p) override {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor xt, load_as<T>(bn_x));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor bn, normalise(xt, gamma, beta, save_mean, save_invstd));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor relu, reference::relu_forward<T>(bn));
    // Rounded to the dtype the forward stored it in.
    HostTensor stored(bn_x.desc);
    DLPROBE_RETURN_IF_ERROR(store(std::move(relu), stored.view()));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor x, load_as<T>(stored.view()));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor dyt, load_as<T>(dy));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out, reference::max_pool2d_backward<T>(dyt, x, p));
    return store(std::move(out), dx);
  }
  // In NHWC, as the CUDA backend: a step in NCHW keeps the two calls, so that both plans run here.
  // Windows of at most 255 positions, as there: each place is exact in every dtype.
  bool fuses_max_pool_batch_norm_backward(const TensorDesc& x,
                                          const MaxPool2dParams& pool) const override {
    return x.layout() == Layout::nhwc && pool.kernel[0] * pool.kernel[1] <= 255;
  }
  Status batch_norm_relu_max_pool_backward(const TensorView& dy, const TensorView& positions,
                                           const TensorView& x, const TensorView& gamma,
                                           const TensorView& beta, const TensorView& save_mean,
                                           const TensorView& save_invstd, const TensorView& dx,
                                           const TensorView& dgamma, const TensorView& dbeta,
                                           const MaxPool2dParams& pool) override {
    // The two calls it stands for, the pool's input gradient stored in x's dtype between them.
    HostTensor pooled_grad(x.desc);
    if (positions.data != nullptr) {
      DLPROBE_RETURN_IF_ERROR(run_reference<T>(
          pooled_grad.view(),
          [&](const HostTensor& dyt, const HostTensor& at) {
            return reference::max_pool2d_backward_at<T>(dyt, at, x.desc, pool);
          },
          dy, positions));
    } else {
      DLPROBE_RETURN_IF_ERROR(max_pool2d_backward_recomputed(
          dy, x, gamma, beta, save_mean, save_invstd, pooled_grad.view(), pool));
    }
    return batch_norm_relu_backward(pooled_grad.view(), TensorView{}, x, gamma, beta, save_mean,
                                    save_invstd, dx, dgamma, dbeta);
  }
  Status batch_norm_relu_max_pool_train_forward(
      const TensorView& x, const TensorView& gamma, const TensorView& beta,
      const TensorView& running_mean, const TensorView& running_var, const TensorView& y,
      const TensorView& positions, const TensorView& save_mean, const TensorView& save_invstd,
      const BatchNormParams& bn, const MaxPool2dParams& pool) override {
    if (positions.data != nullptr && !(positions.desc == y.desc)) {
      return invalid_argument("batch_norm_relu_max_pool_train_forward: positions are " +
                              positions.desc.str() + " for y " + y.desc.str());
    }
    // The two calls it stands for, the batch norm's output stored in x's dtype between them.
    HostTensor relu(x.desc);
    const TensorView no_residual;
    DLPROBE_RETURN_IF_ERROR(bn_train(x, gamma, beta, running_mean, running_var, relu.view(),
                                     save_mean, save_invstd, bn, &no_residual));
    DLPROBE_RETURN_IF_ERROR(max_pool2d_forward(relu.view(), y, pool));
    if (positions.data == nullptr) return Status::ok();
    return run_reference<T>(
        positions,
        [&](const HostTensor& xt) { return reference::max_pool2d_positions<T>(xt, pool); },
        relu.view());
  }

  Status add(const TensorView& a, const TensorView& b, const TensorView& y) override {
    return run_reference<T>(y, reference::add<T>, a, b);
  }

  Status global_avg_pool_forward(const TensorView& x, const TensorView& y) override {
    return run_reference<T>(y, reference::global_avg_pool_forward<T>, x);
  }
  Status global_avg_pool_backward(const TensorView& dy, const TensorView& dx) override {
    return run_reference<T>(
        dx,
        [&](const HostTensor& dyt) {
          return reference::global_avg_pool_backward<T>(dyt, dx.desc.with_dtype(dtype_of<T>));
        },
        dy);
  }

  Status linear_forward(const TensorView& x, const TensorView& w, const TensorView& b,
                        const TensorView& y) override {
    return run_reference<T>(y, reference::linear_forward<T>, x, w, b);
  }
  Status linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                         const TensorView& dx, const TensorView& dw,
                         const TensorView& db) override {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor dyt, load_as<T>(dy));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor xt, load_as<T>(x));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor wt, load_as<T>(w));
    DLPROBE_ASSIGN_OR_RETURN(reference::LinearGrads out,
                             reference::linear_backward<T>(dyt, xt, wt));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.dx), dx));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.dw), dw));
    return store(std::move(out.db), db);
  }

  Status cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                               const TensorView& loss) override {
    // load_as leaves the integer labels as they are.
    return run_reference<T>(loss, reference::cross_entropy_forward<T>, logits, labels);
  }
  Status cross_entropy_backward(const TensorView& logits, const TensorView& labels,
                                const TensorView& counters, const TensorView& dlogits) override {
    DLPROBE_ASSIGN_OR_RETURN(const double loss_scale,
                             host_optimizer::loss_scale_of("cross_entropy_backward", counters));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor lt, load_as<T>(logits));
    HostTensor dloss(TensorDesc::make(Shape{1}, dtype_of<T>).value());
    dloss.set(0, loss_scale);
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out,
                             reference::cross_entropy_backward<T>(lt, load(labels), dloss));
    return store(std::move(out), dlogits);
  }

  Status unscale_gradients(std::span<const TensorView> grads, const TensorView& counters,
                           const TensorView& found_inf) override {
    DLPROBE_RETURN_IF_ERROR(step_counters_check("unscale_gradients", counters));
    bool found = false;
    const auto inv = static_cast<T>(1.0 / host_optimizer::read_counters(counters).loss_scale);
    for (const TensorView& g : grads) {
      for (std::int64_t i = 0; i < g.desc.numel(); ++i) {
        const double v = read_elem(g, i);
        // As _amp_foreach_non_finite_check_and_unscale_: the gradient is checked before unscaling.
        if (!std::isfinite(v)) found = true;
        write_elem(g, i, static_cast<double>(static_cast<T>(v) * inv));
      }
    }
    if (found) return fill(found_inf, 1.0);
    return Status::ok();
  }

  Status sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p,
                  const TensorView& counters, const TensorView& found_inf) override {
    DLPROBE_RETURN_IF_ERROR(step_counters_check("sgd_step", counters));
    if (flag_set(found_inf)) return Status::ok();
    DLPROBE_RETURN_IF_ERROR(sgd_check(p));
    const std::int64_t step = host_optimizer::step_of(counters);
    const bool use_momentum = p.momentum != 0.0;
    for (const OptimizerSlot& s : slots) {
      if (use_momentum && s.state0.data == nullptr) {
        return invalid_argument("sgd_step: momentum needs a momentum buffer");
      }
      if (same_master_desc(s, use_momentum, false)) {
        const host_optimizer::Sgd<T> sgd(p);
        const bool first = step == 1;
        const auto n = static_cast<std::size_t>(s.param.desc.numel());
        for (std::size_t i = 0; i < n; ++i) {
          T w = get_elem<T>(s.param, i);
          T buf = use_momentum && !first ? get_elem<T>(s.state0, i) : T{0};
          sgd.update(w, buf, get_elem<T>(s.grad, i), first);
          set_elem(s.param, i, w);
          if (use_momentum) set_elem(s.state0, i, buf);
        }
        continue;
      }
      DLPROBE_ASSIGN_OR_RETURN(HostTensor param, load_as<T>(s.param));
      DLPROBE_ASSIGN_OR_RETURN(HostTensor grad, load_as<T>(s.grad));
      reference::SgdState state;
      if (use_momentum && step > 1) {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor buf, load_as<T>(s.state0));
        state.momentum_buffer = std::move(buf);
      }
      DLPROBE_ASSIGN_OR_RETURN(reference::SgdStep out,
                               reference::sgd_step<T>(param, grad, state, p));
      DLPROBE_RETURN_IF_ERROR(store(std::move(out.param), s.param));
      if (out.state.momentum_buffer) {
        DLPROBE_RETURN_IF_ERROR(store(std::move(*out.state.momentum_buffer), s.state0));
      }
    }
    return Status::ok();
  }

  Status adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p,
                    const TensorView& counters, const TensorView& found_inf) override {
    DLPROBE_RETURN_IF_ERROR(step_counters_check("adamw_step", counters));
    if (flag_set(found_inf)) return Status::ok();
    DLPROBE_RETURN_IF_ERROR(adamw_check(p));
    const std::int64_t step = host_optimizer::step_of(counters);
    for (const OptimizerSlot& s : slots) {
      if (s.state0.data == nullptr || s.state1.data == nullptr) {
        return invalid_argument("adamw_step: needs exp_avg and exp_avg_sq buffers");
      }
      if (same_master_desc(s, true, true)) {
        const host_optimizer::AdamW<T> adamw(p, step);
        const auto n = static_cast<std::size_t>(s.param.desc.numel());
        for (std::size_t i = 0; i < n; ++i) {
          T w = get_elem<T>(s.param, i);
          // The first step starts both moments from zero.
          T m = step > 1 ? get_elem<T>(s.state0, i) : T{0};
          T v = step > 1 ? get_elem<T>(s.state1, i) : T{0};
          adamw.update(w, m, v, get_elem<T>(s.grad, i));
          set_elem(s.param, i, w);
          set_elem(s.state0, i, m);
          set_elem(s.state1, i, v);
        }
        continue;
      }
      DLPROBE_ASSIGN_OR_RETURN(HostTensor param, load_as<T>(s.param));
      DLPROBE_ASSIGN_OR_RETURN(HostTensor grad, load_as<T>(s.grad));
      reference::AdamWState state;
      state.step = step - 1;
      if (step > 1) {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor m, load_as<T>(s.state0));
        DLPROBE_ASSIGN_OR_RETURN(HostTensor v, load_as<T>(s.state1));
        state.exp_avg = std::move(m);
        state.exp_avg_sq = std::move(v);
      }
      DLPROBE_ASSIGN_OR_RETURN(reference::AdamWStep out,
                               reference::adamw_step<T>(param, grad, state, p));
      DLPROBE_RETURN_IF_ERROR(store(std::move(out.param), s.param));
      DLPROBE_RETURN_IF_ERROR(store(std::move(*out.state.exp_avg), s.state0));
      DLPROBE_RETURN_IF_ERROR(store(std::move(*out.state.exp_avg_sq), s.state1));
    }
    return Status::ok();
  }

  Status advance_step(const TensorView& counters, const GradScalerOptions* scaler,
                      const TensorView& found_inf) override {
    DLPROBE_RETURN_IF_ERROR(step_counters_check("advance_step", counters));
    host_optimizer::advance_counters(counters, flag_set(found_inf), scaler);
    return Status::ok();
  }

 private:
  int streams_;
  bool keeps_normalised_;
  std::size_t next_ticket_ = 0;
  std::deque<std::pair<std::size_t, std::function<Status()>>> late_;  // stream 1's, not joined

  // Two optional operands that come together: both with data or neither.
  static Status check_pair(std::string_view op, std::string_view a_name, const TensorView& a,
                           std::string_view b_name, const TensorView& b) {
    if ((a.data == nullptr) == (b.data == nullptr)) return Status::ok();
    return invalid_argument(fmt::format("{}: {} and {} come together", op, a_name, b_name));
  }
  // (x - mean) * invstd * gamma + beta per channel in T, x already in T: the forward's formula.
  static Result<HostTensor> normalise(const HostTensor& x, const TensorView& gamma,
                                      const TensorView& beta, const TensorView& save_mean,
                                      const TensorView& save_invstd) {
    if (x.desc().rank() != 4 || gamma.desc.numel() != x.desc().dim(1)) {
      return invalid_argument(
          fmt::format("batch norm: gamma {} does not fit x {}", gamma.desc.str(), x.desc().str()));
    }
    HostTensor out(x.desc());
    const std::span<const T> in = x.values<T>();
    const std::span<T> values = out.values<T>();
    for_each_channel(x.desc(), [&](std::int64_t i, std::int64_t c) {
      const auto k = static_cast<std::size_t>(i);
      values[k] = (in[k] - static_cast<T>(read_elem(save_mean, c))) *
                      static_cast<T>(read_elem(save_invstd, c)) *
                      static_cast<T>(read_elem(gamma, c)) +
                  static_cast<T>(read_elem(beta, c));
    });
    return out;
  }
  // relu(x * scale + bias) per channel in T, rounded to x's dtype and layout.
  static Result<HostTensor> prologue(std::string_view op, const TensorView& x,
                                     const TensorView& scale, const TensorView& bias) {
    if (x.desc.rank() != 4 || scale.data == nullptr || bias.data == nullptr ||
        scale.desc.numel() != x.desc.dim(1) || bias.desc.numel() != x.desc.dim(1)) {
      return invalid_argument(
          fmt::format("{}: scale and bias need one value per channel of x {}", op, x.desc.str()));
    }
    HostTensor out(x.desc);
    const TensorView v = out.view();
    for_each_channel(x.desc, [&](std::int64_t i, std::int64_t c) {
      const T a = static_cast<T>(read_elem(x, i)) * static_cast<T>(read_elem(scale, c)) +
                  static_cast<T>(read_elem(bias, c));
      write_elem(v, i, static_cast<double>(std::max(a, T{0})));
    });
    return out;
  }
  // The batch-norm output as the plain slots store it (`relu_input` null), or under the fused
  // slots relu(bn + residual), or relu(bn) for a residual without data, in the compute type.
  static Result<HostTensor> epilogue(HostTensor bn, const TensorView* relu_input) {
    if (relu_input == nullptr) return bn;
    if (relu_input->data != nullptr) {
      DLPROBE_ASSIGN_OR_RETURN(HostTensor r, load_as<T>(*relu_input));
      DLPROBE_ASSIGN_OR_RETURN(bn, reference::add<T>(bn, r));
    }
    return reference::relu_forward<T>(bn);
  }
  // A batch norm's input and per-channel tensors, loaded in T.
  struct BnOperands {
    HostTensor x, gamma, beta, running_mean, running_var;
  };
  static Result<BnOperands> load_bn(const TensorView& x, const TensorView& gamma,
                                    const TensorView& beta, const TensorView& running_mean,
                                    const TensorView& running_var) {
    BnOperands o;
    DLPROBE_ASSIGN_OR_RETURN(o.x, load_as<T>(x));
    DLPROBE_ASSIGN_OR_RETURN(o.gamma, load_as<T>(gamma));
    DLPROBE_ASSIGN_OR_RETURN(o.beta, load_as<T>(beta));
    DLPROBE_ASSIGN_OR_RETURN(o.running_mean, load_as<T>(running_mean));
    DLPROBE_ASSIGN_OR_RETURN(o.running_var, load_as<T>(running_var));
    return o;
  }
  static Status bn_train(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                         const TensorView& running_mean, const TensorView& running_var,
                         const TensorView& y, const TensorView& save_mean,
                         const TensorView& save_invstd, const BatchNormParams& p,
                         const TensorView* relu_input) {
    DLPROBE_ASSIGN_OR_RETURN(BnOperands o, load_bn(x, gamma, beta, running_mean, running_var));
    DLPROBE_ASSIGN_OR_RETURN(reference::BatchNormTrainOutput out,
                             reference::batch_norm_train_forward<T>(
                                 o.x, o.gamma, o.beta, o.running_mean, o.running_var, p));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out_y, epilogue(std::move(out.y), relu_input));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out_y), y));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.save_mean), save_mean));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.save_invstd), save_invstd));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.running_mean), running_mean));
    return store(std::move(out.running_var), running_var);
  }
  static Status bn_inference(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                             const TensorView& running_mean, const TensorView& running_var,
                             const TensorView& y, const BatchNormParams& p,
                             const TensorView* relu_input) {
    DLPROBE_ASSIGN_OR_RETURN(BnOperands o, load_bn(x, gamma, beta, running_mean, running_var));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out,
                             reference::batch_norm_inference_forward<T>(
                                 o.x, o.gamma, o.beta, o.running_mean, o.running_var, p));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor out_y, epilogue(std::move(out), relu_input));
    return store(std::move(out_y), y);
  }
  // Batch norm's backward from the gradient of its output, already in the compute type.
  static Status bn_backward(const HostTensor& dyt, const TensorView& x, const TensorView& gamma,
                            const TensorView& save_mean, const TensorView& save_invstd,
                            const TensorView& dx, const TensorView& dgamma,
                            const TensorView& dbeta) {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor xt, load_as<T>(x));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor g, load_as<T>(gamma));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor sm, load_as<T>(save_mean));
    DLPROBE_ASSIGN_OR_RETURN(HostTensor si, load_as<T>(save_invstd));
    DLPROBE_ASSIGN_OR_RETURN(reference::BatchNormGrads out,
                             reference::batch_norm_backward<T>(dyt, xt, g, sm, si));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.dx), dx));
    DLPROBE_RETURN_IF_ERROR(store(std::move(out.dgamma), dgamma));
    return store(std::move(out.dbeta), dbeta);
  }
};

}  // namespace

Result<std::unique_ptr<Backend>> make_reference_backend(DType compute, int streams,
                                                        bool keeps_normalised) {
  if (streams != 1 && streams != 2) {
    return invalid_argument(
        fmt::format("the reference backend has one or two streams, not {}", streams));
  }
  if (compute == DType::fp32) {
    return std::unique_ptr<Backend>(new ReferenceBackend<float>(streams, keeps_normalised));
  }
  if (compute == DType::fp64) {
    return std::unique_ptr<Backend>(new ReferenceBackend<double>(streams, keeps_normalised));
  }
  return invalid_argument(
      fmt::format("the reference backend computes in fp32 or fp64, not {}", dtype_name(compute)));
}

}  // namespace dlprobe
