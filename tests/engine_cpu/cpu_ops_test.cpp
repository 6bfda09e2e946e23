// Batch norm, ReLU, max pool, add, global average pool, linear, cross-entropy, cast, fill and
// gradient unscaling of the CPU backend against the reference backend in fp64 (on the same
// rounded inputs), in both layouts; PyTorch's edge cases (max-pool ties, NaN, -inf windows, large
// logits) by value.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_test_util.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe {
namespace {

using testing::close;
using testing::desc;
using testing::out;
using testing::pair;
using testing::to64;
using testing::tol;

using CpuOps = testing::CpuBackendTest;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- batch norm ----

struct BnInputs {
  testing::Pair x, gamma, beta, rm, rv;
};
BnInputs bn_inputs(const Shape& s, DType dtype, Layout l, std::uint64_t seed) {
  const Shape c{s[1]};
  return {pair(s, seed, dtype, l, -2.0, 3.0),
          pair(c, seed + 1, DType::fp32, Layout::nchw, 0.5, 1.5), pair(c, seed + 2, DType::fp32),
          pair(c, seed + 3, DType::fp32), pair(c, seed + 4, DType::fp32, Layout::nchw, 0.5, 2.0)};
}

TEST_F(CpuOps, BatchNormTrainForwardMatchesReference) {
  const Shape s{3, 5, 4, 3};
  const BatchNormParams p{1e-5, 0.1};
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SCOPED_TRACE(layout_name(l));
    BnInputs in = bn_inputs(s, DType::fp32, l, 10);
    auto want = reference::batch_norm_train_forward<double>(in.x.f64, in.gamma.f64, in.beta.f64,
                                                            in.rm.f64, in.rv.f64, p)
                    .value();
    HostTensor y = out(in.x.low.desc());
    HostTensor mean = out(in.gamma.low.desc());
    HostTensor invstd = out(in.gamma.low.desc());
    Status st = backend_->batch_norm_train_forward(
        in.x.low.view(), in.gamma.low.view(), in.beta.low.view(), in.rm.low.view(),
        in.rv.low.view(), y.view(), mean.view(), invstd.view(), p);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_TRUE(close(y, want.y, tol(DType::fp32, 36)));
    EXPECT_TRUE(close(mean, want.save_mean, tol(DType::fp32, 36)));
    EXPECT_TRUE(close(invstd, want.save_invstd, tol(DType::fp32, 36)));
    // Updated in place: momentum blend with the unbiased variance.
    EXPECT_TRUE(close(in.rm.low, want.running_mean, tol(DType::fp32, 36)));
    EXPECT_TRUE(close(in.rv.low, want.running_var, tol(DType::fp32, 36)));
  }
}

TEST_F(CpuOps, BatchNormInferenceMatchesReference) {
  const BatchNormParams p{1e-3, 0.1};
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    BnInputs in = bn_inputs({2, 4, 3, 3}, DType::fp32, l, 20);
    HostTensor y = out(in.x.low.desc());
    Status st = backend_->batch_norm_inference_forward(in.x.low.view(), in.gamma.low.view(),
                                                       in.beta.low.view(), in.rm.low.view(),
                                                       in.rv.low.view(), y.view(), p);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_TRUE(close(y,
                      reference::batch_norm_inference_forward<double>(
                          in.x.f64, in.gamma.f64, in.beta.f64, in.rm.f64, in.rv.f64, p)
                          .value(),
                      tol(DType::fp32)));
  }
}

TEST_F(CpuOps, BatchNormBackwardMatchesReference) {
  const Shape s{4, 3, 5, 2};
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SCOPED_TRACE(layout_name(l));
    BnInputs in = bn_inputs(s, DType::fp32, l, 30);
    auto dy = pair(s, 35, DType::fp32, l);
    // Saved statistics as the training forward would leave them (fp32), used by both sides.
    auto fwd = reference::batch_norm_train_forward<double>(in.x.f64, in.gamma.f64, in.beta.f64,
                                                           in.rm.f64, in.rv.f64, {})
                   .value();
    HostTensor mean = testing::to_dtype(fwd.save_mean, DType::fp32);
    HostTensor invstd = testing::to_dtype(fwd.save_invstd, DType::fp32);
    auto want = reference::batch_norm_backward<double>(dy.f64, in.x.f64, in.gamma.f64, to64(mean),
                                                       to64(invstd))
                    .value();
    HostTensor dx = out(dy.low.desc());
    HostTensor dgamma = out(in.gamma.low.desc());
    HostTensor dbeta = out(in.gamma.low.desc());
    Status st = backend_->batch_norm_backward(dy.low.view(), in.x.low.view(), in.gamma.low.view(),
                                              mean.view(), invstd.view(), dx.view(), dgamma.view(),
                                              dbeta.view());
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_TRUE(close(dx, want.dx, tol(DType::fp32, 40)));
    EXPECT_TRUE(close(dgamma, want.dgamma, tol(DType::fp32, 40)));
    EXPECT_TRUE(close(dbeta, want.dbeta, tol(DType::fp32, 40)));
  }
}

// ---- ReLU ----

TEST_F(CpuOps, ReluForwardAndBackwardMatchReference) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto x = pair({2, 3, 4, 5}, 40, DType::fp32, l);
    // Exact zeros, where the backward must pass nothing (y > 0 is false).
    x.low.set(0, 0.0);
    x.low.set(7, -0.0);
    x.f64 = to64(x.low);
    auto dy = pair(x.low.shape(), 41, DType::fp32, l);
    HostTensor y = out(x.low.desc());
    ASSERT_TRUE(backend_->relu_forward(x.low.view(), y.view()).is_ok());
    const HostTensor want_y = reference::relu_forward<double>(x.f64).value();
    EXPECT_TRUE(close(y, want_y, {0, 0}));
    HostTensor dx = out(dy.low.desc());
    ASSERT_TRUE(backend_->relu_backward(dy.low.view(), y.view(), dx.view()).is_ok());
    EXPECT_TRUE(close(dx, reference::relu_backward<double>(dy.f64, want_y).value(), {0, 0}));
  }
}

TEST_F(CpuOps, ReluPropagatesNanAsTorchRelu) {
  // oneDNN's JIT ReLU would give 0 for the NaN.
  HostTensor x(desc({1, 1, 1, 3}, DType::fp32));
  x.set(0, std::nan(""));
  x.set(1, -2.0);
  x.set(2, 3.0);
  HostTensor y = out(x.desc());
  ASSERT_TRUE(backend_->relu_forward(x.view(), y.view()).is_ok());
  EXPECT_TRUE(std::isnan(y.get(0)));
  EXPECT_EQ(y.get(1), 0.0);
  EXPECT_EQ(y.get(2), 3.0);
  // Backward is PyTorch's threshold_backward(dy, y, 0) = (y <= 0 ? 0 : dy): a NaN y passes its
  // gradient (the reference backend's y > 0 test would give 0 there), a NaN gradient is dropped
  // where y is 0 (oneDNN's mask multiply would give NaN).
  HostTensor dy(x.desc());
  dy.set(0, 1.0);
  dy.set(1, std::nan(""));
  dy.set(2, std::nan(""));
  HostTensor dx = out(x.desc());
  ASSERT_TRUE(backend_->relu_backward(dy.view(), y.view(), dx.view()).is_ok());
  EXPECT_EQ(dx.get(0), 1.0);
  EXPECT_EQ(dx.get(1), 0.0);
  EXPECT_TRUE(std::isnan(dx.get(2)));
}

// ---- max pool ----

void check_max_pool(Backend& b, const HostTensor& x32, const MaxPool2dParams& p,
                    std::uint64_t seed) {
  const HostTensor x64 = to64(x32);
  const Shape ys = max_pool2d_output_shape(x32.shape(), p).value();
  auto dy = pair(ys, seed, DType::fp32, x32.layout());
  HostTensor y = out(desc(ys, DType::fp32, x32.layout()));
  ASSERT_TRUE(b.max_pool2d_forward(const_cast<HostTensor&>(x32).view(), y.view(), p).is_ok());
  // NaN == NaN for this comparison: compare bit-for-bit through the values.
  const HostTensor want_y = reference::max_pool2d_forward<double>(x64, p).value();
  testing::for_each_index(ys, [&](std::array<std::int64_t, 4> i) {
    const double a = testing::value_at(y, i);
    const double e = testing::value_at(want_y, i);
    EXPECT_TRUE(a == e || (std::isnan(a) && std::isnan(e))) << a << " vs " << e;
  });
  HostTensor dx = out(x32.desc());
  ASSERT_TRUE(b.max_pool2d_backward(dy.low.view(), const_cast<HostTensor&>(x32).view(), y.view(),
                                    dx.view(), p)
                  .is_ok());
  EXPECT_TRUE(close(dx, reference::max_pool2d_backward<double>(dy.f64, x64, p).value(),
                    tol(DType::fp32, 4)));
}

TEST_F(CpuOps, MaxPoolMatchesReference) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    check_max_pool(*backend_, pair({2, 3, 9, 8}, 50, DType::fp32, l).low, {}, 51);
    check_max_pool(*backend_, pair({1, 2, 7, 7}, 52, DType::fp32, l).low, {{2, 3}, {1, 2}, {1, 1}},
                   53);
  }
}

TEST_F(CpuOps, MaxPoolTiesGoToTheFirstMaximum) {
  // Few distinct values, so most windows hold their maximum more than once; the gradient must go
  // to the first in row-major window order, as PyTorch's CPU kernel sends it.
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    HostTensor x = pair({2, 2, 8, 8}, 60, DType::fp32, l).low;
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, std::floor(x.get(i) * 2));
    check_max_pool(*backend_, x, {}, 61);
    // A constant input: every window ties everywhere.
    x.fill(1.0);
    check_max_pool(*backend_, x, {}, 62);
  }
}

TEST_F(CpuOps, MaxPoolPropagatesNanAndKeepsMinusInfinity) {
  // oneDNN's pooling would give 3 for the NaN window and -3.4e38 for the -inf one.
  HostTensor x(desc({1, 1, 2, 4}, DType::fp32));
  const std::vector<double> v = {-kInf, -kInf, 1, std::nan(""), -kInf, -kInf, 2, 3};
  for (std::size_t i = 0; i < v.size(); ++i) x.set(static_cast<std::int64_t>(i), v[i]);
  const MaxPool2dParams p{{2, 2}, {2, 2}, {0, 0}};
  HostTensor y = out(desc({1, 1, 1, 2}, DType::fp32));
  ASSERT_TRUE(backend_->max_pool2d_forward(x.view(), y.view(), p).is_ok());
  EXPECT_EQ(y.get(0), -kInf);
  EXPECT_TRUE(std::isnan(y.get(1)));
  check_max_pool(*backend_, x, p, 63);
}

// ---- add, global average pool, linear ----

TEST_F(CpuOps, AddInAnyLayoutAndInPlace) {
  for (Layout la : {Layout::nchw, Layout::nhwc}) {
    for (Layout lb : {Layout::nchw, Layout::nhwc}) {
      auto a = pair({2, 3, 4, 5}, 70, DType::fp32, la);
      auto b = pair({2, 3, 4, 5}, 71, DType::fp32, lb);
      // One fp32 rounding of the exact sum.
      const HostTensor want =
          to64(testing::to_dtype(reference::add<double>(a.f64, b.f64).value(), DType::fp32));
      HostTensor y = out(a.low.desc());
      ASSERT_TRUE(backend_->add(a.low.view(), b.low.view(), y.view()).is_ok());
      EXPECT_TRUE(close(y, want, {0, 0}));
      // y aliasing b: the residual add writing into the shortcut's buffer.
      ASSERT_TRUE(backend_->add(a.low.view(), b.low.view(), b.low.view()).is_ok());
      EXPECT_TRUE(close(b.low, want, {0, 0}));
      // y aliasing a.
      ASSERT_TRUE(backend_->add(a.low.view(), y.view(), a.low.view()).is_ok());
      EXPECT_TRUE(close(a.low, reference::add<double>(a.f64, want).value(), tol(DType::fp32)));
    }
  }
}

TEST_F(CpuOps, GlobalAvgPoolMatchesReference) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto x = pair({3, 5, 7, 6}, 80, DType::fp32, l);
    HostTensor y = out(desc({3, 5}, DType::fp32));
    ASSERT_TRUE(backend_->global_avg_pool_forward(x.low.view(), y.view()).is_ok());
    EXPECT_TRUE(
        close(y, reference::global_avg_pool_forward<double>(x.f64).value(), tol(DType::fp32, 42)));
    auto dy = pair({3, 5}, 81, DType::fp32);
    HostTensor dx = out(x.low.desc());
    ASSERT_TRUE(backend_->global_avg_pool_backward(dy.low.view(), dx.view()).is_ok());
    EXPECT_TRUE(close(dx, reference::global_avg_pool_backward<double>(dy.f64, x.f64.desc()).value(),
                      tol(DType::fp32)));
  }
}

TEST_F(CpuOps, LinearMatchesReference) {
  auto x = pair({4, 37}, 90, DType::fp32);
  auto w = pair({11, 37}, 91, DType::fp32);
  auto b = pair({11}, 92, DType::fp32);
  auto dy = pair({4, 11}, 93, DType::fp32);
  HostTensor y = out(desc({4, 11}, DType::fp32));
  ASSERT_TRUE(backend_->linear_forward(x.low.view(), w.low.view(), b.low.view(), y.view()).is_ok());
  EXPECT_TRUE(close(y, reference::linear_forward<double>(x.f64, w.f64, b.f64).value(),
                    tol(DType::fp32, 37)));
  HostTensor dx = out(x.low.desc());
  HostTensor dw = out(w.low.desc());
  HostTensor db = out(b.low.desc());
  Status s = backend_->linear_backward(dy.low.view(), x.low.view(), w.low.view(), dx.view(),
                                       dw.view(), db.view());
  ASSERT_TRUE(s.is_ok()) << s.message();
  auto want = reference::linear_backward<double>(dy.f64, x.f64, w.f64).value();
  EXPECT_TRUE(close(dx, want.dx, tol(DType::fp32, 11)));
  EXPECT_TRUE(close(dw, want.dw, tol(DType::fp32, 4)));
  EXPECT_TRUE(close(db, want.db, tol(DType::fp32, 4)));
}

// ---- cross-entropy ----

TEST_F(CpuOps, CrossEntropyMatchesReferenceWithBothLabelTypes) {
  // Logits around 80 would overflow exp() in fp32 without the max shift.
  auto logits = pair({6, 10}, 100, DType::fp32, Layout::nchw, 70.0, 90.0);
  for (DType label_type : {DType::int32, DType::int64}) {
    HostTensor labels = HostTensor::random(desc({6}, label_type), 101, 0, 10);
    HostTensor loss = out(desc({1}, DType::fp32));
    ASSERT_TRUE(
        backend_->cross_entropy_forward(logits.low.view(), labels.view(), loss.view()).is_ok());
    EXPECT_TRUE(close(loss, reference::cross_entropy_forward<double>(logits.f64, labels).value(),
                      tol(DType::fp32, 10)));
    HostTensor scale = HostTensor::zeros(desc({1}));
    scale.set(0, 1024.0);
    HostTensor dz = out(logits.low.desc());
    ASSERT_TRUE(
        backend_->cross_entropy_backward(logits.low.view(), labels.view(), 1024.0, dz.view())
            .is_ok());
    EXPECT_TRUE(close(dz,
                      reference::cross_entropy_backward<double>(logits.f64, labels, scale).value(),
                      {1e-5, 1e-4}));
  }
}

TEST_F(CpuOps, CrossEntropyRefusesALabelOutOfRange) {
  auto logits = pair({2, 3}, 110, DType::fp32);
  HostTensor labels = HostTensor::zeros(desc({2}, DType::int64));
  labels.set(1, 3);
  HostTensor loss = out(desc({1}, DType::fp32));
  Status s = backend_->cross_entropy_forward(logits.low.view(), labels.view(), loss.view());
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(),
            "cpu backend: cross_entropy_forward: label 3 of sample 1 is outside [0, 3)");
  EXPECT_TRUE(std::isnan(loss.get(0)));  // nothing written
}

// ---- cast, fill ----

TEST_F(CpuOps, CastRoundsAsTheDtypeConversionsAcrossLayouts) {
  // Values spanning fp16's range edges: subnormals, overflow to inf, ties.
  HostTensor src = testing::rand({2, 3, 4, 5}, 120, DType::fp32, Layout::nchw, -70000, 70000);
  src.set(0, 1e-6);
  src.set(1, 65520.0);  // rounds to inf in fp16
  src.set(2, std::nan(""));
  src.set(3, 1.0 + 1.0 / 4096);  // a bf16 tie
  for (DType low : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(dtype_name(low));
    HostTensor dst = out(desc(src.shape(), low, Layout::nhwc));
    Status s = backend_->cast(src.view(), dst.view());
    ASSERT_TRUE(s.is_ok()) << s.message();
    const HostTensor want = testing::to_dtype(src, low);
    testing::for_each_index(src.shape(), [&](std::array<std::int64_t, 4> i) {
      const double a = testing::value_at(dst, i);
      const double e = testing::value_at(want, i);
      EXPECT_TRUE(a == e || (std::isnan(a) && std::isnan(e))) << a << " vs " << e;
    });
    HostTensor back = out(desc(src.shape(), DType::fp32, Layout::nchw));
    ASSERT_TRUE(backend_->cast(dst.view(), back.view()).is_ok());
    testing::for_each_index(src.shape(), [&](std::array<std::int64_t, 4> i) {
      const double a = testing::value_at(back, i);
      const double e = testing::value_at(want, i);
      EXPECT_TRUE(a == e || (std::isnan(a) && std::isnan(e))) << a << " vs " << e;
    });
  }
}

TEST_F(CpuOps, FillEveryFloatingDtype) {
  for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
    HostTensor x(desc({3, 2, 2, 2}, t, Layout::nhwc));
    ASSERT_TRUE(backend_->fill(x.view(), 0.1).is_ok());
    HostTensor one = HostTensor::zeros(desc({1}));
    one.set(0, 0.1);
    const double rounded = testing::to_dtype(one, t).get(0);
    for (std::int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(x.get(i), rounded);
  }
  HostTensor labels(desc({2}, DType::int32));
  EXPECT_EQ(backend_->fill(labels.view(), 1.0).code(), Errc::invalid_argument);
}

// ---- bf16 ----

TEST_F(CpuOps, Bf16OpsMatchReferenceWhereSupported) {
  if (!bf16_supported()) GTEST_SKIP() << "this CPU has no AVX-512: oneDNN 2.6 runs no bf16 here";
  const DType bf = DType::bf16;
  const testing::Tol stats{1e-4, 1e-4};  // fp32 statistics of bf16 inputs
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SCOPED_TRACE(layout_name(l));
    const Shape s{2, 6, 5, 4};
    BnInputs in = bn_inputs(s, bf, l, 140);
    auto want = reference::batch_norm_train_forward<double>(in.x.f64, in.gamma.f64, in.beta.f64,
                                                            in.rm.f64, in.rv.f64, {})
                    .value();
    HostTensor y = out(in.x.low.desc());
    HostTensor mean = out(in.gamma.low.desc());
    HostTensor invstd = out(in.gamma.low.desc());
    Status st = backend_->batch_norm_train_forward(
        in.x.low.view(), in.gamma.low.view(), in.beta.low.view(), in.rm.low.view(),
        in.rv.low.view(), y.view(), mean.view(), invstd.view(), {});
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_TRUE(close(y, want.y, tol(bf)));
    EXPECT_TRUE(close(mean, want.save_mean, stats));
    EXPECT_TRUE(close(invstd, want.save_invstd, stats));
    EXPECT_TRUE(close(in.rv.low, want.running_var, stats));

    auto dy = pair(s, 141, bf, l);
    auto grads = reference::batch_norm_backward<double>(dy.f64, in.x.f64, in.gamma.f64, to64(mean),
                                                        to64(invstd))
                     .value();
    HostTensor dx = out(dy.low.desc());
    HostTensor dgamma = out(in.gamma.low.desc());
    HostTensor dbeta = out(in.gamma.low.desc());
    st = backend_->batch_norm_backward(dy.low.view(), in.x.low.view(), in.gamma.low.view(),
                                       mean.view(), invstd.view(), dx.view(), dgamma.view(),
                                       dbeta.view());
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_TRUE(close(dx, grads.dx, tol(bf, 40)));
    EXPECT_TRUE(close(dgamma, grads.dgamma, tol(bf, 40)));
    EXPECT_TRUE(close(dbeta, grads.dbeta, tol(bf, 40)));

    HostTensor r = out(in.x.low.desc());
    ASSERT_TRUE(backend_->relu_forward(in.x.low.view(), r.view()).is_ok());
    EXPECT_TRUE(close(r, reference::relu_forward<double>(in.x.f64).value(), {0, 0}));

    HostTensor p = out(desc(max_pool2d_output_shape(s, {}).value(), bf, l));
    ASSERT_TRUE(backend_->max_pool2d_forward(in.x.low.view(), p.view(), {}).is_ok());
    EXPECT_TRUE(close(p, reference::max_pool2d_forward<double>(in.x.f64, {}).value(), {0, 0}));
    auto dp = pair(p.shape(), 142, bf, l);
    HostTensor dpx = out(in.x.low.desc());
    ASSERT_TRUE(
        backend_->max_pool2d_backward(dp.low.view(), in.x.low.view(), p.view(), dpx.view(), {})
            .is_ok());
    EXPECT_TRUE(close(dpx, reference::max_pool2d_backward<double>(dp.f64, in.x.f64, {}).value(),
                      tol(bf, 4)));

    auto b = pair(s, 143, bf, l);
    HostTensor sum = out(in.x.low.desc());
    ASSERT_TRUE(backend_->add(in.x.low.view(), b.low.view(), sum.view()).is_ok());
    EXPECT_TRUE(close(sum, reference::add<double>(in.x.f64, b.f64).value(), tol(bf)));

    HostTensor g = out(desc({2, 6}, bf));
    ASSERT_TRUE(backend_->global_avg_pool_forward(in.x.low.view(), g.view()).is_ok());
    EXPECT_TRUE(close(g, reference::global_avg_pool_forward<double>(in.x.f64).value(), tol(bf)));
  }
  auto x = pair({4, 24}, 150, bf);
  auto w = pair({5, 24}, 151, bf);
  auto b = pair({5}, 152, bf);
  auto dy = pair({4, 5}, 153, bf);
  HostTensor y = out(desc({4, 5}, bf));
  ASSERT_TRUE(backend_->linear_forward(x.low.view(), w.low.view(), b.low.view(), y.view()).is_ok());
  EXPECT_TRUE(
      close(y, reference::linear_forward<double>(x.f64, w.f64, b.f64).value(), tol(bf, 24)));
  HostTensor dx = out(x.low.desc());
  HostTensor dw = out(w.low.desc());
  HostTensor db = out(b.low.desc());
  Status st = backend_->linear_backward(dy.low.view(), x.low.view(), w.low.view(), dx.view(),
                                        dw.view(), db.view());
  ASSERT_TRUE(st.is_ok()) << st.message();
  auto want = reference::linear_backward<double>(dy.f64, x.f64, w.f64).value();
  EXPECT_TRUE(close(dx, want.dx, tol(bf, 5)));
  EXPECT_TRUE(close(dw, want.dw, tol(bf, 4)));
  EXPECT_TRUE(close(db, want.db, tol(bf, 4)));
}

// ---- gradient unscaling ----

TEST_F(CpuOps, UnscaleMultipliesAndDetectsInfAndNan) {
  HostTensor found = HostTensor::zeros(desc({1}, DType::fp32));
  auto g1 = pair({5}, 130, DType::fp32);
  auto g2 = pair({2, 3}, 131, DType::fp32);
  std::vector<TensorView> grads = {g1.low.view(), g2.low.view()};
  ASSERT_TRUE(backend_->unscale_gradients(grads, 0.125, found.view()).is_ok());
  EXPECT_EQ(found.get(0), 0.0);
  for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(g1.low.get(i), g1.f64.get(i) * 0.125);
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(g2.low.get(i), g2.f64.get(i) * 0.125);

  for (double bad : {kInf, -kInf, std::nan("")}) {
    g2.low.set(4, bad);
    found.set(0, 0.0);
    ASSERT_TRUE(backend_->unscale_gradients(grads, 0.5, found.view()).is_ok());
    EXPECT_EQ(found.get(0), 1.0) << bad;
    g2.low.set(4, 0.0);
  }
  // A finite call leaves an earlier flag set, so one flag collects several calls.
  ASSERT_TRUE(backend_->unscale_gradients(grads, 1.0, found.view()).is_ok());
  EXPECT_EQ(found.get(0), 1.0);
}

}  // namespace
}  // namespace dlprobe
