#include "dlprobe/engine/cpu_backend.h"

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <source_location>
#include <string>
#include <unordered_map>
#include <utility>

#include "dlprobe/core/check.h"
#include "engine/backends/cpu/cpu_loops.h"
#include "engine/backends/host_backend.h"
#include "engine/backends/host_optimizer.h"

namespace dlprobe {
namespace {

using Mem = dnnl::memory;
using Args = std::unordered_map<int, Mem>;

// A oneDNN call threw: the C++ API reports failure only by dnnl::error. "unimplemented" means no
// implementation takes this combination of shapes, layouts and dtypes on this CPU.
Status dnnl_failure(std::string_view op, const dnnl::error& e, const std::source_location& at) {
  return api_failure("oneDNN", op, e.what(), at.file_name(), static_cast<int>(at.line()),
                     e.status == dnnl_unimplemented ? Errc::unsupported : Errc::api_error);
}

// Runs one slot's body, turning a oneDNN exception into a Status (no exception leaves the library).
template <class F>
Status guarded(std::string_view op, F&& body,
               const std::source_location& at = std::source_location::current()) {
  try {
    return body();
  } catch (const dnnl::error& e) {
    return dnnl_failure(op, e, at);
  }
}

Mem::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::fp32:
      return Mem::data_type::f32;
    case DType::bf16:
      return Mem::data_type::bf16;
    case DType::fp16:
      return Mem::data_type::f16;
    case DType::fp64:
    case DType::int32:
    case DType::int64:
      break;
  }
  return Mem::data_type::undef;
}

// A tensor's dims and strides as they are: oneDNN reads NCHW, NHWC and plain row-major through
// the same strided descriptor, so no layout tag has to be picked.
Mem::desc md(const TensorDesc& d) {
  Mem::dims dims;
  Mem::dims strides;
  for (int i = 0; i < d.rank(); ++i) {
    dims.push_back(d.dim(i));
    strides.push_back(d.stride(i));
  }
  return {dims, dnnl_type(d.dtype()), strides};
}

// Convolution weights [K, C/g, R, S] (KRSC in memory for NHWC); grouped ones as oneDNN's
// [g, K/g, C/g, R, S] over the same memory.
Mem::dims weight_dims(const TensorDesc& w, std::int64_t groups) {
  if (groups == 1) return {w.dim(0), w.dim(1), w.dim(2), w.dim(3)};
  return {groups, w.dim(0) / groups, w.dim(1), w.dim(2), w.dim(3)};
}
Mem::desc weights_md(const TensorDesc& w, std::int64_t groups) {
  if (groups == 1) return md(w);
  return {weight_dims(w, groups),
          dnnl_type(w.dtype()),
          {w.dim(0) / groups * w.stride(0), w.stride(0), w.stride(1), w.stride(2), w.stride(3)}};
}

// [N, C] as [N, C, 1, 1] in the layout of the 4-d tensor it pools (the same memory either way),
// so that pooling sees source and destination in one format.
Mem::desc pooled_md(const TensorDesc& y, Layout layout) {
  const std::int64_t c = y.dim(1);
  Mem::dims strides = layout == Layout::nhwc ? Mem::dims{c, 1, c, c} : Mem::dims{c, 1, 1, 1};
  return {{y.dim(0), c, 1, 1}, dnnl_type(y.dtype()), strides};
}

Mem::desc channel_md(std::int64_t channels) {
  return {{channels}, Mem::data_type::f32, {1}};
}

dnnl::primitive_attr make_attr() {
  dnnl::primitive_attr attr;
  // Scratch memory comes from our allocator, so `dlprobe memory` sees it.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // fp32 stays fp32: no implicit bf16 math even where the CPU would be faster with it. (oneDNN
  // 2.6's nearest relaxation to TF32, fpmath bf16, drops 13 more mantissa bits than TF32 does.)
  attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
  return attr;
}

std::string conv_key(const Conv2dParams& p) {
  return fmt::format("s{}x{} p{}x{} d{}x{} g{}", p.stride[0], p.stride[1], p.pad[0], p.pad[1],
                     p.dilation[0], p.dilation[1], p.groups);
}

std::string_view isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse4.1";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::all:
      break;
  }
  return "no vector extension oneDNN uses";
}

// oneDNN 2.6 computes bf16 on avx512_core and newer (emulating the bf16 instructions where the CPU
// lacks AVX512_BF16); below that no primitive accepts it.
bool isa_runs_bf16(dnnl::cpu_isa isa) {
  return isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
         isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

// A created primitive with what running it needs. Convolutions also keep the layout their
// primitive wants the weights in and the reorder between that and the caller's KCRS/KRSC.
struct Prim {
  Prim(dnnl::primitive p, Mem::desc s) : prim(std::move(p)), scratchpad(std::move(s)) {}
  dnnl::primitive prim;
  Mem::desc scratchpad;
  Mem::desc weights;
  dnnl::primitive
      weights_reorder;  // empty when the primitive takes the caller's weights as they are
  Mem::desc reorder_scratchpad;
};

const dnnl::normalization_flags kScaleShift =
    dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;

class CpuBackend final : public HostBackend {
 public:
  explicit CpuBackend(memory::CachingAllocator& allocator)
      : allocator_(allocator),
        engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_),
        isa_(dnnl::get_effective_cpu_isa()) {
    // Off: the backend keeps every primitive it made (cached() below, keyed with the layout),
    // and oneDNN's own cache, the process's, handed a sweep's configuration the primitives made
    // for the one before it: over 1x1 images an NCHW and an NHWC tensor are one descriptor to it,
    // and NHWC then ran NCHW's kernels (and workspace) rather than what it runs alone.
    dnnl::set_primitive_cache_capacity(0);
  }

  std::string_view name() const override { return "cpu"; }
  Status synchronize() override {
    return guarded("synchronize", [&] {
      stream_.wait();
      return Status::ok();
    });
  }

  Status fill(const TensorView& t, double value) override { return cpu::fill(t, value); }

  Status cast(const TensorView& src, const TensorView& dst) override {
    constexpr std::string_view op = "cast";
    return guarded(op, [&]() -> Status {
      for (const TensorView* t : {&src, &dst}) {
        if (dnnl_type(t->desc.dtype()) == Mem::data_type::undef) {
          return invalid_argument(fmt::format(
              "cpu backend: cast: {} is not one of fp32, bf16, fp16", dtype_name(t->desc.dtype())));
        }
      }
      DLPROBE_RETURN_IF_ERROR(need_same_shape(op, src.desc, dst.desc));
      Prim& p = cached(fmt::format("cast {} {}", src.desc.str(), dst.desc.str()), [&] {
        dnnl::reorder::primitive_desc pd(engine_, md(src.desc), engine_, md(dst.desc), make_attr());
        return Prim{dnnl::reorder(pd), pd.scratchpad_desc()};
      });
      return run(
          op, p.prim, p.scratchpad,
          {{DNNL_ARG_FROM, user(src.desc, src.data)}, {DNNL_ARG_TO, user(dst.desc, dst.data)}});
    });
  }

  Status conv2d_forward(const TensorView& x, const TensorView& w, const TensorView& y,
                        const Conv2dParams& p) override {
    return conv_reading_weights<dnnl::convolution_forward>(
        "conv2d_forward", "conv_fwd", x, DNNL_ARG_SRC, w, y, DNNL_ARG_DST, p,
        [&] { return conv_forward_pd(x.desc, w.desc, y.desc, p); });
  }

  Status conv2d_backward_data(const TensorView& dy, const TensorView& w, const TensorView& dx,
                              const Conv2dParams& p) override {
    return conv_reading_weights<dnnl::convolution_backward_data>(
        "conv2d_backward_data", "conv_bwd_data", dy, DNNL_ARG_DIFF_DST, w, dx, DNNL_ARG_DIFF_SRC, p,
        [&] {
          return conv_backward_pd<dnnl::convolution_backward_data>(dx.desc, w.desc, dy.desc, p);
        });
  }

  Status conv2d_backward_weight(const TensorView& x, const TensorView& dy, const TensorView& dw,
                                const Conv2dParams& p) override {
    constexpr std::string_view op = "conv2d_backward_weight";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&x.desc, &dy.desc, &dw.desc}));
      Prim& prim = cached(
          fmt::format("conv_bwd_weight {} {} {} {}", x.desc.str(), dy.desc.str(), dw.desc.str(),
                      conv_key(p)),
          [&] {
            const auto pd =
                conv_backward_pd<dnnl::convolution_backward_weights>(x.desc, dw.desc, dy.desc, p);
            Prim e{dnnl::convolution_backward_weights(pd), pd.scratchpad_desc()};
            with_weights_reorder(e, weights_md(dw.desc, p.groups), pd.diff_weights_desc(), false);
            return e;
          });
      const Mem user_dw(weights_md(dw.desc, p.groups), engine_, dw.data);
      memory::DeviceBuffer wbuf;
      Mem dwm = user_dw;
      if (prim.weights_reorder) {
        DLPROBE_ASSIGN_OR_RETURN(wbuf, scratch(op, prim.weights.get_size()));
        dwm = Mem(prim.weights, engine_, wbuf.data());
      }
      DLPROBE_RETURN_IF_ERROR(run(op, prim.prim, prim.scratchpad,
                                  {{DNNL_ARG_SRC, user(x.desc, x.data)},
                                   {DNNL_ARG_DIFF_DST, user(dy.desc, dy.data)},
                                   {DNNL_ARG_DIFF_WEIGHTS, dwm}}));
      if (!prim.weights_reorder) return Status::ok();
      return run(op, prim.weights_reorder, prim.reorder_scratchpad,
                 {{DNNL_ARG_FROM, dwm}, {DNNL_ARG_TO, user_dw}});
    });
  }

  Status batch_norm_train_forward(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, const TensorView& running_mean,
                                  const TensorView& running_var, const TensorView& y,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const BatchNormParams& p) override {
    constexpr std::string_view op = "batch_norm_train_forward";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&running_mean.desc, &running_var.desc}));
      // oneDNN writes the batch mean and the biased variance; the variance goes into save_invstd
      // and is turned into invstd below, so no temporary is needed.
      DLPROBE_RETURN_IF_ERROR(bn_forward(op, dnnl::prop_kind::forward_training, x, gamma, beta,
                                         save_mean, save_invstd, y, p.eps));
      // PyTorch's running statistics, in double as its CPU kernel accumulates them: momentum
      // blend, and the unbiased variance (times m / (m - 1)) for running_var.
      const std::int64_t channels = x.desc.dim(1);
      const auto count = static_cast<double>(x.desc.dim(0) * x.desc.dim(2) * x.desc.dim(3));
      auto* mean = static_cast<const float*>(save_mean.data);
      auto* invstd = static_cast<float*>(save_invstd.data);
      auto* rm = static_cast<float*>(running_mean.data);
      auto* rv = static_cast<float*>(running_var.data);
      for (std::int64_t c = 0; c < channels; ++c) {
        const double var = invstd[c];
        invstd[c] = static_cast<float>(1.0 / std::sqrt(var + p.eps));
        rm[c] = static_cast<float>((1.0 - p.momentum) * rm[c] + p.momentum * mean[c]);
        rv[c] = static_cast<float>((1.0 - p.momentum) * rv[c] +
                                   p.momentum * var * count / (count - 1.0));
      }
      return Status::ok();
    });
  }

  Status batch_norm_inference_forward(const TensorView& x, const TensorView& gamma,
                                      const TensorView& beta, const TensorView& running_mean,
                                      const TensorView& running_var, const TensorView& y,
                                      const BatchNormParams& p) override {
    constexpr std::string_view op = "batch_norm_inference_forward";
    return guarded(op, [&]() -> Status {
      return bn_forward(op, dnnl::prop_kind::forward_inference, x, gamma, beta, running_mean,
                        running_var, y, p.eps);
    });
  }

  Status batch_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                             const TensorView& save_mean, const TensorView& save_invstd,
                             const TensorView& dx, const TensorView& dgamma,
                             const TensorView& dbeta) override {
    constexpr std::string_view op = "batch_norm_backward";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&dy.desc, &x.desc, &dx.desc}));
      DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "dx", dx.desc, dy.desc));
      DLPROBE_RETURN_IF_ERROR(need_fp32(
          op, {&gamma.desc, &save_mean.desc, &save_invstd.desc, &dgamma.desc, &dbeta.desc}));
      // oneDNN wants the variance and eps and uses 1/sqrt(var + eps); what was saved is invstd
      // and the slot has no eps. With eps 0 in the descriptor and var = 1/invstd^2 it computes the
      // saved invstd again (to rounding).
      Prim& prim = cached(fmt::format("bn_backward {} {}", dy.desc.str(), x.desc.str()), [&] {
        auto hint = bn_forward_pd(x.desc, dnnl::prop_kind::forward_training, 0.0f, kScaleShift);
        dnnl::batch_normalization_backward::primitive_desc pd(
            {dnnl::prop_kind::backward, md(dy.desc), md(x.desc), 0.0f, kScaleShift}, make_attr(),
            engine_, hint);
        return Prim{dnnl::batch_normalization_backward(pd), pd.scratchpad_desc()};
      });
      const std::int64_t channels = x.desc.dim(1);
      DLPROBE_ASSIGN_OR_RETURN(memory::DeviceBuffer var_buf,
                               scratch(op, static_cast<std::size_t>(channels) * sizeof(float)));
      auto* var = static_cast<float*>(var_buf.data());
      const auto* invstd = static_cast<const float*>(save_invstd.data);
      for (std::int64_t c = 0; c < channels; ++c) {
        const double s = invstd[c];
        var[c] = static_cast<float>(1.0 / (s * s));
      }
      return run(op, prim.prim, prim.scratchpad,
                 {{DNNL_ARG_SRC, user(x.desc, x.data)},
                  {DNNL_ARG_MEAN, channel(channels, save_mean.data)},
                  {DNNL_ARG_VARIANCE, channel(channels, var)},
                  {DNNL_ARG_DIFF_DST, user(dy.desc, dy.data)},
                  {DNNL_ARG_SCALE, channel(channels, gamma.data)},
                  // oneDNN 2.6 refuses to run the backward without a shift argument although
                  // the gradients do not depend on beta; gamma stands in, read-only and unused.
                  {DNNL_ARG_SHIFT, channel(channels, gamma.data)},
                  {DNNL_ARG_DIFF_SRC, user(dx.desc, dx.data)},
                  {DNNL_ARG_DIFF_SCALE, channel(channels, dgamma.data)},
                  {DNNL_ARG_DIFF_SHIFT, channel(channels, dbeta.data)}});
    });
  }

  // The fused slots: oneDNN's batch norm, then one pass of our own for the residual sum and the
  // ReLU (oneDNN 2.6's fused ReLU flag turns NaN into 0 as its eltwise does, and takes no
  // residual). Against the separate slots this saves the add's and the ReLU's passes over the
  // activation in forward, and the add's in backward (relu_backward_add).
  bool fuses_batch_norm_relu() const override { return true; }
  Status batch_norm_relu_train_forward(const TensorView& x, const TensorView& gamma,
                                       const TensorView& beta, const TensorView& running_mean,
                                       const TensorView& running_var, const TensorView& residual,
                                       const TensorView& y, const TensorView& save_mean,
                                       const TensorView& save_invstd,
                                       const BatchNormParams& p) override {
    DLPROBE_RETURN_IF_ERROR(need_residual("batch_norm_relu_train_forward", residual, y));
    DLPROBE_RETURN_IF_ERROR(batch_norm_train_forward(x, gamma, beta, running_mean, running_var, y,
                                                     save_mean, save_invstd, p));
    cpu::add_relu_in_place(y, residual);
    return Status::ok();
  }
  Status batch_norm_relu_inference_forward(const TensorView& x, const TensorView& gamma,
                                           const TensorView& beta, const TensorView& running_mean,
                                           const TensorView& running_var,
                                           const TensorView& residual, const TensorView& y,
                                           const BatchNormParams& p) override {
    DLPROBE_RETURN_IF_ERROR(need_residual("batch_norm_relu_inference_forward", residual, y));
    DLPROBE_RETURN_IF_ERROR(
        batch_norm_inference_forward(x, gamma, beta, running_mean, running_var, y, p));
    cpu::add_relu_in_place(y, residual);
    return Status::ok();
  }
  Status batch_norm_relu_backward(const TensorView& dy, const TensorView& y, const TensorView& x,
                                  const TensorView& gamma, const TensorView& /*beta*/,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const TensorView& dx, const TensorView& dgamma,
                                  const TensorView& dbeta) override {
    constexpr std::string_view op = "batch_norm_relu_backward";
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&dy.desc, &y.desc, &x.desc, &dx.desc}));
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "y", y.desc, dy.desc));
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "dx", dx.desc, dy.desc));
    // The ReLU's gradient goes into dx, which oneDNN's backward then reads and overwrites in
    // place; into scratch instead where dx is x's memory, which the backward still reads.
    memory::DeviceBuffer buffer;
    TensorView masked = dx;
    if (dx.data == x.data) {
      DLPROBE_ASSIGN_OR_RETURN(buffer, scratch(op, dx.desc.bytes()));
      masked.data = buffer.data();
    }
    cpu::relu_backward(dy, y, masked);
    return batch_norm_backward(masked, x, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  }

  bool fuses_relu_backward_add() const override { return true; }
  Status relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                           const TensorView& dx) override {
    constexpr std::string_view op = "relu_backward_add";
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&a.desc, &b.desc, &y.desc, &dx.desc}));
    for (const auto& [what, t] : {std::pair{"a", &a}, std::pair{"b", &b}, std::pair{"y", &y}}) {
      DLPROBE_RETURN_IF_ERROR(need_same_desc(op, what, t->desc, dx.desc));
    }
    cpu::relu_backward_add(a, b, y, dx);
    return Status::ok();
  }

  Status relu_forward(const TensorView& x, const TensorView& y) override {
    constexpr std::string_view op = "relu_forward";
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&x.desc, &y.desc}));
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "y", y.desc, x.desc));
    cpu::relu_forward(x, y);
    return Status::ok();
  }

  Status relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx) override {
    constexpr std::string_view op = "relu_backward";
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&dy.desc, &y.desc, &dx.desc}));
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "y", y.desc, dy.desc));
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "dx", dx.desc, dy.desc));
    cpu::relu_backward(dy, y, dx);
    return Status::ok();
  }

  Status max_pool2d_forward(const TensorView& x, const TensorView& y,
                            const MaxPool2dParams& p) override {
    constexpr std::string_view op = "max_pool2d_forward";
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&x.desc, &y.desc}));
    cpu::max_pool2d_forward(x, y, p);
    return Status::ok();
  }

  Status max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& y,
                             const TensorView& dx, const MaxPool2dParams& p) override {
    constexpr std::string_view op = "max_pool2d_backward";
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&dy.desc, &x.desc, &y.desc, &dx.desc}));
    memory::DeviceBuffer accum;
    std::span<float> accum_span;
    if (dx.desc.dtype() == DType::bf16) {
      const auto count = static_cast<std::size_t>(dx.desc.numel());
      DLPROBE_ASSIGN_OR_RETURN(accum, scratch(op, count * sizeof(float)));
      accum_span = {static_cast<float*>(accum.data()), count};
    }
    cpu::max_pool2d_backward(dy, x, dx, p, accum_span);
    return Status::ok();
  }

  Status add(const TensorView& a, const TensorView& b, const TensorView& y) override {
    constexpr std::string_view op = "add";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&a.desc, &b.desc, &y.desc}));
      // oneDNN runs in place only over its first source; the sum is the same either way round.
      const bool swap = y.data == b.data && y.data != a.data;
      const TensorView& s0 = swap ? b : a;
      const TensorView& s1 = swap ? a : b;
      Prim& prim =
          cached(fmt::format("add {} {} {}", s0.desc.str(), s1.desc.str(), y.desc.str()), [&] {
            dnnl::binary::primitive_desc pd(
                {dnnl::algorithm::binary_add, md(s0.desc), md(s1.desc), md(y.desc)}, make_attr(),
                engine_);
            return Prim{dnnl::binary(pd), pd.scratchpad_desc()};
          });
      return run(op, prim.prim, prim.scratchpad,
                 {{DNNL_ARG_SRC_0, user(s0.desc, s0.data)},
                  {DNNL_ARG_SRC_1, user(s1.desc, s1.data)},
                  {DNNL_ARG_DST, user(y.desc, y.data)}});
    });
  }

  Status global_avg_pool_forward(const TensorView& x, const TensorView& y) override {
    constexpr std::string_view op = "global_avg_pool_forward";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&x.desc, &y.desc}));
      Prim& prim = cached(fmt::format("gap_fwd {} {}", x.desc.str(), y.desc.str()), [&] {
        auto pd = avg_pool_forward_pd(x.desc, y.desc);
        return Prim{dnnl::pooling_forward(pd), pd.scratchpad_desc()};
      });
      return run(op, prim.prim, prim.scratchpad,
                 {{DNNL_ARG_SRC, user(x.desc, x.data)},
                  {DNNL_ARG_DST, Mem(pooled_md(y.desc, x.desc.layout()), engine_, y.data)}});
    });
  }

  Status global_avg_pool_backward(const TensorView& dy, const TensorView& dx) override {
    constexpr std::string_view op = "global_avg_pool_backward";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&dy.desc, &dx.desc}));
      Prim& prim = cached(fmt::format("gap_bwd {} {}", dy.desc.str(), dx.desc.str()), [&] {
        auto hint = avg_pool_forward_pd(dx.desc, dy.desc);
        const Mem::dims window{dx.desc.dim(2), dx.desc.dim(3)};
        dnnl::pooling_backward::primitive_desc pd({dnnl::algorithm::pooling_avg_exclude_padding,
                                                   md(dx.desc),
                                                   pooled_md(dy.desc, dx.desc.layout()),
                                                   window,
                                                   window,
                                                   {0, 0},
                                                   {0, 0}},
                                                  make_attr(), engine_, hint);
        return Prim{dnnl::pooling_backward(pd), pd.scratchpad_desc()};
      });
      return run(op, prim.prim, prim.scratchpad,
                 {{DNNL_ARG_DIFF_DST, Mem(pooled_md(dy.desc, dx.desc.layout()), engine_, dy.data)},
                  {DNNL_ARG_DIFF_SRC, user(dx.desc, dx.data)}});
    });
  }

  Status linear_forward(const TensorView& x, const TensorView& w, const TensorView& b,
                        const TensorView& y) override {
    constexpr std::string_view op = "linear_forward";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&x.desc, &w.desc, &b.desc, &y.desc}));
      Prim& prim =
          cached(fmt::format("linear_fwd {} {} {}", x.desc.str(), w.desc.str(), y.desc.str()), [&] {
            auto pd = linear_forward_pd(x.desc, w.desc, b.desc, y.desc);
            return Prim{dnnl::inner_product_forward(pd), pd.scratchpad_desc()};
          });
      return run(op, prim.prim, prim.scratchpad,
                 {{DNNL_ARG_SRC, user(x.desc, x.data)},
                  {DNNL_ARG_WEIGHTS, user(w.desc, w.data)},
                  {DNNL_ARG_BIAS, user(b.desc, b.data)},
                  {DNNL_ARG_DST, user(y.desc, y.data)}});
    });
  }

  Status linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                         const TensorView& dx, const TensorView& dw,
                         const TensorView& db) override {
    constexpr std::string_view op = "linear_backward";
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(
          need_compute_dtype(op, {&dy.desc, &x.desc, &w.desc, &dx.desc, &dw.desc, &db.desc}));
      const std::string shapes =
          fmt::format("{} {} {} {}", dy.desc.str(), x.desc.str(), w.desc.str(), db.desc.str());
      Prim& data = cached("linear_bwd_data " + shapes + " " + dx.desc.str(), [&] {
        auto hint = linear_forward_pd(dx.desc, w.desc, db.desc, dy.desc);
        dnnl::inner_product_backward_data::primitive_desc pd({md(dx.desc), md(w.desc), md(dy.desc)},
                                                             make_attr(), engine_, hint);
        return Prim{dnnl::inner_product_backward_data(pd), pd.scratchpad_desc()};
      });
      Prim& weights = cached("linear_bwd_weights " + shapes + " " + dw.desc.str(), [&] {
        auto hint = linear_forward_pd(x.desc, dw.desc, db.desc, dy.desc);
        dnnl::inner_product_backward_weights::primitive_desc pd(
            {md(x.desc), md(dw.desc), md(db.desc), md(dy.desc)}, make_attr(), engine_, hint);
        return Prim{dnnl::inner_product_backward_weights(pd), pd.scratchpad_desc()};
      });
      DLPROBE_RETURN_IF_ERROR(run(op, data.prim, data.scratchpad,
                                  {{DNNL_ARG_DIFF_DST, user(dy.desc, dy.data)},
                                   {DNNL_ARG_WEIGHTS, user(w.desc, w.data)},
                                   {DNNL_ARG_DIFF_SRC, user(dx.desc, dx.data)}}));
      return run(op, weights.prim, weights.scratchpad,
                 {{DNNL_ARG_SRC, user(x.desc, x.data)},
                  {DNNL_ARG_DIFF_DST, user(dy.desc, dy.data)},
                  {DNNL_ARG_DIFF_WEIGHTS, user(dw.desc, dw.data)},
                  {DNNL_ARG_DIFF_BIAS, user(db.desc, db.data)}});
    });
  }

  Status cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                               const TensorView& loss) override {
    constexpr std::string_view op = "cross_entropy_forward";
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&logits.desc, &loss.desc}));
    DLPROBE_RETURN_IF_ERROR(need_labels(op, labels.desc));
    return cpu::cross_entropy_forward(logits, labels, loss);
  }

  Status cross_entropy_backward(const TensorView& logits, const TensorView& labels,
                                const TensorView& counters, const TensorView& dlogits) override {
    constexpr std::string_view op = "cross_entropy_backward";
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&logits.desc, &dlogits.desc}));
    DLPROBE_RETURN_IF_ERROR(need_labels(op, labels.desc));
    DLPROBE_ASSIGN_OR_RETURN(const double scale, host_optimizer::loss_scale_of(op, counters));
    return cpu::cross_entropy_backward(logits, labels, scale, dlogits);
  }

  Status unscale_gradients(std::span<const TensorView> grads, const TensorView& counters,
                           const TensorView& found_inf) override {
    constexpr std::string_view op = "unscale_gradients";
    DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&found_inf.desc}));
    for (const TensorView& g : grads) DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&g.desc}));
    cpu::unscale_gradients(grads, 1.0 / host_optimizer::read_counters(counters).loss_scale,
                           found_inf);
    return Status::ok();
  }

  Status sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p,
                  const TensorView& counters, const TensorView& found_inf) override {
    DLPROBE_RETURN_IF_ERROR(sgd_check(p));
    DLPROBE_RETURN_IF_ERROR(
        need_optimizer_step("sgd_step", slots, counters, found_inf, p.momentum != 0.0, false));
    if (!cpu::step_skipped(found_inf)) {
      cpu::sgd_step(slots, p, host_optimizer::step_of(counters));
    }
    return Status::ok();
  }

  Status adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p,
                    const TensorView& counters, const TensorView& found_inf) override {
    DLPROBE_RETURN_IF_ERROR(adamw_check(p));
    DLPROBE_RETURN_IF_ERROR(
        need_optimizer_step("adamw_step", slots, counters, found_inf, true, true));
    if (!cpu::step_skipped(found_inf)) {
      cpu::adamw_step(slots, p, host_optimizer::step_of(counters));
    }
    return Status::ok();
  }

  Status advance_step(const TensorView& counters, const GradScalerOptions* scaler,
                      const TensorView& found_inf) override {
    constexpr std::string_view op = "advance_step";
    DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
    if (found_inf.data != nullptr) DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&found_inf.desc}));
    host_optimizer::advance_counters(counters, cpu::step_skipped(found_inf), scaler);
    return Status::ok();
  }

 private:
  // ---- dtype and argument checks (shapes were checked by the caller, see backend.h) ----

  // The dtypes convolution, batch norm, pooling, ReLU, add and linear compute in: all of `ts` the
  // same, fp32, or bf16 where the CPU runs it.
  Status need_compute_dtype(std::string_view op,
                            std::initializer_list<const TensorDesc*> ts) const {
    const DType t = (*ts.begin())->dtype();
    for (const TensorDesc* d : ts) {
      if (d->dtype() != t) {
        return invalid_argument(fmt::format("cpu backend: {}: operands mix {} and {}", op,
                                            dtype_name(t), dtype_name(d->dtype())));
      }
    }
    switch (t) {
      case DType::fp32:
        return Status::ok();
      case DType::bf16:
        if (isa_runs_bf16(isa_)) return Status::ok();
        return error(Errc::unsupported,
                     fmt::format("cpu backend: {}: bf16 needs a CPU with AVX-512 (oneDNN 2.6 runs "
                                 "bf16 on avx512_core or newer), this CPU offers {}; use fp32",
                                 op, isa_name(isa_)));
      case DType::fp16:
        return error(Errc::unsupported,
                     fmt::format("cpu backend: {}: fp16 is not supported on CPU (oneDNN 2.6 "
                                 "computes fp16 only on AVX512-FP16 CPUs, and PyTorch's CPU "
                                 "autocast uses bf16); use fp32 or bf16",
                                 op));
      case DType::fp64:
      case DType::int32:
      case DType::int64:
        break;
    }
    return invalid_argument(
        fmt::format("cpu backend: {}: {} is not a compute dtype", op, dtype_name(t)));
  }

  static Status need_fp32(std::string_view op, std::initializer_list<const TensorDesc*> ts) {
    for (const TensorDesc* d : ts) {
      if (d->dtype() != DType::fp32) {
        return invalid_argument(fmt::format("cpu backend: {}: {} must be fp32", op, d->str()));
      }
    }
    return Status::ok();
  }

  static Status need_residual(std::string_view op, const TensorView& residual,
                              const TensorView& y) {
    if (residual.data == nullptr) return Status::ok();
    return need_same_desc(op, "residual", residual.desc, y.desc);
  }

  static Status need_labels(std::string_view op, const TensorDesc& labels) {
    if (labels.dtype() == DType::int32 || labels.dtype() == DType::int64) return Status::ok();
    return invalid_argument(fmt::format("cpu backend: {}: labels must be int32 or int64, got {}",
                                        op, dtype_name(labels.dtype())));
  }

  static Status need_same_desc(std::string_view op, std::string_view what, const TensorDesc& got,
                               const TensorDesc& want) {
    if (got == want) return Status::ok();
    return invalid_argument(
        fmt::format("cpu backend: {}: {} is {}, oneDNN needs {}", op, what, got.str(), want.str()));
  }

  static Status need_same_shape(std::string_view op, const TensorDesc& a, const TensorDesc& b) {
    return same_shape_check(fmt::format("cpu backend: {}", op), a.shape(), b.shape());
  }

  // An optimizer step's arguments: the step counters, the flag, and each slot's parameter, gradient
  // and the states the optimizer keeps (`state0`, `state1`).
  static Status need_optimizer_step(std::string_view op, std::span<const OptimizerSlot> slots,
                                    const TensorView& counters, const TensorView& found_inf,
                                    bool state0, bool state1) {
    DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
    if (found_inf.data != nullptr) DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&found_inf.desc}));
    for (const OptimizerSlot& s : slots) {
      DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&s.param.desc}));
      DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "grad", s.grad.desc, s.param.desc));
      for (auto [needed, state] : {std::pair{state0, &s.state0}, std::pair{state1, &s.state1}}) {
        if (!needed) continue;
        if (state->data == nullptr) {
          return invalid_argument(
              fmt::format("cpu backend: {}: parameter {} has no optimizer state buffer", op,
                          s.param.desc.str()));
        }
        DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "optimizer state", state->desc, s.param.desc));
      }
    }
    return Status::ok();
  }

  // ---- oneDNN helpers ----

  Mem user(const TensorDesc& d, const void* data) const {
    // oneDNN takes one non-const handle for inputs and outputs alike; it never writes inputs.
    return {md(d), engine_, const_cast<void*>(data)};
  }
  Mem channel(std::int64_t channels, const void* data) const {
    return {channel_md(channels), engine_, const_cast<void*>(data)};
  }

  Result<memory::DeviceBuffer> scratch(std::string_view op, std::size_t bytes) {
    return allocator_.allocate_buffer(bytes, memory::Category::workspace, op);
  }

  // Creates the primitive for `key` on first use and keeps it: creating one (primitive descriptor
  // search, JIT code generation) costs far more than running it on ResNet's small tensors, and the
  // engine calls each shape every step.
  Prim& cached(const std::string& key, const std::function<Prim()>& make) {
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, make()).first;
    return it->second;
  }

  // Runs `prim` with a scratchpad from the allocator, and waits: the scratchpad is freed on return.
  Status run(std::string_view op, const dnnl::primitive& prim, const Mem::desc& scratchpad,
             Args args) {
    memory::DeviceBuffer buffer;
    if (const std::size_t bytes = scratchpad.get_size(); bytes > 0) {
      DLPROBE_ASSIGN_OR_RETURN(buffer, scratch(op, bytes));
      args.insert({DNNL_ARG_SCRATCHPAD, Mem(scratchpad, engine_, buffer.data())});
    }
    prim.execute(stream_, args);
    stream_.wait();
    return Status::ok();
  }

  static Mem::dims strides(const Conv2dParams& p) { return {p.stride[0], p.stride[1]}; }
  // oneDNN counts dilation from 0 (no dilation), PyTorch from 1.
  static Mem::dims dilates(const Conv2dParams& p) { return {p.dilation[0] - 1, p.dilation[1] - 1}; }
  // Right padding equal to the left, as PyTorch pads: oneDNN, like PyTorch, rounds the output
  // size down, so rows the stride never reaches are simply not read.
  static Mem::dims pads(const Conv2dParams& p) { return {p.pad[0], p.pad[1]}; }

  // Weights in whatever layout the primitive prefers: with the caller's KCRS or KRSC, oneDNN 2.6
  // has only its reference convolution (an order of magnitude slower) on AVX2 CPUs, while a
  // blocked layout gets the JIT kernels; the reorder costs one pass over the weights.
  static Mem::desc any_weights(const TensorDesc& w, std::int64_t groups) {
    return {weight_dims(w, groups), dnnl_type(w.dtype()), Mem::format_tag::any};
  }

  dnnl::convolution_forward::primitive_desc conv_forward_pd(const TensorDesc& x,
                                                            const TensorDesc& w,
                                                            const TensorDesc& y,
                                                            const Conv2dParams& p) const {
    return {{dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, md(x),
             any_weights(w, p.groups), md(y), strides(p), dilates(p), pads(p), pads(p)},
            make_attr(),
            engine_};
  }

  // The convolution passes that read the weights (forward, backward data): `Pass` from the
  // primitive descriptor `make_pd` builds, between the activations (or gradients) `in` and `out`
  // under their oneDNN argument ids; `kind` names the pass in the primitive cache.
  template <class Pass, class MakePd>
  Status conv_reading_weights(std::string_view op, std::string_view kind, const TensorView& in,
                              int in_arg, const TensorView& w, const TensorView& out, int out_arg,
                              const Conv2dParams& p, const MakePd& make_pd) {
    return guarded(op, [&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&in.desc, &w.desc, &out.desc}));
      Prim& prim =
          cached(fmt::format("{} {} {} {} {}", kind, in.desc.str(), w.desc.str(), out.desc.str(),
                             conv_key(p)),
                 [&] {
                   const auto pd = make_pd();
                   Prim e{Pass(pd), pd.scratchpad_desc()};
                   with_weights_reorder(e, weights_md(w.desc, p.groups), pd.weights_desc(), true);
                   return e;
                 });
      memory::DeviceBuffer wbuf;
      DLPROBE_ASSIGN_OR_RETURN(Mem wm, weights_in(op, prim, w, p.groups, wbuf));
      return run(op, prim.prim, prim.scratchpad,
                 {{in_arg, user(in.desc, in.data)},
                  {DNNL_ARG_WEIGHTS, wm},
                  {out_arg, user(out.desc, out.data)}});
    });
  }

  // A convolution backward pass (`Pass`: convolution_backward_data or _weights) over the shapes
  // of the forward that hints it, as oneDNN requires.
  template <class Pass>
  typename Pass::primitive_desc conv_backward_pd(const TensorDesc& x, const TensorDesc& w,
                                                 const TensorDesc& y, const Conv2dParams& p) const {
    return {{dnnl::algorithm::convolution_direct, md(x), any_weights(w, p.groups), md(y),
             strides(p), dilates(p), pads(p), pads(p)},
            make_attr(),
            engine_,
            conv_forward_pd(x, w, y, p)};
  }

  // Sets up the reorder between the caller's weights and the primitive's, when they differ:
  // into the primitive's layout for forward and backward data, out of it for backward weights.
  void with_weights_reorder(Prim& e, const Mem::desc& caller, const Mem::desc& wanted,
                            bool into_primitive) const {
    e.weights = wanted;
    if (caller == wanted) return;
    const Mem::desc& from = into_primitive ? caller : wanted;
    const Mem::desc& to = into_primitive ? wanted : caller;
    dnnl::reorder::primitive_desc pd(engine_, from, engine_, to, make_attr());
    e.weights_reorder = dnnl::reorder(pd);
    e.reorder_scratchpad = pd.scratchpad_desc();
  }

  // The weights as the primitive takes them: the caller's memory, or a reordered copy in `buffer`.
  Result<Mem> weights_in(std::string_view op, const Prim& prim, const TensorView& w,
                         std::int64_t groups, memory::DeviceBuffer& buffer) {
    Mem caller(weights_md(w.desc, groups), engine_, w.data);
    if (!prim.weights_reorder) return caller;
    DLPROBE_ASSIGN_OR_RETURN(buffer, scratch(op, prim.weights.get_size()));
    Mem reordered(prim.weights, engine_, buffer.data());
    DLPROBE_RETURN_IF_ERROR(run(op, prim.weights_reorder, prim.reorder_scratchpad,
                                {{DNNL_ARG_FROM, caller}, {DNNL_ARG_TO, reordered}}));
    return reordered;
  }

  // Both forwards' oneDNN pass: y = gamma (x - mean) / sqrt(var + eps) + beta per channel, where
  // training writes the batch's mean and biased variance into `mean` and `var` and inference
  // reads the running statistics from them.
  Status bn_forward(std::string_view op, dnnl::prop_kind kind, const TensorView& x,
                    const TensorView& gamma, const TensorView& beta, const TensorView& mean,
                    const TensorView& var, const TensorView& y, double eps) {
    DLPROBE_RETURN_IF_ERROR(need_compute_dtype(op, {&x.desc, &y.desc}));
    DLPROBE_RETURN_IF_ERROR(need_same_desc(op, "y", y.desc, x.desc));
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, {&gamma.desc, &beta.desc, &mean.desc, &var.desc}));
    const bool training = kind == dnnl::prop_kind::forward_training;
    Prim& prim = cached(
        fmt::format("bn_{} {} eps{}", training ? "train" : "inference", x.desc.str(), eps), [&] {
          auto pd = bn_forward_pd(
              x.desc, kind, static_cast<float>(eps),
              training ? kScaleShift : kScaleShift | dnnl::normalization_flags::use_global_stats);
          return Prim{dnnl::batch_normalization_forward(pd), pd.scratchpad_desc()};
        });
    const std::int64_t channels = x.desc.dim(1);
    return run(op, prim.prim, prim.scratchpad,
               {{DNNL_ARG_SRC, user(x.desc, x.data)},
                {DNNL_ARG_DST, user(y.desc, y.data)},
                {DNNL_ARG_SCALE, channel(channels, gamma.data)},
                {DNNL_ARG_SHIFT, channel(channels, beta.data)},
                {DNNL_ARG_MEAN, channel(channels, mean.data)},
                {DNNL_ARG_VARIANCE, channel(channels, var.data)}});
  }

  dnnl::batch_normalization_forward::primitive_desc bn_forward_pd(
      const TensorDesc& x, dnnl::prop_kind kind, float eps, dnnl::normalization_flags flags) const {
    return {{kind, md(x), eps, flags}, make_attr(), engine_};
  }

  dnnl::pooling_forward::primitive_desc avg_pool_forward_pd(const TensorDesc& x,
                                                            const TensorDesc& y) const {
    const Mem::dims window{x.dim(2), x.dim(3)};
    return {{dnnl::prop_kind::forward_training,
             dnnl::algorithm::pooling_avg_exclude_padding,
             md(x),
             pooled_md(y, x.layout()),
             window,
             window,
             {0, 0},
             {0, 0}},
            make_attr(),
            engine_};
  }

  dnnl::inner_product_forward::primitive_desc linear_forward_pd(const TensorDesc& x,
                                                                const TensorDesc& w,
                                                                const TensorDesc& b,
                                                                const TensorDesc& y) const {
    return {{dnnl::prop_kind::forward_training, md(x), md(w), md(b), md(y)}, make_attr(), engine_};
  }

  memory::CachingAllocator& allocator_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::cpu_isa isa_;
  std::unordered_map<std::string, Prim> cache_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cpu_backend(memory::CachingAllocator& allocator) {
  try {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(allocator));
  } catch (const dnnl::error& e) {
    return dnnl_failure("make_cpu_backend", e, std::source_location::current());
  }
}

}  // namespace dlprobe
