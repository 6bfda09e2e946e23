// Every non-convolution slot of the CUDA backend against the reference backend in fp64, on fresh
// random inputs, in both layouts and every activation dtype the slot takes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe::testing {
namespace {

constexpr DType kActivationTypes[] = {DType::fp32, DType::fp16, DType::bf16};
constexpr Layout kLayouts[] = {Layout::nchw, Layout::nhwc};

// Statistics and parameter gradients are fp32 sums over many elements: a little looser than one
// fp32 rounding.
constexpr Tolerance kStatTol{2e-5, 2e-5};

// The shapes exercise one split and many (channel reductions), odd sizes (one element a thread),
// 16-byte packs in both layouts, and NHWC channel tiles of 8 to 256 packs (2048 channels: two
// tiles in fp32).
const Shape kBatchNormShapes[] = {
    {3, 5, 7, 9}, {8, 64, 28, 28}, {16, 40, 6, 6}, {4, 256, 9, 9}, {2, 2048, 3, 3}};

TEST(CudaBatchNorm, TrainForwardMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 1000;
  const BatchNormParams p{1e-5, 0.1};
  for (const Shape& s : kBatchNormShapes) {
    for (DType t : kActivationTypes) {
      for (Layout l : kLayouts) {
        SCOPED_TRACE(fmt::format("{} {}", s.str(), case_name(t, l)));
        const Shape cs{s[1]};
        // An offset mean (2 +- 1) checks that the variance does not cancel.
        const HostTensor x = rand(s, ++seed, t, l, 1.0, 3.0);
        const HostTensor gamma = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.5, 1.5);
        const HostTensor beta = rand(cs, ++seed, DType::fp32);
        const HostTensor rm = rand(cs, ++seed, DType::fp32);
        const HostTensor rv = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.5, 1.5);
        const DeviceTensor dx_ = to_device(x);
        const DeviceTensor dg = to_device(gamma);
        const DeviceTensor db = to_device(beta);
        const DeviceTensor drm = to_device(rm);
        const DeviceTensor drv = to_device(rv);
        DeviceTensor y = device_output(x.desc());
        DeviceTensor mean = device_output(gamma.desc());
        DeviceTensor invstd = device_output(gamma.desc());
        const Status st =
            backend.batch_norm_train_forward(dx_.view(), dg.view(), db.view(), drm.view(),
                                             drv.view(), y.view(), mean.view(), invstd.view(), p);
        ASSERT_TRUE(st.is_ok()) << st.message();
        const auto ref = reference::batch_norm_train_forward<double>(f64(x), f64(gamma), f64(beta),
                                                                     f64(rm), f64(rv), p)
                             .value();
        EXPECT_TRUE(matches(to_host(y), ref.y)) << "y";
        EXPECT_TRUE(matches(to_host(mean), ref.save_mean, kStatTol)) << "save_mean";
        EXPECT_TRUE(matches(to_host(invstd), ref.save_invstd, kStatTol)) << "save_invstd";
        EXPECT_TRUE(matches(to_host(drm), ref.running_mean, kStatTol)) << "running_mean";
        EXPECT_TRUE(matches(to_host(drv), ref.running_var, kStatTol)) << "running_var";
      }
    }
  }
}

TEST(CudaBatchNorm, InferenceForwardMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 2000;
  const BatchNormParams p{1e-3, 0.1};
  for (DType t : kActivationTypes) {
    for (Layout l : kLayouts) {
      SCOPED_TRACE(case_name(t, l));
      const Shape s{4, 24, 5, 7};
      const Shape cs{24};
      const HostTensor x = rand(s, ++seed, t, l, -2.0, 2.0);
      const HostTensor gamma = rand(cs, ++seed, DType::fp32);
      const HostTensor beta = rand(cs, ++seed, DType::fp32);
      const HostTensor rm = rand(cs, ++seed, DType::fp32);
      const HostTensor rv = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.2, 2.0);
      const DeviceTensor dx_ = to_device(x);
      const DeviceTensor dg = to_device(gamma);
      const DeviceTensor db = to_device(beta);
      const DeviceTensor drm = to_device(rm);
      const DeviceTensor drv = to_device(rv);
      DeviceTensor y = device_output(x.desc());
      ASSERT_TRUE(backend
                      .batch_norm_inference_forward(dx_.view(), dg.view(), db.view(), drm.view(),
                                                    drv.view(), y.view(), p)
                      .is_ok());
      const HostTensor ref = reference::batch_norm_inference_forward<double>(
                                 f64(x), f64(gamma), f64(beta), f64(rm), f64(rv), p)
                                 .value();
      EXPECT_TRUE(matches(to_host(y), ref));
    }
  }
}

TEST(CudaBatchNorm, BackwardMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 3000;
  for (const Shape& s : kBatchNormShapes) {
    for (DType t : kActivationTypes) {
      for (Layout l : kLayouts) {
        SCOPED_TRACE(fmt::format("{} {}", s.str(), case_name(t, l)));
        const Shape cs{s[1]};
        const HostTensor x = rand(s, ++seed, t, l);
        const HostTensor dy = rand(s, ++seed, t, l);
        const HostTensor gamma = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.5, 1.5);
        // Saved statistics as the forward would give them for x.
        const auto fwd = reference::batch_norm_train_forward<double>(f64(x), f64(gamma), f64(gamma),
                                                                     f64(gamma), f64(gamma), {})
                             .value();
        const HostTensor mean = fwd.save_mean.to_dtype(DType::fp32).value();
        const HostTensor invstd = fwd.save_invstd.to_dtype(DType::fp32).value();
        const DeviceTensor ddy = to_device(dy);
        const DeviceTensor dxin = to_device(x);
        const DeviceTensor dg = to_device(gamma);
        const DeviceTensor dmean = to_device(mean);
        const DeviceTensor dinv = to_device(invstd);
        DeviceTensor dx = device_output(x.desc());
        DeviceTensor dgamma = device_output(gamma.desc());
        DeviceTensor dbeta = device_output(gamma.desc());
        const Status st =
            backend.batch_norm_backward(ddy.view(), dxin.view(), dg.view(), dmean.view(),
                                        dinv.view(), dx.view(), dgamma.view(), dbeta.view());
        ASSERT_TRUE(st.is_ok()) << st.message();
        const auto ref = reference::batch_norm_backward<double>(f64(dy), f64(x), f64(gamma),
                                                                f64(mean), f64(invstd))
                             .value();
        // Sums over up to 50k elements of O(1) terms: fp32 accumulation is good to ~1e-4 of
        // their magnitude, which dx inherits through the mean terms.
        const double m = static_cast<double>(s[0] * s[2] * s[3]);
        const Tolerance sum_tol{2e-6 * m, 2e-5};
        EXPECT_TRUE(matches(to_host(dgamma), ref.dgamma, sum_tol)) << "dgamma";
        EXPECT_TRUE(matches(to_host(dbeta), ref.dbeta, sum_tol)) << "dbeta";
        Tolerance dx_tol = tolerance_for(t);
        dx_tol.atol += 1e-5;
        EXPECT_TRUE(matches(to_host(dx), ref.dx, dx_tol)) << "dx";
      }
    }
  }
}

// relu(y + residual) or relu(y), in fp64.
HostTensor add_relu(const HostTensor& y, const HostTensor* residual) {
  HostTensor sum = residual != nullptr ? reference::add<double>(y, f64(*residual)).value() : y;
  return reference::relu_forward<double>(sum).value();
}

// Batch norm with the ReLU (and the residual sum) fused in, against the plain reference ops
// composed in fp64; the fused kernel rounds once, so the tolerance is the plain one.
TEST(CudaBatchNorm, FusedForwardMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 4000;
  const BatchNormParams p{1e-5, 0.1};
  for (const Shape& s : kBatchNormShapes) {
    for (DType t : kActivationTypes) {
      for (Layout l : kLayouts) {
        for (const bool with_residual : {false, true}) {
          SCOPED_TRACE(fmt::format("{} {} residual {}", s.str(), case_name(t, l), with_residual));
          const Shape cs{s[1]};
          const HostTensor x = rand(s, ++seed, t, l, -1.0, 3.0);
          const HostTensor res = rand(s, ++seed, t, l);
          const HostTensor gamma = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.5, 1.5);
          const HostTensor beta = rand(cs, ++seed, DType::fp32);
          const HostTensor rm = rand(cs, ++seed, DType::fp32);
          const HostTensor rv = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.5, 1.5);
          const DeviceTensor dx_ = to_device(x);
          const DeviceTensor dres = to_device(res);
          const DeviceTensor dg = to_device(gamma);
          const DeviceTensor db = to_device(beta);
          DeviceTensor drm = to_device(rm);
          DeviceTensor drv = to_device(rv);
          DeviceTensor y = device_output(x.desc());
          DeviceTensor mean = device_output(gamma.desc());
          DeviceTensor invstd = device_output(gamma.desc());
          const TensorView residual = with_residual ? dres.view() : TensorView{};
          Status st = backend.batch_norm_relu_train_forward(
              dx_.view(), dg.view(), db.view(), drm.view(), drv.view(), residual, y.view(),
              mean.view(), invstd.view(), p);
          ASSERT_TRUE(st.is_ok()) << st.message();
          const auto ref = reference::batch_norm_train_forward<double>(
                               f64(x), f64(gamma), f64(beta), f64(rm), f64(rv), p)
                               .value();
          const HostTensor want = add_relu(ref.y, with_residual ? &res : nullptr);
          EXPECT_TRUE(matches(to_host(y), want)) << "train y";
          EXPECT_TRUE(matches(to_host(mean), ref.save_mean, kStatTol)) << "save_mean";
          EXPECT_TRUE(matches(to_host(invstd), ref.save_invstd, kStatTol)) << "save_invstd";

          // Inference with the running statistics as they are now.
          const HostTensor rm_now = to_host(drm);
          const HostTensor rv_now = to_host(drv);
          DeviceTensor yi = device_output(x.desc());
          st = backend.batch_norm_relu_inference_forward(
              dx_.view(), dg.view(), db.view(), drm.view(), drv.view(), residual, yi.view(), p);
          ASSERT_TRUE(st.is_ok()) << st.message();
          const HostTensor inf = reference::batch_norm_inference_forward<double>(
                                     f64(x), f64(gamma), f64(beta), f64(rm_now), f64(rv_now), p)
                                     .value();
          EXPECT_TRUE(matches(to_host(yi), add_relu(inf, with_residual ? &res : nullptr)))
              << "inference y";
        }
      }
    }
  }
}

// The backward of y = relu(bn(x)) from y's gradient: the ReLU's mask comes from y as stored.
TEST(CudaBatchNorm, FusedBackwardMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 4500;
  for (const Shape& s : kBatchNormShapes) {
    for (DType t : kActivationTypes) {
      for (Layout l : kLayouts) {
        SCOPED_TRACE(fmt::format("{} {}", s.str(), case_name(t, l)));
        const Shape cs{s[1]};
        const HostTensor x = rand(s, ++seed, t, l);
        const HostTensor dy = rand(s, ++seed, t, l);
        const HostTensor gamma = rand(cs, ++seed, DType::fp32, Layout::nchw, 0.5, 1.5);
        const HostTensor beta = rand(cs, ++seed, DType::fp32);
        const auto fwd = reference::batch_norm_train_forward<double>(f64(x), f64(gamma), f64(beta),
                                                                     f64(gamma), f64(gamma), {})
                             .value();
        const HostTensor y = add_relu(fwd.y, nullptr).to_dtype(t).value();
        const HostTensor mean = fwd.save_mean.to_dtype(DType::fp32).value();
        const HostTensor invstd = fwd.save_invstd.to_dtype(DType::fp32).value();
        const DeviceTensor ddy = to_device(dy);
        const DeviceTensor dyout = to_device(y);
        const DeviceTensor dxin = to_device(x);
        const DeviceTensor dg = to_device(gamma);
        const DeviceTensor dmean = to_device(mean);
        const DeviceTensor dinv = to_device(invstd);
        DeviceTensor dx = device_output(x.desc());
        DeviceTensor dgamma = device_output(gamma.desc());
        DeviceTensor dbeta = device_output(gamma.desc());
        const Status st = backend.batch_norm_relu_backward(ddy.view(), dyout.view(), dxin.view(),
                                                           dg.view(), dmean.view(), dinv.view(),
                                                           dx.view(), dgamma.view(), dbeta.view());
        ASSERT_TRUE(st.is_ok()) << st.message();
        const HostTensor masked = reference::relu_backward<double>(f64(dy), f64(y)).value();
        const auto ref = reference::batch_norm_backward<double>(masked, f64(x), f64(gamma),
                                                                f64(mean), f64(invstd))
                             .value();
        const double m = static_cast<double>(s[0] * s[2] * s[3]);
        const Tolerance sum_tol{2e-6 * m, 2e-5};
        EXPECT_TRUE(matches(to_host(dgamma), ref.dgamma, sum_tol)) << "dgamma";
        EXPECT_TRUE(matches(to_host(dbeta), ref.dbeta, sum_tol)) << "dbeta";
        Tolerance dx_tol = tolerance_for(t);
        dx_tol.atol += 1e-5;
        EXPECT_TRUE(matches(to_host(dx), ref.dx, dx_tol)) << "dx";
      }
    }
  }
}

TEST(CudaElementwise, ReluAddCastFill) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 4000;
  // 2*3*7*11 = 462 elements: not a multiple of the 16-byte pack, so the packed loop leaves a tail.
  const Shape s{2, 3, 7, 11};
  for (DType t : kActivationTypes) {
    for (Layout l : kLayouts) {
      SCOPED_TRACE(case_name(t, l));
      const HostTensor x = rand(s, ++seed, t, l);
      const HostTensor other = rand(s, ++seed, t, l);
      const DeviceTensor dxin = to_device(x);
      const DeviceTensor dother = to_device(other);

      DeviceTensor y = device_output(x.desc());
      ASSERT_TRUE(backend.relu_forward(dxin.view(), y.view()).is_ok());
      const HostTensor y_ref = reference::relu_forward<double>(f64(x)).value();
      EXPECT_TRUE(matches(to_host(y), y_ref)) << "relu forward";

      DeviceTensor dx = device_output(x.desc());
      ASSERT_TRUE(backend.relu_backward(dother.view(), y.view(), dx.view()).is_ok());
      EXPECT_TRUE(matches(to_host(dx), reference::relu_backward<double>(f64(other), y_ref).value()))
          << "relu backward";

      // The ReLU's backward from two gradient terms, summed and masked in one pass.
      const HostTensor third = rand(s, ++seed, t, l);
      const DeviceTensor dthird = to_device(third);
      DeviceTensor dx2 = device_output(x.desc());
      ASSERT_TRUE(
          backend.relu_backward_add(dother.view(), dthird.view(), y.view(), dx2.view()).is_ok());
      const HostTensor terms = reference::add<double>(f64(other), f64(third)).value();
      EXPECT_TRUE(matches(to_host(dx2), reference::relu_backward<double>(terms, y_ref).value()))
          << "relu backward of a sum";

      DeviceTensor sum = device_output(x.desc());
      ASSERT_TRUE(backend.add(dxin.view(), dother.view(), sum.view()).is_ok());
      const HostTensor sum_ref = reference::add<double>(f64(x), f64(other)).value();
      EXPECT_TRUE(matches(to_host(sum), sum_ref)) << "add";
      // In place, as the residual connection runs it.
      const DeviceTensor acc = to_device(x);
      ASSERT_TRUE(backend.add(acc.view(), dother.view(), acc.view()).is_ok());
      EXPECT_TRUE(matches(to_host(acc), sum_ref)) << "add in place";

      // Casts round to nearest even exactly as the host conversions do.
      for (DType to : kActivationTypes) {
        DeviceTensor c = device_output(x.desc().with_dtype(to));
        ASSERT_TRUE(backend.cast(dxin.view(), c.view()).is_ok());
        EXPECT_TRUE(matches(to_host(c), x.to_dtype(to).value(), {0.0, 0.0}))
            << "cast to " << dtype_name(to);
      }

      ASSERT_TRUE(backend.fill(y.view(), 0.1).is_ok());
      HostTensor fill_ref(x.desc());
      fill_ref.fill(0.1);
      EXPECT_TRUE(matches(to_host(y), fill_ref, {0.0, 0.0})) << "fill";
    }
  }
}

TEST(CudaPooling, MaxPoolMatchesReferenceWithTies) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 5000;
  const MaxPool2dParams p;  // 3x3, stride 2, pad 1
  // 16 channels: the NHWC kernels move 16-byte packs of channels; 5 and 4, one element a thread.
  for (const Shape& s : {Shape{2, 5, 12, 12}, Shape{3, 4, 9, 7}, Shape{2, 16, 11, 10}}) {
    for (DType t : kActivationTypes) {
      for (Layout l : kLayouts) {
        SCOPED_TRACE(fmt::format("{} {}", s.str(), case_name(t, l)));
        // Whole numbers 0..3: most windows hold ties, so the first-maximum rule matters.
        HostTensor x = rand(s, ++seed, t, l, 0.0, 4.0);
        for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, std::floor(x.get(i)));
        const Shape ys = max_pool2d_output_shape(s, p).value();
        const HostTensor dy = rand(ys, ++seed, t, l);
        const DeviceTensor dxin = to_device(x);
        const DeviceTensor ddy = to_device(dy);
        DeviceTensor y = device_output(desc(ys, t, l));
        ASSERT_TRUE(backend.max_pool2d_forward(dxin.view(), y.view(), p).is_ok());
        EXPECT_TRUE(matches(to_host(y), reference::max_pool2d_forward<double>(f64(x), p).value()))
            << "forward";
        DeviceTensor dx = device_output(x.desc());
        ASSERT_TRUE(
            backend.max_pool2d_backward(ddy.view(), dxin.view(), y.view(), dx.view(), p).is_ok());
        EXPECT_TRUE(matches(to_host(dx),
                            reference::max_pool2d_backward<double>(f64(dy), f64(x), p).value()))
            << "backward";
      }
    }
  }
}

TEST(CudaPooling, GlobalAvgPoolMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 6000;
  for (const Shape& s : {Shape{2, 7, 7, 7}, Shape{4, 64, 3, 5}}) {
    for (DType t : kActivationTypes) {
      for (Layout l : kLayouts) {
        SCOPED_TRACE(fmt::format("{} {}", s.str(), case_name(t, l)));
        const HostTensor x = rand(s, ++seed, t, l);
        const Shape ys{s[0], s[1]};
        const HostTensor dy = rand(ys, ++seed, t);
        const DeviceTensor dxin = to_device(x);
        const DeviceTensor ddy = to_device(dy);
        DeviceTensor y = device_output(desc(ys, t));
        ASSERT_TRUE(backend.global_avg_pool_forward(dxin.view(), y.view()).is_ok());
        EXPECT_TRUE(
            matches(to_host(y), reference::global_avg_pool_forward<double>(f64(x)).value()));
        DeviceTensor dx = device_output(x.desc());
        ASSERT_TRUE(backend.global_avg_pool_backward(ddy.view(), dx.view()).is_ok());
        EXPECT_TRUE(matches(to_host(dx), reference::global_avg_pool_backward<double>(
                                             f64(dy), x.desc().with_dtype(DType::fp64))
                                             .value()));
      }
    }
  }
}

TEST(CudaLinear, ForwardAndBackwardMatchReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 7000;
  struct Case {
    DType t;
    MathMode math;
    Tolerance tol;
  };
  const Case cases[] = {{DType::fp32, MathMode::strict_fp32, tolerance_for(DType::fp32)},
                        {DType::fp32, MathMode::tf32, {1e-2, 5e-3}},
                        {DType::fp16, MathMode::strict_fp32, tolerance_for(DType::fp16)},
                        {DType::bf16, MathMode::strict_fp32, tolerance_for(DType::bf16)}};
  const std::int64_t n = 16, in = 40, out = 24;
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{}{}", dtype_name(c.t), c.math == MathMode::tf32 ? " tf32" : ""));
    backend.set_math_mode(c.math);
    const HostTensor x = rand({n, in}, ++seed, c.t);
    const HostTensor w = rand({out, in}, ++seed, c.t);
    const HostTensor b = rand({out}, ++seed, c.t);
    const HostTensor dy = rand({n, out}, ++seed, c.t);
    const DeviceTensor dxin = to_device(x);
    const DeviceTensor dwin = to_device(w);
    const DeviceTensor dbin = to_device(b);
    const DeviceTensor ddy = to_device(dy);
    DeviceTensor y = device_output(desc({n, out}, c.t));
    const Status sf = backend.linear_forward(dxin.view(), dwin.view(), dbin.view(), y.view());
    ASSERT_TRUE(sf.is_ok()) << sf.message();
    EXPECT_TRUE(matches(to_host(y),
                        reference::linear_forward<double>(f64(x), f64(w), f64(b)).value(), c.tol))
        << "forward";
    DeviceTensor dx = device_output(x.desc());
    DeviceTensor dw = device_output(w.desc());
    DeviceTensor db = device_output(b.desc());
    const Status sb = backend.linear_backward(ddy.view(), dxin.view(), dwin.view(), dx.view(),
                                              dw.view(), db.view());
    ASSERT_TRUE(sb.is_ok()) << sb.message();
    const auto ref = reference::linear_backward<double>(f64(dy), f64(x), f64(w)).value();
    EXPECT_TRUE(matches(to_host(dx), ref.dx, c.tol)) << "dx";
    EXPECT_TRUE(matches(to_host(dw), ref.dw, c.tol)) << "dw";
    EXPECT_TRUE(matches(to_host(db), ref.db, c.tol)) << "db";
  }
  backend.set_math_mode(MathMode::strict_fp32);
}

TEST(CudaLoss, CrossEntropyMatchesReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 8000;
  for (DType label_type : {DType::int32, DType::int64}) {
    SCOPED_TRACE(fmt::format("{}", dtype_name(label_type)));
    const std::int64_t n = 19, k = 1003;
    const HostTensor logits = rand({n, k}, ++seed, DType::fp32, Layout::nchw, -4.0, 4.0);
    const HostTensor labels = rand({n}, ++seed, label_type, Layout::nchw, 0.0, double(k));
    const DeviceTensor dl = to_device(logits);
    const DeviceTensor dlab = to_device(labels);
    DeviceTensor loss = device_output(desc({1}, DType::fp32));
    ASSERT_TRUE(backend.cross_entropy_forward(dl.view(), dlab.view(), loss.view()).is_ok());
    EXPECT_TRUE(matches(to_host(loss),
                        reference::cross_entropy_forward<double>(f64(logits), labels).value()));
    const double scale = 1024.0;
    DeviceTensor dz = device_output(logits.desc());
    ASSERT_TRUE(backend.cross_entropy_backward(dl.view(), dlab.view(), scale, dz.view()).is_ok());
    HostTensor dloss(desc({1}));
    dloss.fill(scale);
    const HostTensor dz_ref =
        reference::cross_entropy_backward<double>(f64(logits), labels, dloss).value();
    // Softmax terms are small against the scale: compare relative to it.
    EXPECT_TRUE(matches(to_host(dz), dz_ref, {1e-5 * scale / double(n), 1e-5}));
  }
}

}  // namespace
}  // namespace dlprobe::testing
