// The op cases of the backend op test: every slot of the Backend interface, in the shapes, values
// and settings that reach the backends' branches (strides that skip input, padding on both sides,
// dilation, groups and depthwise, 1x1 and non-square kernels; odd sizes, 16-byte packs and NHWC
// channel tiles; ties in pooling windows; logits that overflow without the max shift; a
// parameter 4 bytes into its buffer), each in both layouts where it has a layout. The reference
// of every output is the reference functions (src/engine/backends/reference/reference.h) in fp64,
// which tests/engine/reference_*_test.cpp check against formulas, hand-worked cases and finite
// differences.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <span>

#include "backend_ops.h"
#include "engine/backends/reference/reference.h"
#include "test_util.h"

namespace dlprobe::testing {
namespace {

constexpr Layout kLayouts[] = {Layout::nchw, Layout::nhwc};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

HostTensor uniform(const Shape& s, std::uint64_t seed, Layout l = Layout::nchw, double lo = -1.0,
                   double hi = 1.0) {
  return rand(s, seed, DType::fp64, l, lo, hi);
}

HostTensor filled(const Shape& s, double value, Layout l = Layout::nchw) {
  HostTensor t(desc(s, DType::fp64, s.rank == 4 ? l : Layout::nchw));
  t.fill(value);
  return t;
}

// A step's counters as the fp64 [4] tensor (step_counters_desc()) the backends read.
HostTensor counters_tensor(const StepCounters& c) {
  HostTensor t(step_counters_desc());
  t.set(0, c.loss_scale);
  t.set(1, c.last_loss_scale);
  t.set(2, c.growth_tracker);
  t.set(3, c.steps_taken);
  return t;
}

// `t` rounded to `dtype`, in fp64.
HostTensor rounded(const HostTensor& t, DType dtype) {
  return t.to_dtype(dtype).value().to_dtype(DType::fp64).value();
}

std::string label(const Shape& s, Layout l) {
  return fmt::format("{} {}", s.str(), layout_name(l));
}

Variant variant(std::string name, Precision p) {
  return Variant{std::move(name), OpTensors(p), {}, {}, {}};
}

// ---- convolutions ----

struct ConvShape {
  Shape x;
  Shape w;
  Conv2dParams p;
};

// ResNet's layers (3x3, the 1x1 downsample with stride 2 on an odd size so that the last row and
// column go unread, the 7x7 stem, also on four channels and one, odd, not square: the CUDA
// backend's bf16 stem route) and the branches beyond them: groups, depthwise, dilation,
// asymmetric stride, padding and dilation, a stride longer than the kernel.
const ConvShape kConvShapes[] = {
    {{2, 8, 7, 6}, {16, 8, 3, 3}, {}},
    {{2, 8, 7, 7}, {12, 8, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
    {{2, 8, 6, 6}, {8, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 4}},
    {{1, 6, 8, 8}, {6, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 6}},
    {{1, 4, 9, 9}, {6, 4, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}},
    {{2, 6, 9, 8}, {4, 3, 3, 2}, {{2, 1}, {1, 0}, {1, 2}, 2}},
    {{1, 3, 16, 16}, {8, 3, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
    {{2, 16, 12, 12}, {24, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}},
    {{2, 16, 11, 11}, {32, 16, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
    {{2, 3, 20, 20}, {8, 3, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
    {{2, 16, 9, 9}, {16, 4, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 4}},
    {{2, 3, 5, 5}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}},
    {{1, 2, 9, 9}, {3, 2, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
    {{2, 4, 6, 6}, {5, 4, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
    {{1, 2, 7, 6}, {2, 2, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}},
    {{2, 6, 5, 5}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}},
    {{1, 4, 7, 7}, {4, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 4}},
    {{2, 2, 6, 8}, {3, 2, 2, 3}, {{2, 1}, {0, 1}, {1, 2}, 1}},
    {{1, 1, 8, 8}, {2, 1, 2, 2}, {{3, 3}, {0, 0}, {1, 1}, 1}},
    {{1, 4, 11, 8}, {5, 4, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
    {{2, 1, 9, 10}, {3, 1, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
};

std::string conv_label(const ConvShape& c, Layout l) {
  return fmt::format("x {} w {} stride {}x{} pad {}x{} dilation {}x{} groups {} {}", c.x.str(),
                     c.w.str(), c.p.stride[0], c.p.stride[1], c.p.pad[0], c.p.pad[1],
                     c.p.dilation[0], c.p.dilation[1], c.p.groups, layout_name(l));
}

std::vector<Variant> conv_forward(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 100;
  for (const ConvShape& c : kConvShapes) {
    for (Layout l : kLayouts) {
      Variant v = variant(conv_label(c, l), precision);
      v.tensors.input("x", uniform(c.x, seed += 10, l));
      v.tensors.input("w", uniform(c.w, seed + 1, l));
      v.tensors.output("y", conv2d_output_shape(c.x, c.w, c.p).value(), l);
      v.checks = {{"y", {.terms = static_cast<double>(c.w[1] * c.w[2] * c.w[3])}}};
      v.run = [p = c.p](Backend& b, BackendTensors& t) {
        return b.conv2d_forward(t["x"], t["w"], t["y"], p);
      };
      v.reference = [p = c.p](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor y,
                                 reference::conv2d_forward<double>(t["x"], t["w"], p));
        return Values{{"y", std::move(y)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::vector<Variant> conv_backward_data(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 300;
  for (const ConvShape& c : kConvShapes) {
    for (Layout l : kLayouts) {
      Variant v = variant(conv_label(c, l), precision);
      v.tensors.input("dy", uniform(conv2d_output_shape(c.x, c.w, c.p).value(), seed += 10, l));
      v.tensors.input("w", uniform(c.w, seed + 1, l));
      v.tensors.output("dx", c.x, l);
      v.checks = {{"dx", {.terms = static_cast<double>(c.w[0] / c.p.groups * c.w[2] * c.w[3])}}};
      v.run = [p = c.p](Backend& b, BackendTensors& t) {
        return b.conv2d_backward_data(t["dy"], t["w"], t["dx"], p);
      };
      v.reference = [c, l](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(
            HostTensor dx, reference::conv2d_backward_data<double>(t["dy"], t["w"],
                                                                   desc(c.x, DType::fp64, l), c.p));
        return Values{{"dx", std::move(dx)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::vector<Variant> conv_backward_weight(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 500;
  for (const ConvShape& c : kConvShapes) {
    for (Layout l : kLayouts) {
      const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
      Variant v = variant(conv_label(c, l), precision);
      v.tensors.input("x", uniform(c.x, seed += 10, l));
      v.tensors.input("dy", uniform(ys, seed + 1, l));
      v.tensors.output("dw", c.w, l);
      v.checks = {{"dw", {.terms = static_cast<double>(ys[0] * ys[2] * ys[3])}}};
      v.run = [p = c.p](Backend& b, BackendTensors& t) {
        return b.conv2d_backward_weight(t["x"], t["dy"], t["dw"], p);
      };
      v.reference = [c, l](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor dw,
                                 reference::conv2d_backward_weight<double>(
                                     t["x"], t["dy"], desc(c.w, DType::fp64, l), c.p));
        return Values{{"dw", std::move(dw)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// ---- batch norm ----

// Small odd shapes (one element a thread), one split and many (channel reductions), NHWC channel
// tiles of 8 to 256 packs (2048 channels: two tiles in fp32).
const Shape kBatchNormShapes[] = {{3, 5, 4, 3},   {3, 4, 5, 2},   {4, 3, 3, 3},    {2, 6, 5, 4},
                                  {4, 3, 5, 2},   {3, 5, 7, 9},   {8, 64, 28, 28}, {16, 40, 6, 6},
                                  {4, 256, 9, 9}, {2, 2048, 3, 3}};
// ResNet-50's at batch 32 (Offers::gpu_sized_batch_norm), NHWC: on an H200 the first takes the
// one-launch fp16 and bf16 backward 8 rows deep (and the fp32 forward 16 deep), the second the
// fp16 and bf16 forward 16 deep, the third three launches in every dtype; the fourth as many
// elements in 1024 channels, three launches over four channel tiles in fp16 and bf16.
const Shape kGpuSizedBatchNormShapes[] = {
    {32, 128, 28, 28}, {32, 64, 56, 56}, {32, 256, 56, 56}, {8, 1024, 56, 56}};
constexpr Layout kNhwc[] = {Layout::nhwc};

// Values per channel: the statistics are sums over this many.
double per_channel(const Shape& s) {
  return static_cast<double>(s[0] * s[2] * s[3]);
}

// Per-channel inputs of a training forward: gamma, beta and the running statistics, which the
// forward updates in place.
void batch_norm_parameters(OpTensors& t, const Shape& s, std::uint64_t seed) {
  const Shape c{s[1]};
  t.input("gamma", uniform(c, seed, Layout::nchw, 0.5, 1.5), Role::fp32);
  t.input("beta", uniform(c, seed + 1), Role::fp32);
  t.input("running_mean", uniform(c, seed + 2), Role::fp32);
  t.input("running_var", uniform(c, seed + 3, Layout::nchw, 0.5, 2.0), Role::fp32);
}

// The training forward's outputs over input shape `s`; `y` of shape `ys` (s unless a max pool
// follows in the same call).
void batch_norm_train_outputs(Variant& v, const Shape& s, Layout l, const Shape& ys) {
  v.tensors.output("y", ys, l);
  v.tensors.output("save_mean", Shape{s[1]}, Layout::nchw, Role::fp32);
  v.tensors.output("save_invstd", Shape{s[1]}, Layout::nchw, Role::fp32);
  // Every output rests on sums over a channel's values.
  const Check sums{.terms = per_channel(s)};
  v.checks = {{"y", sums},
              {"save_mean", sums},
              {"save_invstd", sums},
              {"running_mean", sums},
              {"running_var", sums}};
}

constexpr BatchNormParams kTrain{1e-5, 0.1};
constexpr BatchNormParams kInference{1e-3, 0.1};

// y = relu(y + residual), or relu(y) without one, in fp64.
Result<HostTensor> add_relu(HostTensor y, const HostTensor* residual) {
  if (residual != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(y, reference::add<double>(y, *residual));
  }
  return reference::relu_forward<double>(y);
}

// The reference's training forward outputs, with `y` for its output.
Values train_forward_values(reference::BatchNormTrainOutput r, HostTensor y) {
  return Values{{"y", std::move(y)},
                {"save_mean", std::move(r.save_mean)},
                {"save_invstd", std::move(r.save_invstd)},
                {"running_mean", std::move(r.running_mean)},
                {"running_var", std::move(r.running_var)}};
}

std::vector<Variant> batch_norm_train(Precision precision, bool fused, bool residual,
                                      std::span<const Shape> shapes = kBatchNormShapes,
                                      std::span<const Layout> layouts = kLayouts) {
  std::vector<Variant> out;
  std::uint64_t seed = fused ? 1500 : 1000;
  for (const Shape& s : shapes) {
    for (Layout l : layouts) {
      Variant v = variant(label(s, l), precision);
      // An offset mean (2 +- 1) checks that the variance does not cancel; the fused forward's
      // values straddle 0, where the ReLU cuts.
      v.tensors.input(
          "x", fused ? uniform(s, seed += 10, l, -1.0, 3.0) : uniform(s, seed += 10, l, 1.0, 3.0));
      batch_norm_parameters(v.tensors, s, seed + 1);
      if (residual) v.tensors.input("residual", uniform(s, seed + 5, l));
      batch_norm_train_outputs(v, s, l, s);
      v.run = [fused, residual](Backend& b, BackendTensors& t) {
        if (!fused) {
          return b.batch_norm_train_forward(t["x"], t["gamma"], t["beta"], t["running_mean"],
                                            t["running_var"], t["y"], t["save_mean"],
                                            t["save_invstd"], kTrain);
        }
        return b.batch_norm_relu_train_forward(t["x"], t["gamma"], t["beta"], t["running_mean"],
                                               t["running_var"],
                                               residual ? t["residual"] : TensorView{}, t["y"],
                                               t["save_mean"], t["save_invstd"], kTrain);
      };
      v.reference = [fused, residual](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(
            reference::BatchNormTrainOutput r,
            reference::batch_norm_train_forward<double>(
                t["x"], t["gamma"], t["beta"], t["running_mean"], t["running_var"], kTrain));
        if (fused) {
          DLPROBE_ASSIGN_OR_RETURN(r.y,
                                   add_relu(std::move(r.y), residual ? &t["residual"] : nullptr));
        }
        HostTensor y = std::move(r.y);
        return train_forward_values(std::move(r), std::move(y));
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::vector<Variant> batch_norm_inference(Precision precision, bool fused, bool residual) {
  std::vector<Variant> out;
  std::uint64_t seed = fused ? 2500 : 2000;
  for (const Shape& s : {Shape{2, 4, 3, 3}, Shape{4, 24, 5, 7}, Shape{2, 3, 2, 2}}) {
    for (Layout l : kLayouts) {
      Variant v = variant(label(s, l), precision);
      v.tensors.input("x", uniform(s, seed += 10, l, -2.0, 2.0));
      const Shape c{s[1]};
      v.tensors.input("gamma", uniform(c, seed + 1), Role::fp32);
      v.tensors.input("beta", uniform(c, seed + 2), Role::fp32);
      v.tensors.input("running_mean", uniform(c, seed + 3), Role::fp32);
      v.tensors.input("running_var", uniform(c, seed + 4, Layout::nchw, 0.2, 2.0), Role::fp32);
      if (residual) v.tensors.input("residual", uniform(s, seed + 5, l));
      v.tensors.output("y", s, l);
      v.checks = {{"y", {}}};
      v.run = [fused, residual](Backend& b, BackendTensors& t) {
        if (!fused) {
          return b.batch_norm_inference_forward(t["x"], t["gamma"], t["beta"], t["running_mean"],
                                                t["running_var"], t["y"], kInference);
        }
        return b.batch_norm_relu_inference_forward(
            t["x"], t["gamma"], t["beta"], t["running_mean"], t["running_var"],
            residual ? t["residual"] : TensorView{}, t["y"], kInference);
      };
      v.reference = [fused, residual](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor y, reference::batch_norm_inference_forward<double>(
                                                   t["x"], t["gamma"], t["beta"], t["running_mean"],
                                                   t["running_var"], kInference));
        if (fused) {
          DLPROBE_ASSIGN_OR_RETURN(y, add_relu(std::move(y), residual ? &t["residual"] : nullptr));
        }
        return Values{{"y", std::move(y)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// The backward from the statistics the training forward saved for x (in fp32, as it saves
// them); fused, the backward of relu(bn(x)) with the ReLU's mask taken from y as stored.
// With `stored_y` false the fused backward gets no y, as where a convolution applied the pair,
// and must recompute the mask.
std::vector<Variant> batch_norm_backward(Precision precision, bool fused,
                                         std::span<const Shape> shapes = kBatchNormShapes,
                                         std::span<const Layout> layouts = kLayouts,
                                         bool stored_y = true) {
  std::vector<Variant> out;
  std::uint64_t seed = fused ? 3500 : 3000;
  for (const Shape& s : shapes) {
    for (Layout l : layouts) {
      Variant v = variant(label(s, l), precision);
      const Shape c{s[1]};
      const HostTensor& x = v.tensors.input("x", uniform(s, seed += 10, l, -2.0, 3.0));
      v.tensors.input("dy", uniform(s, seed + 1, l));
      const HostTensor& gamma =
          v.tensors.input("gamma", uniform(c, seed + 2, Layout::nchw, 0.5, 1.5), Role::fp32);
      const HostTensor& beta = v.tensors.input("beta", uniform(c, seed + 3), Role::fp32);
      const auto fwd =
          reference::batch_norm_train_forward<double>(x, gamma, beta, beta, gamma, kTrain).value();
      v.tensors.input("save_mean", fwd.save_mean, Role::fp32);
      v.tensors.input("save_invstd", fwd.save_invstd, Role::fp32);
      if (fused) v.tensors.input("y", reference::relu_forward<double>(fwd.y).value());
      v.tensors.output("dx", s, l);
      v.tensors.output("dgamma", c, Layout::nchw, Role::fp32);
      v.tensors.output("dbeta", c, Layout::nchw, Role::fp32);
      const Check sums{.terms = per_channel(s)};
      v.checks = {{"dx", sums}, {"dgamma", sums}, {"dbeta", sums}};
      v.run = [fused, stored_y](Backend& b, BackendTensors& t) {
        if (!fused) {
          return b.batch_norm_backward(t["dy"], t["x"], t["gamma"], t["save_mean"],
                                       t["save_invstd"], t["dx"], t["dgamma"], t["dbeta"]);
        }
        return b.batch_norm_relu_backward(t["dy"], stored_y ? t["y"] : TensorView{}, t["x"],
                                          t["gamma"], t["beta"], t["save_mean"], t["save_invstd"],
                                          t["dx"], t["dgamma"], t["dbeta"]);
      };
      v.reference = [fused](const OpTensors& t) -> Result<Values> {
        HostTensor dy = t["dy"];
        if (fused) {
          DLPROBE_ASSIGN_OR_RETURN(dy, reference::relu_backward<double>(dy, t["y"]));
        }
        DLPROBE_ASSIGN_OR_RETURN(reference::BatchNormGrads g,
                                 reference::batch_norm_backward<double>(
                                     dy, t["x"], t["gamma"], t["save_mean"], t["save_invstd"]));
        return Values{{"dx", std::move(g.dx)},
                      {"dgamma", std::move(g.dgamma)},
                      {"dbeta", std::move(g.dbeta)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// A block output's two batch norms from their one gradient (batch_norm_add_backward): x's and
// r's gradients, each against its own backward's in fp64.
std::vector<Variant> batch_norm_add_backward(Precision precision, std::span<const Shape> shapes,
                                             std::span<const Layout> layouts) {
  std::vector<Variant> out;
  std::uint64_t seed = 5300;
  for (const Shape& s : shapes) {
    for (Layout l : layouts) {
      Variant v = variant(label(s, l), precision);
      const Shape c{s[1]};
      v.tensors.input("dy", uniform(s, seed += 10, l));
      for (const char* side : {"", "r_"}) {
        const std::string p = side;
        const HostTensor& x = v.tensors.input(p.empty() ? "x" : "r",
                                              uniform(s, ++seed, l, p.empty() ? -2.0 : -1.0, 3.0));
        const HostTensor& gamma =
            v.tensors.input(p + "gamma", uniform(c, ++seed, Layout::nchw, 0.5, 1.5), Role::fp32);
        const HostTensor& beta = v.tensors.input(p + "beta", uniform(c, ++seed), Role::fp32);
        const auto fwd =
            reference::batch_norm_train_forward<double>(x, gamma, beta, beta, gamma, kTrain)
                .value();
        v.tensors.input(p + "save_mean", fwd.save_mean, Role::fp32);
        v.tensors.input(p + "save_invstd", fwd.save_invstd, Role::fp32);
        v.tensors.output(p.empty() ? "dx" : "dr", s, l);
        v.tensors.output(p + "dgamma", c, Layout::nchw, Role::fp32);
        v.tensors.output(p + "dbeta", c, Layout::nchw, Role::fp32);
      }
      const Check sums{.terms = per_channel(s)};
      v.checks = {{"dx", sums}, {"dgamma", sums},   {"dbeta", sums},
                  {"dr", sums}, {"r_dgamma", sums}, {"r_dbeta", sums}};
      v.run = [](Backend& b, BackendTensors& t) {
        return b.batch_norm_add_backward(
            t["dy"],
            {t["x"], t["gamma"], t["save_mean"], t["save_invstd"], t["dx"], t["dgamma"],
             t["dbeta"]},
            {t["r"], t["r_gamma"], t["r_save_mean"], t["r_save_invstd"], t["dr"], t["r_dgamma"],
             t["r_dbeta"]});
      };
      v.reference = [](const OpTensors& t) -> Result<Values> {
        Values want;
        for (const char* side : {"", "r_"}) {
          const std::string p = side;
          DLPROBE_ASSIGN_OR_RETURN(reference::BatchNormGrads g,
                                   reference::batch_norm_backward<double>(
                                       t["dy"], t[p.empty() ? "x" : "r"], t[p + "gamma"],
                                       t[p + "save_mean"], t[p + "save_invstd"]));
          want.emplace(p.empty() ? "dx" : "dr", std::move(g.dx));
          want.emplace(p + "dgamma", std::move(g.dgamma));
          want.emplace(p + "dbeta", std::move(g.dbeta));
        }
        return want;
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// ---- batch norm around the convolutions ----

// x's per-channel sum and sum of squares, as a convolution's statistics epilogue gives them.
struct ChannelSums {
  HostTensor sum;
  HostTensor sqsum;
};

ChannelSums sums_of(const HostTensor& x) {
  const Shape& s = x.desc().shape();
  ChannelSums out{filled(Shape{s[1]}, 0.0), filled(Shape{s[1]}, 0.0)};
  for_each_index(s, [&](std::array<std::int64_t, 4> i) {
    const double e = x.get(x.desc().offset(i[0], i[1], i[2], i[3]));
    out.sum.set(i[1], out.sum.get(i[1]) + e);
    out.sqsum.set(i[1], out.sqsum.get(i[1]) + e * e);
  });
  return out;
}

// The finalize from a channel's sum and sum of squares (fp32, as a convolution's epilogue gives
// them) against the training forward's two-pass statistics of the same values; with the
// prologue, also scale = gamma * invstd and bias = beta - mean * scale in the activation dtype.
// An offset mean (2 +- 1) checks that the sums' variance does not cancel.
std::vector<Variant> batch_norm_finalize(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 4000;
  for (const Shape& s : {Shape{2, 4, 3, 3}, Shape{4, 24, 5, 7}}) {
    for (const bool prologue : {false, true}) {
      Variant v = variant(s.str() + (prologue ? " with prologue" : ""), precision);
      const Shape c{s[1]};
      const HostTensor x = uniform(s, seed += 10, Layout::nchw, 1.0, 3.0);
      ChannelSums xs = sums_of(x);
      v.tensors.input("sum", std::move(xs.sum), Role::fp32);
      v.tensors.input("sqsum", std::move(xs.sqsum), Role::fp32);
      batch_norm_parameters(v.tensors, s, seed + 1);
      v.tensors.output("save_mean", c, Layout::nchw, Role::fp32);
      v.tensors.output("save_invstd", c, Layout::nchw, Role::fp32);
      const Check sums{.terms = per_channel(s)};
      v.checks = {{"save_mean", sums},
                  {"save_invstd", sums},
                  {"running_mean", sums},
                  {"running_var", sums}};
      if (prologue) {
        v.tensors.output("scale", c);
        v.tensors.output("bias", c);
        v.checks.insert(v.checks.end(), {{"scale", sums}, {"bias", sums}});
      }
      const std::int64_t count = static_cast<std::int64_t>(per_channel(s));
      v.run = [prologue, count](Backend& b, BackendTensors& t) {
        return b.batch_norm_finalize({t["sum"], t["sqsum"], count, t["gamma"], t["beta"],
                                      t["running_mean"], t["running_var"], t["save_mean"],
                                      t["save_invstd"], prologue ? t["scale"] : TensorView{},
                                      prologue ? t["bias"] : TensorView{}, kTrain});
      };
      v.reference = [x, prologue](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(
            reference::BatchNormTrainOutput r,
            reference::batch_norm_train_forward<double>(x, t["gamma"], t["beta"], t["running_mean"],
                                                        t["running_var"], kTrain));
        Values want;
        if (prologue) {
          HostTensor scale = r.save_invstd;
          HostTensor bias = r.save_invstd;
          for (std::int64_t ch = 0; ch < scale.numel(); ++ch) {
            scale.set(ch, t["gamma"].get(ch) * r.save_invstd.get(ch));
            bias.set(ch, t["beta"].get(ch) - r.save_mean.get(ch) * scale.get(ch));
          }
          want["scale"] = std::move(scale);
          want["bias"] = std::move(bias);
        }
        want["save_mean"] = std::move(r.save_mean);
        want["save_invstd"] = std::move(r.save_invstd);
        want["running_mean"] = std::move(r.running_mean);
        want["running_var"] = std::move(r.running_var);
        return want;
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// The elementwise pass's three forms over every batch-norm shape and layout: plain, with the
// ReLU, and with the residual and the ReLU. make(v, x, relu, residual, seed) fills a variant
// named for its shape, layout and form, which holds its input x.
template <class Make>
std::vector<Variant> apply_forms(Precision precision, std::uint64_t seed, Make&& make) {
  std::vector<Variant> out;
  for (const Shape& s : kBatchNormShapes) {
    for (Layout l : kLayouts) {
      for (const int form : {0, 1, 2}) {
        const bool relu = form > 0;
        const bool residual = form == 2;
        Variant v = variant(label(s, l) + (residual ? " +residual relu"
                                           : relu   ? " relu"
                                                    : ""),
                            precision);
        const HostTensor& x = v.tensors.input("x", uniform(s, seed += 10, l, -1.0, 3.0));
        make(v, x, relu, residual, seed);
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

// The finalize and the elementwise pass in one call, from x's sums (fp32, as a convolution's
// epilogue gives them): the statistics and y against the training forward's. An offset mean
// (1 +- 2) for the variance's sake.
std::vector<Variant> batch_norm_finalize_apply(Precision precision) {
  return apply_forms(
      precision, 4300,
      [](Variant& v, const HostTensor& x, bool relu, bool residual, std::uint64_t seed) {
        const Shape& s = x.desc().shape();
        ChannelSums xs = sums_of(x);
        v.tensors.input("sum", std::move(xs.sum), Role::fp32);
        v.tensors.input("sqsum", std::move(xs.sqsum), Role::fp32);
        batch_norm_parameters(v.tensors, s, seed + 1);
        if (residual) v.tensors.input("residual", uniform(s, seed + 5, x.desc().layout()));
        batch_norm_train_outputs(v, s, x.desc().layout(), s);
        const auto count = static_cast<std::int64_t>(per_channel(s));
        v.run = [relu, residual, count](Backend& b, BackendTensors& t) {
          const Backend::BatchNormFinalize f{t["sum"],         t["sqsum"],     count,
                                             t["gamma"],       t["beta"],      t["running_mean"],
                                             t["running_var"], t["save_mean"], t["save_invstd"],
                                             TensorView{},     TensorView{},   kTrain};
          return b.batch_norm_finalize_apply(f, t["x"], residual ? t["residual"] : TensorView{},
                                             t["y"], relu);
        };
        v.reference = [x, relu, residual](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(
              reference::BatchNormTrainOutput r,
              reference::batch_norm_train_forward<double>(
                  x, t["gamma"], t["beta"], t["running_mean"], t["running_var"], kTrain));
          HostTensor y = std::move(r.y);
          if (relu) {
            DLPROBE_ASSIGN_OR_RETURN(y,
                                     add_relu(std::move(y), residual ? &t["residual"] : nullptr));
          }
          return Values{{"y", std::move(y)},
                        {"save_mean", std::move(r.save_mean)},
                        {"save_invstd", std::move(r.save_invstd)},
                        {"running_mean", std::move(r.running_mean)},
                        {"running_var", std::move(r.running_var)}};
        };
      });
}

// The training forward's elementwise pass from given statistics (those the forward of x saves).
std::vector<Variant> batch_norm_apply(Precision precision) {
  return apply_forms(
      precision, 4500,
      [](Variant& v, const HostTensor& x, bool relu, bool residual, std::uint64_t seed) {
        const Shape& s = x.desc().shape();
        batch_norm_parameters(v.tensors, s, seed + 1);
        const auto fwd = reference::batch_norm_train_forward<double>(
                             x, v.tensors["gamma"], v.tensors["beta"], v.tensors["running_mean"],
                             v.tensors["running_var"], kTrain)
                             .value();
        v.tensors.input("save_mean", fwd.save_mean, Role::fp32);
        v.tensors.input("save_invstd", fwd.save_invstd, Role::fp32);
        if (residual) v.tensors.input("residual", uniform(s, seed + 5, x.desc().layout()));
        v.tensors.output("y", s, x.desc().layout());
        v.checks = {{"y", {}}};
        v.run = [relu, residual](Backend& b, BackendTensors& t) {
          return b.batch_norm_apply(t["x"], t["gamma"], t["beta"], t["save_mean"], t["save_invstd"],
                                    residual ? t["residual"] : TensorView{}, t["y"], relu);
        };
        v.reference = [relu, residual, y = fwd.y](const OpTensors& t) -> Result<Values> {
          HostTensor want = y;
          if (relu) {
            DLPROBE_ASSIGN_OR_RETURN(
                want, add_relu(std::move(want), residual ? &t["residual"] : nullptr));
          }
          return Values{{"y", std::move(want)}};
        };
      });
}

// A block output's two batch-norm inputs over every batch-norm shape and layout: make(v, x, r,
// seed) fills a variant named for its shape and layout, which holds x (mean 1) and r (mean -0.5).
template <class Make>
std::vector<Variant> apply_add_cases(Precision precision, std::uint64_t seed, Make&& make) {
  std::vector<Variant> out;
  for (const Shape& s : kBatchNormShapes) {
    for (Layout l : kLayouts) {
      Variant v = variant(label(s, l), precision);
      const HostTensor& x = v.tensors.input("x", uniform(s, seed += 10, l, -1.0, 3.0));
      const HostTensor& r = v.tensors.input("r", uniform(s, seed + 1, l, -2.0, 1.0));
      make(v, x, r, seed);
      out.push_back(std::move(v));
    }
  }
  return out;
}

// A block output whose shortcut is another batch norm's output: relu(bn(x) + bn(r)), each with the
// statistics its own forward saves.
std::vector<Variant> batch_norm_apply_add(Precision precision) {
  return apply_add_cases(
      precision, 4700,
      [](Variant& v, const HostTensor& x, const HostTensor& r, std::uint64_t seed) {
        const Shape& s = x.desc().shape();
        const Layout l = x.desc().layout();
        batch_norm_parameters(v.tensors, s, seed + 2);
        const Shape c{s[1]};
        v.tensors.input("r_gamma", uniform(c, seed + 6, Layout::nchw, 0.5, 1.5), Role::fp32);
        v.tensors.input("r_beta", uniform(c, seed + 7), Role::fp32);
        const auto fwd = reference::batch_norm_train_forward<double>(
                             x, v.tensors["gamma"], v.tensors["beta"], v.tensors["running_mean"],
                             v.tensors["running_var"], kTrain)
                             .value();
        const auto rfwd = reference::batch_norm_train_forward<double>(
                              r, v.tensors["r_gamma"], v.tensors["r_beta"],
                              v.tensors["running_mean"], v.tensors["running_var"], kTrain)
                              .value();
        v.tensors.input("save_mean", fwd.save_mean, Role::fp32);
        v.tensors.input("save_invstd", fwd.save_invstd, Role::fp32);
        v.tensors.input("r_mean", rfwd.save_mean, Role::fp32);
        v.tensors.input("r_invstd", rfwd.save_invstd, Role::fp32);
        v.tensors.output("y", s, l);
        v.checks = {{"y", {}}};
        v.run = [](Backend& b, BackendTensors& t) {
          return b.batch_norm_apply_add(t["x"], t["gamma"], t["beta"], t["save_mean"],
                                        t["save_invstd"], t["r"], t["r_gamma"], t["r_beta"],
                                        t["r_mean"], t["r_invstd"], t["y"]);
        };
        v.reference = [y = fwd.y, ry = rfwd.y](const OpTensors&) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(HostTensor want, add_relu(y, &ry));
          return Values{{"y", std::move(want)}};
        };
      });
}

// Both batch norms' finalizes and the block output's pass in one call, from x's and r's sums:
// y and both statistics against the training forwards'. Offset means (1 +- 2 and -0.5 +- 1.5)
// for the variance's sake.
std::vector<Variant> batch_norm_finalize_apply_add(Precision precision) {
  return apply_add_cases(
      precision, 4900,
      [](Variant& v, const HostTensor& x, const HostTensor& r, std::uint64_t seed) {
        const Shape& s = x.desc().shape();
        const Layout l = x.desc().layout();
        ChannelSums xs = sums_of(x);
        ChannelSums rs = sums_of(r);
        v.tensors.input("sum", std::move(xs.sum), Role::fp32);
        v.tensors.input("sqsum", std::move(xs.sqsum), Role::fp32);
        v.tensors.input("r_sum", std::move(rs.sum), Role::fp32);
        v.tensors.input("r_sqsum", std::move(rs.sqsum), Role::fp32);
        batch_norm_parameters(v.tensors, s, seed + 2);
        const Shape c{s[1]};
        v.tensors.input("r_gamma", uniform(c, seed + 6, Layout::nchw, 0.5, 1.5), Role::fp32);
        v.tensors.input("r_beta", uniform(c, seed + 7), Role::fp32);
        v.tensors.input("r_running_mean", uniform(c, seed + 8), Role::fp32);
        v.tensors.input("r_running_var", uniform(c, seed + 9, Layout::nchw, 0.5, 2.0), Role::fp32);
        batch_norm_train_outputs(v, s, l, s);
        v.tensors.output("r_save_mean", c, Layout::nchw, Role::fp32);
        v.tensors.output("r_save_invstd", c, Layout::nchw, Role::fp32);
        const Check sums{.terms = per_channel(s)};
        v.checks.insert(v.checks.end(), {{"r_save_mean", sums},
                                         {"r_save_invstd", sums},
                                         {"r_running_mean", sums},
                                         {"r_running_var", sums}});
        const auto count = static_cast<std::int64_t>(per_channel(s));
        v.run = [count](Backend& b, BackendTensors& t) {
          const Backend::BatchNormFinalize f{t["sum"],         t["sqsum"],     count,
                                             t["gamma"],       t["beta"],      t["running_mean"],
                                             t["running_var"], t["save_mean"], t["save_invstd"],
                                             TensorView{},     TensorView{},   kTrain};
          const Backend::BatchNormFinalize rf{
              t["r_sum"],         t["r_sqsum"],     count,
              t["r_gamma"],       t["r_beta"],      t["r_running_mean"],
              t["r_running_var"], t["r_save_mean"], t["r_save_invstd"],
              TensorView{},       TensorView{},     kTrain};
          return b.batch_norm_finalize_apply_add(f, t["x"], rf, t["r"], t["y"]);
        };
        v.reference = [x, r](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(
              reference::BatchNormTrainOutput xf,
              reference::batch_norm_train_forward<double>(
                  x, t["gamma"], t["beta"], t["running_mean"], t["running_var"], kTrain));
          DLPROBE_ASSIGN_OR_RETURN(
              reference::BatchNormTrainOutput rf,
              reference::batch_norm_train_forward<double>(
                  r, t["r_gamma"], t["r_beta"], t["r_running_mean"], t["r_running_var"], kTrain));
          DLPROBE_ASSIGN_OR_RETURN(HostTensor y, add_relu(std::move(xf.y), &rf.y));
          return Values{{"y", std::move(y)},
                        {"save_mean", std::move(xf.save_mean)},
                        {"save_invstd", std::move(xf.save_invstd)},
                        {"running_mean", std::move(xf.running_mean)},
                        {"running_var", std::move(xf.running_var)},
                        {"r_save_mean", std::move(rf.save_mean)},
                        {"r_save_invstd", std::move(rf.save_invstd)},
                        {"r_running_mean", std::move(rf.running_mean)},
                        {"r_running_var", std::move(rf.running_var)}};
        };
      });
}

// ---- elementwise ----

// 2*3*7*11 = 462 elements: not a multiple of a 16-byte pack, so packed loops leave a tail.
const Shape kElementwiseShapes[] = {{2, 3, 4, 5}, {2, 3, 7, 11}};

// Exact zeros of both signs, where the ReLU's backward passes nothing.
HostTensor with_zeros(HostTensor x) {
  x.set(0, 0.0);
  x.set(7, -0.0);
  return x;
}

std::vector<Variant> relu_forward(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 4000;
  for (const Shape& s : kElementwiseShapes) {
    for (Layout l : kLayouts) {
      Variant v = variant(label(s, l), precision);
      v.tensors.input("x", with_zeros(uniform(s, seed += 10, l)));
      v.tensors.output("y", s, l);
      v.checks = {{"y", {.exact = true}}};
      v.run = [](Backend& b, BackendTensors& t) { return b.relu_forward(t["x"], t["y"]); };
      v.reference = [](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor y, reference::relu_forward<double>(t["x"]));
        return Values{{"y", std::move(y)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// The ReLU's backward from its output y; fused, from a gradient in two terms (a + b), summed and
// masked in one pass.
std::vector<Variant> relu_backward(Precision precision, bool two_terms) {
  std::vector<Variant> out;
  std::uint64_t seed = two_terms ? 4600 : 4300;
  for (const Shape& s : kElementwiseShapes) {
    for (Layout l : kLayouts) {
      Variant v = variant(label(s, l), precision);
      const HostTensor& x = v.tensors.input("x", with_zeros(uniform(s, seed += 10, l)));
      v.tensors.input("y", reference::relu_forward<double>(x).value());
      v.tensors.input("dy", uniform(s, seed + 1, l));
      if (two_terms) v.tensors.input("dy2", uniform(s, seed + 2, l));
      v.tensors.output("dx", s, l);
      // One exactly rounded sum in fp32; fp16 and bf16 may round the fp32 sum a second time.
      v.checks = {{"dx", {.exact = !two_terms || precision.dtype == DType::fp32}}};
      v.run = [two_terms](Backend& b, BackendTensors& t) {
        return two_terms ? b.relu_backward_add(t["dy"], t["dy2"], t["y"], t["dx"])
                         : b.relu_backward(t["dy"], t["y"], t["dx"]);
      };
      v.reference = [two_terms](const OpTensors& t) -> Result<Values> {
        HostTensor dy = t["dy"];
        if (two_terms) {
          DLPROBE_ASSIGN_OR_RETURN(dy, reference::add<double>(dy, t["dy2"]));
        }
        DLPROBE_ASSIGN_OR_RETURN(HostTensor dx, reference::relu_backward<double>(dy, t["y"]));
        return Values{{"dx", std::move(dx)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// y = a + b, then in place as the residual connection runs it: into b, then a += y.
std::vector<Variant> add(Precision precision, bool across_layouts) {
  std::vector<Variant> out;
  std::uint64_t seed = across_layouts ? 5300 : 5000;
  for (const Shape& s : kElementwiseShapes) {
    for (Layout la : kLayouts) {
      const Layout lb = across_layouts ? (la == Layout::nchw ? Layout::nhwc : Layout::nchw) : la;
      Variant v = variant(fmt::format("{} + {}", label(s, la), layout_name(lb)), precision);
      v.tensors.input("a", uniform(s, seed += 10, la));
      v.tensors.input("b", uniform(s, seed + 1, lb));
      v.tensors.output("y", s, la);
      // One exactly rounded sum in fp32 (fp16 and bf16 may round an fp32 sum a second time); a
      // sum with a rounded sum is not the exact sum rounded.
      const Check one_sum{.exact = precision.dtype == DType::fp32};
      v.checks = {{"y", one_sum}, {"b", one_sum}, {"a", {}}};
      v.run = [](Backend& b, BackendTensors& t) {
        DLPROBE_RETURN_IF_ERROR(b.add(t["a"], t["b"], t["y"]));
        DLPROBE_RETURN_IF_ERROR(b.add(t["a"], t["b"], t["b"]));
        return b.add(t["a"], t["y"], t["a"]);
      };
      v.reference = [dtype = precision.dtype](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor y, reference::add<double>(t["a"], t["b"]));
        DLPROBE_ASSIGN_OR_RETURN(HostTensor a, reference::add<double>(t["a"], rounded(y, dtype)));
        return Values{{"y", y}, {"b", y}, {"a", std::move(a)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// ---- pooling ----

enum class PoolValues { uniform, ties, constant };

struct PoolCase {
  Shape x;
  MaxPool2dParams p;
  PoolValues values;
};

// ResNet's stem pool and other windows; whole numbers 0..3 (most windows hold ties, so the rule
// that the first maximum takes the gradient matters) and a constant input (ties everywhere); 16
// channels for the NHWC kernels' 16-byte packs, 4 and 5 for one element a thread.
const PoolCase kPoolCases[] = {
    {{2, 3, 9, 8}, {}, PoolValues::uniform},
    {{1, 2, 7, 7}, {{2, 3}, {1, 2}, {1, 1}}, PoolValues::uniform},
    {{2, 2, 7, 6}, {{2, 2}, {2, 2}, {0, 0}}, PoolValues::uniform},
    {{2, 2, 7, 6}, {{3, 2}, {1, 2}, {1, 0}}, PoolValues::uniform},
    {{2, 6, 5, 4}, {}, PoolValues::uniform},
    {{2, 2, 8, 8}, {}, PoolValues::ties},
    {{2, 2, 8, 8}, {}, PoolValues::constant},
    {{2, 5, 12, 12}, {}, PoolValues::ties},
    {{3, 4, 9, 7}, {}, PoolValues::ties},
    {{2, 16, 11, 10}, {}, PoolValues::ties},
    // The stem's pool on a wider row: its gather's rows of 2 x 2 cells, 25 x 8 packs in fp16 and
    // bf16, fill most of a block (fp32: 25 x 16 packs, two blocks).
    {{1, 64, 9, 48}, {}, PoolValues::ties},
    // Even rows and odd columns in 16-byte packs: the cells' last row and column hold one input.
    {{2, 16, 10, 9}, {}, PoolValues::ties},
    // Eight channels and another window: the CUDA kernels' packed path without the stem's sizes
    // compiled in (the default above is the stem's 3x3, stride 2, padding 1).
    {{2, 8, 9, 9}, {{2, 2}, {2, 2}, {0, 0}}, PoolValues::ties},
};

HostTensor pool_input(const PoolCase& c, std::uint64_t seed, Layout l) {
  switch (c.values) {
    case PoolValues::ties: {
      HostTensor x = uniform(c.x, seed, l, 0.0, 4.0);
      for (double& e : x.values<double>()) e = std::floor(e);
      return x;
    }
    case PoolValues::constant:
      return filled(c.x, 1.0, l);
    case PoolValues::uniform:
      break;
  }
  return uniform(c.x, seed, l);
}

std::string pool_label(const PoolCase& c, Layout l) {
  constexpr const char* kValues[] = {"uniform", "ties", "constant"};
  return fmt::format("{} window {}x{} stride {}x{} pad {}x{} {} {}", c.x.str(), c.p.kernel[0],
                     c.p.kernel[1], c.p.stride[0], c.p.stride[1], c.p.pad[0], c.p.pad[1],
                     kValues[static_cast<int>(c.values)], layout_name(l));
}

std::vector<Variant> max_pool(Precision precision, bool backward) {
  std::vector<Variant> out;
  std::uint64_t seed = backward ? 6500 : 6000;
  for (const PoolCase& c : kPoolCases) {
    for (Layout l : kLayouts) {
      Variant v = variant(pool_label(c, l), precision);
      const Shape ys = max_pool2d_output_shape(c.x, c.p).value();
      const HostTensor& x = v.tensors.input("x", pool_input(c, seed += 10, l));
      if (!backward) {
        v.tensors.output("y", ys, l);
        v.checks = {{"y", {.exact = true}}};
        v.run = [p = c.p](Backend& b, BackendTensors& t) {
          return b.max_pool2d_forward(t["x"], t["y"], p);
        };
        v.reference = [p = c.p](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(HostTensor y, reference::max_pool2d_forward<double>(t["x"], p));
          return Values{{"y", std::move(y)}};
        };
      } else {
        v.tensors.input("y", reference::max_pool2d_forward<double>(x, c.p).value());
        v.tensors.input("dy", uniform(ys, seed + 1, l));
        v.tensors.output("dx", c.x, l);
        // An element may be the maximum of up to four overlapping windows.
        v.checks = {{"dx", {.terms = 4}}};
        v.run = [p = c.p](Backend& b, BackendTensors& t) {
          return b.max_pool2d_backward(t["dy"], t["x"], t["y"], t["dx"], p);
        };
        v.reference = [p = c.p](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(HostTensor dx,
                                   reference::max_pool2d_backward<double>(t["dy"], t["x"], p));
          return Values{{"dx", std::move(dx)}};
        };
      }
      out.push_back(std::move(v));
    }
  }
  return out;
}

// A batch norm's input `name` of shape `s` with its parameters and saved statistics, for a max pool
// that computes its input relu(bn(x)) again from them: the input a multiple of 1/64 in [-2, 2)
// and the statistics and parameters binary fractions, so bn(x) is exact in fp32 as in fp64 and
// every dtype rounds the same value: the windows' maxima (and their ties, at ReLU's zeros) are
// the reference's.
void exact_batch_norm_inputs(OpTensors& t, const std::string& name, const Shape& s, Layout l,
                             std::uint64_t seed) {
  HostTensor x = uniform(s, seed, l, -2.0, 2.0);
  for (double& e : x.values<double>()) e = std::floor(e * 64.0) / 64.0;
  t.input(name, x);
  const Shape ch{s[1]};
  HostTensor gamma = filled(ch, 1.0);
  HostTensor beta = filled(ch, 0.125);
  for (std::int64_t k = 0; k < ch[0]; ++k) {
    constexpr double kGammas[] = {1.0, -0.5, 0.5, -1.0};
    gamma.set(k, kGammas[k % 4]);
    if (k % 3 == 1) beta.set(k, -0.25);
  }
  t.input("gamma", gamma, Role::fp32);
  t.input("beta", beta, Role::fp32);
  t.input("save_mean", filled(ch, 0.25), Role::fp32);
  t.input("save_invstd", filled(ch, 2.0), Role::fp32);
}

// relu(bn(x)) in fp64, x the batch norm's input `name`, with the parameters and saved statistics
// of exact_batch_norm_inputs.
HostTensor relu_of_batch_norm(const OpTensors& t, const std::string& name) {
  HostTensor x = t[name];
  const TensorDesc& d = x.desc();
  const std::int64_t channels = d.dim(1);
  const std::int64_t plane = d.dim(2) * d.dim(3);
  std::span<double> xs = x.values<double>();
  for (std::size_t at = 0; at < xs.size(); ++at) {
    const auto i = static_cast<std::int64_t>(at);
    const std::int64_t k = d.layout() == Layout::nhwc ? i % channels : (i / plane) % channels;
    const double bn =
        (xs[at] - t["save_mean"].get(k)) * t["save_invstd"].get(k) * t["gamma"].get(k) +
        t["beta"].get(k);
    xs[at] = std::max(bn, 0.0);
  }
  return x;
}

// The max pool's backward with its input relu(bn(bn_x)) computed again from the batch norm's
// input (exact_batch_norm_inputs).
std::vector<Variant> max_pool_recomputed(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 6900;
  for (const PoolCase& c : kPoolCases) {
    for (Layout l : kLayouts) {
      Variant v = variant(pool_label(c, l), precision);
      exact_batch_norm_inputs(v.tensors, "bn_x", c.x, l, seed += 10);
      const Shape ys = max_pool2d_output_shape(c.x, c.p).value();
      v.tensors.input("dy", uniform(ys, seed + 1, l));
      v.tensors.output("dx", c.x, l);
      v.checks = {{"dx", {.terms = 4}}};
      v.run = [p = c.p](Backend& b, BackendTensors& t) {
        return b.max_pool2d_backward_recomputed(t["dy"], t["bn_x"], t["gamma"], t["beta"],
                                                t["save_mean"], t["save_invstd"], t["dx"], p);
      };
      v.reference = [p = c.p, dtype = v.tensors.dtype(Role::activation)](
                        const OpTensors& t) -> Result<Values> {
        const HostTensor x = relu_of_batch_norm(t, "bn_x");
        DLPROBE_ASSIGN_OR_RETURN(
            HostTensor dx, reference::max_pool2d_backward<double>(t["dy"], rounded(x, dtype), p));
        return Values{{"dx", std::move(dx)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// For each window of a pool over an input of shape `x` (NHWC), the place r * kw + s of one of its
// inputs drawn at random (padding never), shaped as the pool's output.
HostTensor drawn_positions(const Shape& x, const MaxPool2dParams& p, std::uint64_t seed) {
  const Shape ys = max_pool2d_output_shape(x, p).value();
  HostTensor at = uniform(ys, seed, Layout::nhwc, 0.0, 1.0);
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t c = 0; c < ys[1]; ++c)
      for (std::int64_t oh = 0; oh < ys[2]; ++oh)
        for (std::int64_t ow = 0; ow < ys[3]; ++ow) {
          const std::int64_t h0 = oh * p.stride[0] - p.pad[0];
          const std::int64_t w0 = ow * p.stride[1] - p.pad[1];
          const std::int64_t r0 = std::max<std::int64_t>(0, -h0);
          const std::int64_t r1 = std::min(p.kernel[0], x[2] - h0);
          const std::int64_t s0 = std::max<std::int64_t>(0, -w0);
          const std::int64_t s1 = std::min(p.kernel[1], x[3] - w0);
          const double u = at.at<double>(n, c, oh, ow);
          const auto k = static_cast<std::int64_t>(u * static_cast<double>((r1 - r0) * (s1 - s0)));
          const std::int64_t r = r0 + k / (s1 - s0);
          const std::int64_t s = s0 + k % (s1 - s0);
          at.at<double>(n, c, oh, ow) = static_cast<double>(r * p.kernel[1] + s);
        }
  return at;
}

// The backward of max_pool(relu(bn(x))) in one call (the step's stem), on NHWC tensors in 16-byte
// channel packs: the stem's pool (three sizes: odd and even rows and columns, and a row of 48 x 64
// channels), a pool of 2x2 windows and one of uneven windows and strides. The values are
// max_pool_recomputed's, so every dtype finds the windows' maxima where the reference does; the
// reference rounds the pool's input and its gradient to the dtype, as the op's contract says, then
// takes the ReLU's mask (the batch norm's output > 0) and the batch norm's backward in fp64. With
// `given` the op gets positions, and they are not the maxima but an input of each window drawn at
// random: the op must gather where it is told.
std::vector<Variant> batch_norm_relu_max_pool_backward(Precision precision, bool given) {
  const PoolCase cases[] = {
      {{2, 16, 11, 10}, {}, PoolValues::uniform},
      {{2, 16, 10, 9}, {}, PoolValues::uniform},
      {{1, 64, 9, 48}, {}, PoolValues::uniform},
      {{2, 8, 9, 9}, {{2, 2}, {2, 2}, {0, 0}}, PoolValues::uniform},
      {{2, 8, 7, 6}, {{3, 2}, {1, 2}, {1, 0}}, PoolValues::uniform},
  };
  std::vector<Variant> out;
  std::uint64_t seed = given ? 7900 : 7700;
  for (const PoolCase& c : cases) {
    Variant v = variant(pool_label(c, Layout::nhwc), precision);
    exact_batch_norm_inputs(v.tensors, "x", c.x, Layout::nhwc, seed += 10);
    const Shape ch{c.x[1]};
    const Shape ys = max_pool2d_output_shape(c.x, c.p).value();
    v.tensors.input("dy", uniform(ys, seed + 1, Layout::nhwc));
    if (given) v.tensors.input("positions", drawn_positions(c.x, c.p, seed + 2));
    v.tensors.output("dx", c.x, Layout::nhwc);
    v.tensors.output("dgamma", ch, Layout::nchw, Role::fp32);
    v.tensors.output("dbeta", ch, Layout::nchw, Role::fp32);
    const Check sums{.terms = per_channel(c.x)};
    v.checks = {{"dx", sums}, {"dgamma", sums}, {"dbeta", sums}};
    v.run = [p = c.p, given](Backend& b, BackendTensors& t) {
      return b.batch_norm_relu_max_pool_backward(
          t["dy"], given ? t["positions"] : TensorView{}, t["x"], t["gamma"], t["beta"],
          t["save_mean"], t["save_invstd"], t["dx"], t["dgamma"], t["dbeta"], p);
    };
    v.reference = [p = c.p, given, dtype = v.tensors.dtype(Role::activation)](
                      const OpTensors& t) -> Result<Values> {
      const HostTensor relu_y = relu_of_batch_norm(t, "x");
      DLPROBE_ASSIGN_OR_RETURN(
          HostTensor pooled,
          given
              ? reference::max_pool2d_backward_at<double>(t["dy"], t["positions"], relu_y.desc(), p)
              : reference::max_pool2d_backward<double>(t["dy"], rounded(relu_y, dtype), p));
      DLPROBE_ASSIGN_OR_RETURN(HostTensor masked,
                               reference::relu_backward<double>(rounded(pooled, dtype), relu_y));
      DLPROBE_ASSIGN_OR_RETURN(reference::BatchNormGrads g,
                               reference::batch_norm_backward<double>(
                                   masked, t["x"], t["gamma"], t["save_mean"], t["save_invstd"]));
      return Values{
          {"dx", std::move(g.dx)}, {"dgamma", std::move(g.dgamma)}, {"dbeta", std::move(g.dbeta)}};
    };
    out.push_back(std::move(v));
  }
  return out;
}

// Batch norm + ReLU and the max pool after them in one call (the step's stem): the pool's output
// and the batch norm's statistics, over the max pool's windows, on values that straddle the
// ReLU's zero.
//
// With `positions`, the windows' maxima's places too (NHWC, 8 channels or a multiple): on the
// integers of the `ties` cases, which a batch norm with positive gamma keeps apart by far more
// than any dtype's rounding and keeps tied where they tie, so every dtype finds the reference's
// places (checked exactly).
std::vector<Variant> batch_norm_relu_max_pool(Precision precision, bool positions) {
  std::vector<Variant> out;
  std::uint64_t seed = positions ? 7400 : 7300;
  for (const PoolCase& c : kPoolCases) {
    if (c.values != PoolValues::ties) continue;  // the shapes once each; the values are drawn here
    if (positions && c.x[1] % 8 != 0) continue;
    for (Layout l : kLayouts) {
      if (positions && l != Layout::nhwc) continue;
      Variant v =
          variant(pool_label({c.x, c.p, positions ? c.values : PoolValues::uniform}, l), precision);
      v.tensors.input(
          "x", positions ? pool_input(c, seed += 10, l) : uniform(c.x, seed += 10, l, -1.0, 3.0));
      batch_norm_parameters(v.tensors, c.x, seed + 1);
      const Shape ys = max_pool2d_output_shape(c.x, c.p).value();
      batch_norm_train_outputs(v, c.x, l, ys);
      if (positions) {
        v.tensors.output("positions", ys, l);
        v.checks.push_back({"positions", {.exact = true}});
      }
      v.run = [p = c.p, positions](Backend& b, BackendTensors& t) {
        return b.batch_norm_relu_max_pool_train_forward(
            t["x"], t["gamma"], t["beta"], t["running_mean"], t["running_var"], t["y"],
            positions ? t["positions"] : TensorView{}, t["save_mean"], t["save_invstd"], kTrain, p);
      };
      v.reference = [p = c.p, positions, dtype = v.tensors.dtype(Role::activation)](
                        const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(
            reference::BatchNormTrainOutput r,
            reference::batch_norm_train_forward<double>(
                t["x"], t["gamma"], t["beta"], t["running_mean"], t["running_var"], kTrain));
        DLPROBE_ASSIGN_OR_RETURN(HostTensor relu, add_relu(std::move(r.y), nullptr));
        DLPROBE_ASSIGN_OR_RETURN(HostTensor y, reference::max_pool2d_forward<double>(relu, p));
        HostTensor at;
        if (positions) {
          DLPROBE_ASSIGN_OR_RETURN(
              at, reference::max_pool2d_positions<double>(rounded(relu, dtype), p));
        }
        Values values = train_forward_values(std::move(r), std::move(y));
        if (positions) values.emplace("positions", std::move(at));
        return values;
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

const Shape kAvgPoolShapes[] = {
    {3, 5, 7, 6}, {2, 7, 7, 7}, {4, 64, 3, 5}, {2, 3, 3, 2}, {2, 6, 5, 4}};

std::vector<Variant> global_avg_pool(Precision precision, bool backward) {
  std::vector<Variant> out;
  std::uint64_t seed = backward ? 7500 : 7000;
  for (const Shape& s : kAvgPoolShapes) {
    for (Layout l : kLayouts) {
      Variant v = variant(label(s, l), precision);
      const Shape ys{s[0], s[1]};
      if (!backward) {
        v.tensors.input("x", uniform(s, seed += 10, l));
        v.tensors.output("y", ys);
        v.checks = {{"y", {.terms = static_cast<double>(s[2] * s[3])}}};
        v.run = [](Backend& b, BackendTensors& t) {
          return b.global_avg_pool_forward(t["x"], t["y"]);
        };
        v.reference = [](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(HostTensor y,
                                   reference::global_avg_pool_forward<double>(t["x"]));
          return Values{{"y", std::move(y)}};
        };
      } else {
        v.tensors.input("dy", uniform(ys, seed += 10));
        v.tensors.output("dx", s, l);
        v.checks = {{"dx", {}}};
        v.run = [](Backend& b, BackendTensors& t) {
          return b.global_avg_pool_backward(t["dy"], t["dx"]);
        };
        v.reference = [s, l](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(HostTensor dx, reference::global_avg_pool_backward<double>(
                                                      t["dy"], desc(s, DType::fp64, l)));
          return Values{{"dx", std::move(dx)}};
        };
      }
      out.push_back(std::move(v));
    }
  }
  return out;
}

// ---- linear ----

struct LinearShape {
  std::int64_t batch, in, out;
};
const LinearShape kLinearShapes[] = {{4, 37, 11}, {4, 24, 5}, {16, 40, 24}, {3, 4, 5}};

std::vector<Variant> linear(Precision precision, bool backward) {
  std::vector<Variant> out;
  std::uint64_t seed = backward ? 8500 : 8000;
  for (const LinearShape& s : kLinearShapes) {
    Variant v = variant(fmt::format("batch {} in {} out {}", s.batch, s.in, s.out), precision);
    v.tensors.input("x", uniform({s.batch, s.in}, seed += 10));
    v.tensors.input("w", uniform({s.out, s.in}, seed + 1));
    if (!backward) {
      v.tensors.input("b", uniform({s.out}, seed + 2));
      v.tensors.output("y", {s.batch, s.out});
      v.checks = {{"y", {.terms = static_cast<double>(s.in)}}};
      v.run = [](Backend& b, BackendTensors& t) {
        return b.linear_forward(t["x"], t["w"], t["b"], t["y"]);
      };
      v.reference = [](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(HostTensor y,
                                 reference::linear_forward<double>(t["x"], t["w"], t["b"]));
        return Values{{"y", std::move(y)}};
      };
    } else {
      v.tensors.input("dy", uniform({s.batch, s.out}, seed + 3));
      v.tensors.output("dx", {s.batch, s.in});
      v.tensors.output("dw", {s.out, s.in});
      v.tensors.output("db", {s.out});
      v.checks = {{"dx", {.terms = static_cast<double>(s.out)}},
                  {"dw", {.terms = static_cast<double>(s.batch)}},
                  {"db", {.terms = static_cast<double>(s.batch)}}};
      v.run = [](Backend& b, BackendTensors& t) {
        return b.linear_backward(t["dy"], t["x"], t["w"], t["dx"], t["dw"], t["db"]);
      };
      v.reference = [](const OpTensors& t) -> Result<Values> {
        DLPROBE_ASSIGN_OR_RETURN(reference::LinearGrads g,
                                 reference::linear_backward<double>(t["dy"], t["x"], t["w"]));
        return Values{{"dx", std::move(g.dx)}, {"dw", std::move(g.dw)}, {"db", std::move(g.db)}};
      };
    }
    out.push_back(std::move(v));
  }
  return out;
}

// ---- cross-entropy ----

struct LossCase {
  std::int64_t batch, classes;
  double lo, hi;
};
// Logits around 80 overflow exp() in fp32 without the max shift; 1003 classes is more than one
// block's worth.
const LossCase kLossCases[] = {{6, 10, 70.0, 90.0}, {19, 1003, -4.0, 4.0}, {4, 10, -5.0, 5.0}};
constexpr double kLossScale = 1024.0;

std::vector<Variant> cross_entropy(Precision precision, bool backward) {
  std::vector<Variant> out;
  std::uint64_t seed = backward ? 9500 : 9000;
  for (const LossCase& c : kLossCases) {
    for (DType label_type : {DType::int32, DType::int64}) {
      Variant v = variant(fmt::format("batch {} classes {} logits in [{}, {}) {} labels", c.batch,
                                      c.classes, c.lo, c.hi, dtype_name(label_type)),
                          precision);
      v.tensors.input("logits", uniform({c.batch, c.classes}, seed += 10, Layout::nchw, c.lo, c.hi),
                      Role::fp32);
      v.tensors.input("labels",
                      HostTensor::random(desc({c.batch}, label_type), seed + 1, 0,
                                         static_cast<double>(c.classes)),
                      Role::own);
      if (!backward) {
        v.tensors.output("loss", {1}, Layout::nchw, Role::fp32);
        v.checks = {{"loss", {.terms = static_cast<double>(c.classes)}}};
        v.run = [](Backend& b, BackendTensors& t) {
          return b.cross_entropy_forward(t["logits"], t["labels"], t["loss"]);
        };
        v.reference = [](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(
              HostTensor loss, reference::cross_entropy_forward<double>(t["logits"], t["labels"]));
          return Values{{"loss", std::move(loss)}};
        };
      } else {
        v.tensors.output("dlogits", {c.batch, c.classes}, Layout::nchw, Role::fp32);
        // Softmax terms are small against the loss scale / batch that multiplies them.
        v.tensors.input("counters", counters_tensor({.loss_scale = kLossScale}), Role::own);
        v.checks = {{"dlogits", {.scale = kLossScale / static_cast<double>(c.batch)}}};
        v.run = [](Backend& b, BackendTensors& t) {
          return b.cross_entropy_backward(t["logits"], t["labels"], t["counters"], t["dlogits"]);
        };
        v.reference = [](const OpTensors& t) -> Result<Values> {
          DLPROBE_ASSIGN_OR_RETURN(
              HostTensor dz, reference::cross_entropy_backward<double>(t["logits"], t["labels"],
                                                                       filled({1}, kLossScale)));
          return Values{{"dlogits", std::move(dz)}};
        };
      }
      out.push_back(std::move(v));
    }
  }
  return out;
}

// ---- casts, fills ----

constexpr DType kFloatingTypes[] = {DType::fp32, DType::fp16, DType::bf16};

// Values spanning fp16's range edges: a subnormal, one that rounds to infinity, NaN, a bf16 tie;
// or plain values in [-1, 1).
HostTensor cast_input(const Shape& s, std::uint64_t seed, Layout l, bool edges) {
  if (!edges) return uniform(s, seed, l);
  HostTensor x = uniform(s, seed, l, -70000.0, 70000.0);
  x.set(0, 1e-6);
  x.set(1, 65520.0);
  x.set(2, kNaN);
  x.set(3, 1.0 + 1.0 / 4096);
  return x;
}

// The destinations of a cast from `from`: every floating dtype, or with `half_to_half` the other
// of fp16 and bf16 (oneDNN has no reorder between those two).
std::vector<DType> cast_destinations(DType from, bool half_to_half) {
  std::vector<DType> to;
  for (DType d : kFloatingTypes) {
    const bool between_halves = d != DType::fp32 && from != DType::fp32 && d != from;
    if (between_halves == half_to_half) to.push_back(d);
  }
  return to;
}

// One cast_many call over NCHW tensors of these shapes, all into `to`: x<i> to y<i>, each exact.
// Tensors of four elements or more hold the range's edges.
Variant one_cast_many_call(const std::string& name, Precision precision,
                           const std::vector<Shape>& shapes, DType to, std::uint64_t& seed) {
  Variant v = variant(name, precision);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    pairs.emplace_back(fmt::format("x{}", i), fmt::format("y{}", i));
    v.tensors.input(pairs.back().first,
                    cast_input(shapes[i], seed += 10, Layout::nchw, shapes[i][3] >= 4));
    v.tensors.output(pairs.back().second, desc(shapes[i], to, Layout::nchw));
    v.checks.push_back({pairs.back().second, {.exact = true}});
  }
  v.run = [pairs](Backend& b, BackendTensors& t) {
    std::vector<TensorView> src;
    std::vector<TensorView> dst;
    for (const auto& [from, into] : pairs) {
      src.push_back(t[from]);
      dst.push_back(t[into]);
    }
    return b.cast_many(src, dst);
  };
  v.reference = [pairs](const OpTensors& t) -> Result<Values> {
    Values want;
    for (const auto& [from, into] : pairs) want[into] = t[from];
    return want;
  };
  return v;
}

// Three tensors of different sizes (one element, an odd count, a packed one) cast in one
// cast_many call per destination dtype, then in one call whose pairs go to different dtypes
// (the CUDA backend's pair-by-pair path).
std::vector<Variant> cast_many(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 11000;
  const std::vector<DType> destinations = cast_destinations(precision.dtype, false);
  const Shape shapes[] = {{1, 1, 1, 1}, {2, 3, 7, 11}, {2, 8, 4, 4}};
  for (Layout l : kLayouts) {
    Variant v = variant(fmt::format("3 tensors {}", layout_name(l)), precision);
    std::vector<std::string> inputs;
    for (std::size_t i = 0; i < std::size(shapes); ++i) {
      inputs.push_back(fmt::format("x{}", i));
      v.tensors.input(inputs.back(), cast_input(shapes[i], seed += 10, l, i == 1));
    }
    std::vector<std::string> outputs;  // "<input>_to_<dtype>" per destination, then mixed
    std::vector<std::pair<std::string, std::string>> pairs;
    for (DType d : destinations) {
      for (std::size_t i = 0; i < std::size(shapes); ++i) {
        pairs.emplace_back(inputs[i], fmt::format("{}_to_{}", inputs[i], dtype_name(d)));
        v.tensors.output(pairs.back().second, desc(shapes[i], d, l));
      }
    }
    for (std::size_t i = 0; i < std::size(shapes); ++i) {
      const DType d = destinations[i % destinations.size()];
      pairs.emplace_back(inputs[i], fmt::format("{}_mixed_to_{}", inputs[i], dtype_name(d)));
      v.tensors.output(pairs.back().second, desc(shapes[i], d, l));
    }
    for (const auto& [from, to] : pairs) v.checks.push_back({to, {.exact = true}});
    const std::size_t per_call = std::size(shapes);
    v.run = [pairs, per_call](Backend& b, BackendTensors& t) {
      for (std::size_t first = 0; first < pairs.size(); first += per_call) {
        std::vector<TensorView> src;
        std::vector<TensorView> dst;
        for (std::size_t k = first; k < first + per_call; ++k) {
          src.push_back(t[pairs[k].first]);
          dst.push_back(t[pairs[k].second]);
        }
        DLPROBE_RETURN_IF_ERROR(b.cast_many(src, dst));
      }
      return Status::ok();
    };
    v.reference = [pairs](const OpTensors& t) -> Result<Values> {
      Values want;
      for (const auto& [from, to] : pairs) want[to] = t[from];
      return want;
    };
    out.push_back(std::move(v));
  }
  // Pairs of several blocks each between one-block ones (the CUDA backend gives a pair blocks in
  // proportion to its size, 4,096 elements a block, and a block finds its pair by search), one
  // of an odd count of elements.
  out.push_back(one_cast_many_call("4 tensors of 1 to 13,653 elements", precision,
                                   {{1, 1, 1, 5}, {2, 16, 20, 20}, {1, 1, 1, 1}, {3, 3, 37, 41}},
                                   destinations.back(), seed));
  // More pairs than one launch takes (the CUDA backend's kCastsPerLaunch is 96).
  std::vector<Shape> small;
  for (int i = 0; i < 100; ++i) small.push_back(Shape{1, 1, 1, 1 + i % 7});
  out.push_back(one_cast_many_call("100 tensors of 1 to 7 elements", precision, small,
                                   destinations.back(), seed));
  return out;
}

// The source in the precision's dtype to other floating dtypes, rounding to nearest even exactly
// as the host conversions do; across layouts, into NHWC and back into NCHW.
std::vector<Variant> cast(Precision precision, bool across_layouts, bool half_to_half) {
  std::vector<Variant> out;
  std::uint64_t seed = across_layouts ? 10500 : 10000;
  const std::vector<DType> destinations = cast_destinations(precision.dtype, half_to_half);
  for (const Shape& s : kElementwiseShapes) {
    for (Layout l : kLayouts) {
      for (bool edges : {true, false}) {
        if (across_layouts && l == Layout::nhwc) continue;
        Variant v = variant(fmt::format("{} {}", label(s, l), edges ? "range edges" : "[-1, 1)"),
                            precision);
        v.tensors.input("x", cast_input(s, seed += 10, l, edges));
        const Layout to = across_layouts ? Layout::nhwc : l;
        for (DType d : destinations) {
          v.tensors.output(fmt::format("to_{}", dtype_name(d)), desc(s, d, to));
          v.checks.push_back({fmt::format("to_{}", dtype_name(d)), {.exact = true}});
          if (across_layouts) {
            v.tensors.output(fmt::format("back_from_{}", dtype_name(d)), s, l);
            v.checks.push_back({fmt::format("back_from_{}", dtype_name(d)), {.exact = true}});
          }
        }
        v.run = [destinations, across_layouts](Backend& b, BackendTensors& t) {
          for (DType d : destinations) {
            const std::string name = fmt::format("to_{}", dtype_name(d));
            DLPROBE_RETURN_IF_ERROR(b.cast(t["x"], t[name]));
            if (across_layouts) {
              DLPROBE_RETURN_IF_ERROR(
                  b.cast(t[name], t[fmt::format("back_from_{}", dtype_name(d))]));
            }
          }
          return Status::ok();
        };
        // The comparison rounds the reference to each output's dtype: the conversion itself.
        v.reference = [destinations, across_layouts](const OpTensors& t) -> Result<Values> {
          Values want;
          for (DType d : destinations) {
            want[fmt::format("to_{}", dtype_name(d))] = t["x"];
            if (across_layouts)
              want[fmt::format("back_from_{}", dtype_name(d))] = rounded(t["x"], d);
          }
          return want;
        };
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

std::vector<Variant> fill(Precision precision) {
  std::vector<Variant> out;
  for (const Shape& s : {Shape{3, 2, 2, 2}, Shape{2, 3, 7, 11}}) {
    for (Layout l : kLayouts) {
      Variant v = variant(label(s, l), precision);
      v.tensors.output("x", s, l);
      v.checks = {{"x", {.exact = true}}};
      v.run = [](Backend& b, BackendTensors& t) { return b.fill(t["x"], 0.1); };
      v.reference = [s, l](const OpTensors&) -> Result<Values> {
        return Values{{"x", filled(s, 0.1, l)}};
      };
      out.push_back(std::move(v));
    }
  }
  return out;
}

// ---- mixed precision, optimizers ----

// Parameters as a ResNet has them (a conv weight in NHWC, a bias-like vector, a matrix) and for
// the multi-tensor kernels: 1 and 3 elements (no full float4), a chunk boundary crossed (70001 >
// 2 * 32768, odd), and one parameter 4 bytes into its buffer, which forces the scalar path.
struct Slot {
  Shape shape;
  Layout layout = Layout::nchw;
  bool misaligned = false;
};
const Slot kSlots[] = {{{4, 3, 3, 3}, Layout::nhwc}, {{7}},    {{5, 6}}, {{1}}, {{3}}, {{64}},
                       {{1000}, Layout::nchw, true}, {{70001}}};

struct UnscaleCase {
  std::string_view name;
  double inv_scale;
  double flag_before;
  double bad;  // a value put into one gradient (0: none)
  std::size_t bad_slot;
};
// One bad value deep in the largest gradient, or in a small one; a set flag stays set when
// nothing is found, so that one flag collects several calls.
const UnscaleCase kUnscaleCases[] = {
    {"clean", 1.0 / 65536, 0.0, 0.0, 0}, {"clean by 0.125", 0.125, 0.0, 0.0, 0},
    {"inf", 1.0 / 65536, 0.0, kInf, 7},  {"NaN", 1.0 / 65536, 0.0, kNaN, 7},
    {"-inf", 0.5, 0.0, -kInf, 2},        {"flag already set", 1.0, 1.0, 0.0, 0},
};

std::vector<Variant> unscale_gradients(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 11000;
  for (const UnscaleCase& c : kUnscaleCases) {
    Variant v = variant(std::string(c.name), precision);
    for (std::size_t i = 0; i < std::size(kSlots); ++i) {
      HostTensor g = uniform(kSlots[i].shape, seed += 10, kSlots[i].layout, -1e4, 1e4);
      if (c.bad != 0.0 && i == c.bad_slot) g.set(g.numel() - 5, c.bad);
      const std::string name = fmt::format("grad{}", i);
      v.tensors.input(name, g, Role::fp32, kSlots[i].misaligned);
      // Scaling by a power of two is exact.
      v.checks.push_back({name, {.exact = true}});
    }
    v.tensors.input("found_inf", filled({1}, c.flag_before), Role::fp32);
    v.checks.push_back({"found_inf", {.exact = true}});
    // The inverses of the cases' powers of two are exact.
    v.tensors.input("counters", counters_tensor({.loss_scale = 1.0 / c.inv_scale}), Role::own);
    v.run = [](Backend& b, BackendTensors& t) {
      std::vector<TensorView> grads;
      for (std::size_t i = 0; i < std::size(kSlots); ++i)
        grads.push_back(t[fmt::format("grad{}", i)]);
      return b.unscale_gradients(grads, t["counters"], t["found_inf"]);
    };
    v.reference = [inv = c.inv_scale](const OpTensors& t) -> Result<Values> {
      Values want;
      bool found = t["found_inf"].get(0) != 0.0;
      for (std::size_t i = 0; i < std::size(kSlots); ++i) {
        HostTensor g = t[fmt::format("grad{}", i)];
        for (double& e : g.values<double>()) {
          found = found || !std::isfinite(e);
          e *= inv;
        }
        want[fmt::format("grad{}", i)] = std::move(g);
      }
      want["found_inf"] = filled({1}, found ? 1.0 : 0.0);
      return want;
    };
    out.push_back(std::move(v));
  }
  return out;
}

// A run of optimizer calls: the step number each call gets, and whether found_inf is set for it
// (the step a dynamic loss scaler skips, after which the same step number comes again).
struct Call {
  std::int64_t step;
  bool skipped = false;
};
const std::vector<Call> kSteps = {{1}, {2}, {3}, {4}, {5}};
const std::vector<Call> kStepsWithASkip = {{1}, {2, true}, {2}, {3}};

std::string key(std::string_view tensor, std::size_t slot, std::size_t call) {
  return fmt::format("{}{}@{}", tensor, slot, call + 1);
}

// The optimizer variant's tensors: parameters, a gradient per slot and call, state buffers that
// start as NaN (the first step must write them before reading), and the checks of every tensor
// after every call (`states`: how to check each state buffer).
void optimizer_tensors(Variant& v, const std::vector<Call>& calls, const std::vector<Check>& states,
                       bool flag, std::uint64_t seed) {
  for (std::size_t i = 0; i < std::size(kSlots); ++i) {
    const Slot& s = kSlots[i];
    v.tensors.input(fmt::format("param{}", i), uniform(s.shape, seed + 10 * i, s.layout),
                    Role::fp32, s.misaligned);
    for (std::size_t k = 0; k < calls.size(); ++k) {
      v.tensors.input(key("grad", i, k), uniform(s.shape, seed + 10 * i + 1 + k, s.layout),
                      Role::fp32, s.misaligned);
      v.checks.push_back({key("param", i, k), {}});
    }
    for (std::size_t n = 0; n < states.size(); ++n) {
      const std::string state = fmt::format("state{}_", n);
      v.tensors.input(fmt::format("state{}_{}", n, i), filled(s.shape, kNaN, s.layout), Role::fp32,
                      s.misaligned);
      for (std::size_t k = 0; k < calls.size(); ++k) {
        v.checks.push_back({key(state, i, k), states[n]});
      }
    }
  }
  if (flag) v.tensors.input("found_inf", filled({1}, 0.0), Role::fp32);
  v.tensors.input("counters", counters_tensor({}), Role::own);
}

using StepFn = std::function<Status(Backend&, std::span<const OptimizerSlot>, const TensorView&,
                                    const TensorView&)>;

// Runs `calls` through `step` and keeps every tensor after each.
Status run_optimizer(Backend& b, BackendTensors& t, const std::vector<Call>& calls, int states,
                     bool flag, const StepFn& step) {
  for (std::size_t k = 0; k < calls.size(); ++k) {
    std::vector<OptimizerSlot> slots;
    for (std::size_t i = 0; i < std::size(kSlots); ++i) {
      OptimizerSlot s{t[fmt::format("param{}", i)], t[key("grad", i, k)], {}, {}};
      if (states > 0) s.state0 = t[fmt::format("state0_{}", i)];
      if (states > 1) s.state1 = t[fmt::format("state1_{}", i)];
      slots.push_back(s);
    }
    if (flag) DLPROBE_RETURN_IF_ERROR(b.fill(t["found_inf"], calls[k].skipped ? 1.0 : 0.0));
    // The call's step number as the counters give it: the steps taken before it.
    const StepCounters at{.steps_taken = static_cast<double>(calls[k].step - 1)};
    DLPROBE_RETURN_IF_ERROR(b.upload(t["counters"].data, &at, sizeof at));
    DLPROBE_RETURN_IF_ERROR(step(b, slots, t["counters"], flag ? t["found_inf"] : TensorView{}));
    for (std::size_t i = 0; i < std::size(kSlots); ++i) {
      t.snapshot(key("param", i, k), fmt::format("param{}", i));
      for (int n = 0; n < states; ++n) {
        t.snapshot(key(fmt::format("state{}_", n), i, k), fmt::format("state{}_{}", n, i));
      }
    }
  }
  return Status::ok();
}

struct SgdCase {
  SgdParams p;
  bool flag;
};
// ResNet's recipe, dampening, nesterov, plain SGD (no state buffer at all), weight decay or none.
const SgdCase kSgdCases[] = {
    {{0.1, 0.9, 0.0, 1e-4, false}, false}, {{0.05, 0.9, 0.3, 0.01, false}, false},
    {{0.1, 0.8, 0.0, 0.01, true}, false},  {{0.2, 0.0, 0.0, 0.0, false}, false},
    {{0.1, 0.0, 0.0, 1e-2, false}, false}, {{0.05, 0.9, 0.1, 1e-4, false}, false},
    {{0.1, 0.9, 0.0, 5e-4, true}, false},  {{0.1, 0.9, 0.0, 0.0, false}, true},
};

std::vector<Variant> sgd(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 12000;
  for (const SgdCase& c : kSgdCases) {
    const std::vector<Call>& calls = c.flag ? kStepsWithASkip : kSteps;
    const int states = c.p.momentum != 0.0 ? 1 : 0;
    Variant v = variant(fmt::format("lr {} momentum {} dampening {} weight decay {} nesterov {}{}",
                                    c.p.lr, c.p.momentum, c.p.dampening, c.p.weight_decay,
                                    c.p.nesterov, c.flag ? ", step 2 skipped by found_inf" : ""),
                        precision);
    optimizer_tensors(v, calls, std::vector<Check>(static_cast<std::size_t>(states)), c.flag,
                      seed += 1000);
    v.run = [c, calls, states](Backend& b, BackendTensors& t) {
      return run_optimizer(
          b, t, calls, states, c.flag,
          [&c](Backend& be, std::span<const OptimizerSlot> s, const TensorView& counters,
               const TensorView& found_inf) { return be.sgd_step(s, c.p, counters, found_inf); });
    };
    v.reference = [c, calls](const OpTensors& t) -> Result<Values> {
      Values want;
      for (std::size_t i = 0; i < std::size(kSlots); ++i) {
        HostTensor param = t[fmt::format("param{}", i)];
        reference::SgdState state;
        for (std::size_t k = 0; k < calls.size(); ++k) {
          if (!calls[k].skipped) {
            DLPROBE_ASSIGN_OR_RETURN(
                reference::SgdStep r,
                reference::sgd_step<double>(param, t[key("grad", i, k)], state, c.p));
            param = std::move(r.param);
            state = std::move(r.state);
          }
          want[key("param", i, k)] = param;
          if (state.momentum_buffer) want[key("state0_", i, k)] = *state.momentum_buffer;
        }
      }
      return want;
    };
    out.push_back(std::move(v));
  }
  return out;
}

struct AdamWCase {
  AdamWParams p;
  bool flag;
};
const AdamWCase kAdamWCases[] = {
    {{1e-3, 0.9, 0.999, 1e-8, 1e-2}, false},
    {{0.05, 0.5, 0.9, 1e-3, 0.1}, false},
    {{1e-2, 0.9, 0.999, 1e-8, 1e-2}, false},
    {{}, true},
};

std::vector<Variant> adamw(Precision precision) {
  std::vector<Variant> out;
  std::uint64_t seed = 13000;
  for (const AdamWCase& c : kAdamWCases) {
    const std::vector<Call>& calls = c.flag ? kStepsWithASkip : kSteps;
    Variant v = variant(
        fmt::format("lr {} betas ({}, {}) eps {} weight decay {}{}", c.p.lr, c.p.beta1, c.p.beta2,
                    c.p.eps, c.p.weight_decay, c.flag ? ", step 2 skipped by found_inf" : ""),
        precision);
    // exp_avg_sq sums terms (1 - beta2) g^2.
    optimizer_tensors(v, calls, {Check{}, Check{.scale = 1.0 - c.p.beta2}}, c.flag, seed += 1000);
    v.run = [c, calls](Backend& b, BackendTensors& t) {
      return run_optimizer(
          b, t, calls, 2, c.flag,
          [&c](Backend& be, std::span<const OptimizerSlot> s, const TensorView& counters,
               const TensorView& found_inf) { return be.adamw_step(s, c.p, counters, found_inf); });
    };
    v.reference = [c, calls](const OpTensors& t) -> Result<Values> {
      Values want;
      for (std::size_t i = 0; i < std::size(kSlots); ++i) {
        HostTensor param = t[fmt::format("param{}", i)];
        reference::AdamWState state;
        for (std::size_t k = 0; k < calls.size(); ++k) {
          if (!calls[k].skipped) {
            DLPROBE_ASSIGN_OR_RETURN(
                reference::AdamWStep r,
                reference::adamw_step<double>(param, t[key("grad", i, k)], state, c.p));
            param = std::move(r.param);
            state = std::move(r.state);
          }
          want[key("param", i, k)] = param;
          want[key("state0_", i, k)] = *state.exp_avg;
          want[key("state1_", i, k)] = *state.exp_avg_sq;
        }
      }
      return want;
    };
    out.push_back(std::move(v));
  }
  return out;
}

// ---- the step counters ----

struct AdvanceCase {
  std::string_view name;
  StepCounters before;
  bool scaler;  // GradScaler's update with kAdvanceScaler; without, only the count
  double found_inf;
  StepCounters want;  // GradScaler.update's values, worked out by hand
};
// A growth interval of 3 and factors that are not powers of two (2.5 and 0.25 are exact).
const GradScalerOptions kAdvanceScaler{
    .init_scale = 1.0, .growth_factor = 2.5, .backoff_factor = 0.25, .growth_interval = 3};
const AdvanceCase kAdvanceCases[] = {
    {"no scaler", {1.0, 1.0, 0.0, 6.0}, false, 0.0, {1.0, 1.0, 0.0, 7.0}},
    {"clean step", {1024.0, 512.0, 1.0, 6.0}, true, 0.0, {1024.0, 1024.0, 2.0, 7.0}},
    {"third clean step grows", {1024.0, 1024.0, 2.0, 6.0}, true, 0.0, {2560.0, 1024.0, 0.0, 7.0}},
    {"overflow backs off, not counted",
     {1024.0, 1024.0, 2.0, 6.0},
     true,
     1.0,
     {256.0, 1024.0, 0.0, 6.0}},
    {"growth past the largest double keeps the scale",
     {1e308, 1e308, 2.0, 0.0},
     true,
     0.0,
     {1e308, 1e308, 0.0, 1.0}},
};

std::vector<Variant> advance_step(Precision precision) {
  std::vector<Variant> out;
  for (const AdvanceCase& c : kAdvanceCases) {
    Variant v = variant(std::string(c.name), precision);
    v.tensors.input("counters", counters_tensor(c.before), Role::own);
    v.checks.push_back({"counters", {.exact = true}});
    if (c.scaler) v.tensors.input("found_inf", filled({1}, c.found_inf), Role::fp32);
    v.run = [c](Backend& b, BackendTensors& t) {
      return c.scaler ? b.advance_step(t["counters"], &kAdvanceScaler, t["found_inf"])
                      : b.advance_step(t["counters"], nullptr, TensorView{});
    };
    v.reference = [c](const OpTensors&) -> Result<Values> {
      return Values{{"counters", counters_tensor(c.want)}};
    };
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  using P = Precisions;
  static const std::vector<OpCase> cases = {
      {"conv2d_forward", P::math, nullptr, conv_forward},
      {"conv2d_backward_data", P::math, nullptr, conv_backward_data},
      {"conv2d_backward_weight", P::math, nullptr, conv_backward_weight},
      {"batch_norm_train_forward", P::activations, nullptr,
       [](Precision p) { return batch_norm_train(p, false, false); }},
      {"batch_norm_inference_forward", P::activations, nullptr,
       [](Precision p) { return batch_norm_inference(p, false, false); }},
      {"batch_norm_backward", P::activations, nullptr,
       [](Precision p) { return batch_norm_backward(p, false); }},
      {"batch_norm_relu_train_forward", P::activations, &Offers::fused_batch_norm_relu,
       [](Precision p) { return batch_norm_train(p, true, false); }},
      {"batch_norm_add_relu_train_forward", P::activations, &Offers::fused_batch_norm_relu,
       [](Precision p) { return batch_norm_train(p, true, true); }},
      {"batch_norm_relu_inference_forward", P::activations, &Offers::fused_batch_norm_relu,
       [](Precision p) { return batch_norm_inference(p, true, false); }},
      {"batch_norm_add_relu_inference_forward", P::activations, &Offers::fused_batch_norm_relu,
       [](Precision p) { return batch_norm_inference(p, true, true); }},
      {"batch_norm_relu_backward", P::activations, &Offers::fused_batch_norm_relu,
       [](Precision p) { return batch_norm_backward(p, true); }},
      {"batch_norm_add_backward", P::activations, nullptr,
       [](Precision p) { return batch_norm_add_backward(p, kBatchNormShapes, kLayouts); }},
      {"batch_norm_relu_backward_recomputed", P::activations, &Offers::fused_conv_batch_norm,
       [](Precision p) { return batch_norm_backward(p, true, kBatchNormShapes, kLayouts, false); }},
      {"batch_norm_finalize", P::activations, &Offers::fused_conv_batch_norm, batch_norm_finalize},
      {"batch_norm_finalize_apply", P::activations, &Offers::fused_conv_batch_norm,
       batch_norm_finalize_apply},
      {"batch_norm_apply", P::activations, &Offers::fused_conv_batch_norm, batch_norm_apply},
      {"batch_norm_apply_add", P::activations, &Offers::fused_conv_batch_norm,
       batch_norm_apply_add},
      {"batch_norm_finalize_apply_add", P::activations, &Offers::fused_conv_batch_norm,
       batch_norm_finalize_apply_add},
      {"batch_norm_train_forward_gpu_sized", P::activations, &Offers::gpu_sized_batch_norm,
       [](Precision p) {
         return batch_norm_train(p, false, false, kGpuSizedBatchNormShapes, kNhwc);
       }},
      {"batch_norm_add_relu_train_forward_gpu_sized", P::activations, &Offers::gpu_sized_batch_norm,
       [](Precision p) {
         return batch_norm_train(p, true, true, kGpuSizedBatchNormShapes, kNhwc);
       }},
      {"batch_norm_backward_gpu_sized", P::activations, &Offers::gpu_sized_batch_norm,
       [](Precision p) { return batch_norm_backward(p, false, kGpuSizedBatchNormShapes, kNhwc); }},
      {"batch_norm_add_backward_gpu_sized", P::activations, &Offers::gpu_sized_batch_norm,
       [](Precision p) { return batch_norm_add_backward(p, kGpuSizedBatchNormShapes, kNhwc); }},
      {"batch_norm_relu_backward_gpu_sized", P::activations, &Offers::gpu_sized_batch_norm,
       [](Precision p) { return batch_norm_backward(p, true, kGpuSizedBatchNormShapes, kNhwc); }},
      {"relu_forward", P::activations, nullptr, relu_forward},
      {"relu_backward", P::activations, nullptr,
       [](Precision p) { return relu_backward(p, false); }},
      {"relu_backward_add", P::activations, &Offers::fused_relu_backward_add,
       [](Precision p) { return relu_backward(p, true); }},
      {"add", P::activations, nullptr, [](Precision p) { return add(p, false); }},
      {"add_across_layouts", P::activations, &Offers::mixed_layouts,
       [](Precision p) { return add(p, true); }},
      {"max_pool2d_forward", P::activations, nullptr,
       [](Precision p) { return max_pool(p, false); }},
      {"max_pool2d_backward", P::activations, nullptr,
       [](Precision p) { return max_pool(p, true); }},
      {"max_pool2d_backward_recomputed", P::activations, &Offers::recomputed_max_pool,
       max_pool_recomputed},
      {"batch_norm_relu_max_pool_train_forward", P::activations, &Offers::recomputed_max_pool,
       [](Precision p) { return batch_norm_relu_max_pool(p, false); }},
      {"batch_norm_relu_max_pool_train_forward_positions", P::activations,
       &Offers::fused_max_pool_backward,
       [](Precision p) { return batch_norm_relu_max_pool(p, true); }},
      {"batch_norm_relu_max_pool_backward", P::activations, &Offers::fused_max_pool_backward,
       [](Precision p) { return batch_norm_relu_max_pool_backward(p, false); }},
      {"batch_norm_relu_max_pool_backward_at_positions", P::activations,
       &Offers::fused_max_pool_backward,
       [](Precision p) { return batch_norm_relu_max_pool_backward(p, true); }},
      {"global_avg_pool_forward", P::activations, nullptr,
       [](Precision p) { return global_avg_pool(p, false); }},
      {"global_avg_pool_backward", P::activations, nullptr,
       [](Precision p) { return global_avg_pool(p, true); }},
      {"linear_forward", P::math, nullptr, [](Precision p) { return linear(p, false); }},
      {"linear_backward", P::math, nullptr, [](Precision p) { return linear(p, true); }},
      {"cross_entropy_forward", P::fp32, nullptr,
       [](Precision p) { return cross_entropy(p, false); }},
      {"cross_entropy_backward", P::fp32, nullptr,
       [](Precision p) { return cross_entropy(p, true); }},
      {"cast", P::storage, nullptr, [](Precision p) { return cast(p, false, false); }},
      {"cast_many", P::storage, nullptr, [](Precision p) { return cast_many(p); }},
      {"cast_across_layouts", P::storage, &Offers::mixed_layouts,
       [](Precision p) { return cast(p, true, false); }},
      {"cast_half_to_half", P::halves, &Offers::half_to_half_casts,
       [](Precision p) { return cast(p, false, true); }},
      {"fill", P::storage, nullptr, fill},
      {"unscale_gradients", P::fp32, nullptr, unscale_gradients},
      {"sgd_step", P::fp32, nullptr, sgd},
      {"adamw_step", P::fp32, nullptr, adamw},
      {"advance_step", P::fp32, nullptr, advance_step},
  };
  return cases;
}

}  // namespace dlprobe::testing
