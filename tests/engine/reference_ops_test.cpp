// Batch norm, ReLU, max pool, residual add, global average pool, linear and cross-entropy of the
// reference functions: each against formulas written out here, finite differences in fp64 and
// layout invariance. Their float instantiations against double are the backend op test's
// reference row (backend_ops_test), which runs them through the reference backend.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/backends/reference/reference.h"
#include "test_util.h"

namespace dlprobe {
namespace {

using testing::all_close;
using testing::desc;
using testing::dot;
using testing::kGradAtol;
using testing::kGradRtol;
using testing::numeric_gradient;
using testing::rand;
using testing::scalar;

HostTensor to32(const HostTensor& t) {
  return t.to_dtype(DType::fp32).value();
}

// ---- batch norm ----

struct BnInputs {
  HostTensor x, gamma, beta, rm, rv;
};

BnInputs bn_inputs(const Shape& s, Layout l, std::uint64_t seed) {
  const Shape c{s[1]};
  return {rand(s, seed, DType::fp64, l, -2.0, 3.0),
          rand(c, seed + 1, DType::fp64, Layout::nchw, 0.5, 1.5), rand(c, seed + 2),
          rand(c, seed + 3), rand(c, seed + 4, DType::fp64, Layout::nchw, 0.5, 2.0)};
}

TEST(BatchNorm, TrainForwardMatchesFormulaInBothLayouts) {
  const Shape s{3, 4, 5, 2};
  const BatchNormParams p{1e-5, 0.1};
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    BnInputs in = bn_inputs(s, l, 10);
    auto out =
        reference::batch_norm_train_forward<double>(in.x, in.gamma, in.beta, in.rm, in.rv, p);
    ASSERT_TRUE(out.has_value()) << out.status().message();
    const HostTensor xc = in.x.to_layout(Layout::nchw);  // channel c, sample n: a contiguous run
    const auto v = xc.values<double>();
    const std::int64_t hw = s[2] * s[3];
    const double m = static_cast<double>(s[0] * hw);
    for (std::int64_t c = 0; c < s[1]; ++c) {
      double sum = 0, sq = 0;
      for (std::int64_t n = 0; n < s[0]; ++n)
        for (std::int64_t i = 0; i < hw; ++i)
          sum += v[static_cast<std::size_t>((n * s[1] + c) * hw + i)];
      const double mean = sum / m;
      for (std::int64_t n = 0; n < s[0]; ++n)
        for (std::int64_t i = 0; i < hw; ++i) {
          const double d = v[static_cast<std::size_t>((n * s[1] + c) * hw + i)] - mean;
          sq += d * d;
        }
      const double var = sq / m;
      EXPECT_NEAR(out->save_mean.get(c), mean, 1e-14);
      EXPECT_NEAR(out->save_invstd.get(c), 1 / std::sqrt(var + 1e-5), 1e-13);
      EXPECT_NEAR(out->running_mean.get(c), 0.9 * in.rm.get(c) + 0.1 * mean, 1e-14);
      // PyTorch updates the running variance with the unbiased estimate.
      EXPECT_NEAR(out->running_var.get(c), 0.9 * in.rv.get(c) + 0.1 * sq / (m - 1), 1e-14);
      for (std::int64_t n = 0; n < s[0]; ++n)
        for (std::int64_t h = 0; h < s[2]; ++h)
          for (std::int64_t w = 0; w < s[3]; ++w) {
            const double want =
                (xc.at<double>(n, c, h, w) - mean) / std::sqrt(var + 1e-5) * in.gamma.get(c) +
                in.beta.get(c);
            EXPECT_NEAR(out->y.at<double>(n, c, h, w), want, 1e-13);
          }
    }
    EXPECT_EQ(out->y.layout(), l);
  }
}

TEST(BatchNorm, HandComputedRunningStats) {
  // One channel holding 1, 2, 3, 4: mean 2.5, biased variance 1.25, unbiased 5/3.
  HostTensor x(desc({4, 1, 1, 1}));
  for (int i = 0; i < 4; ++i) x.set(i, i + 1);
  HostTensor one = HostTensor::zeros(desc({1}));
  one.fill(1.0);
  HostTensor zero = HostTensor::zeros(desc({1}));
  auto out =
      reference::batch_norm_train_forward<double>(x, one, zero, zero, one, {1e-5, 0.1}).value();
  EXPECT_DOUBLE_EQ(out.running_mean.get(0), 0.25);
  EXPECT_DOUBLE_EQ(out.running_var.get(0), 0.9 + 0.1 * 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(out.y.get(0), -1.5 / std::sqrt(1.25 + 1e-5));
  auto bad = reference::batch_norm_train_forward<double>(x, one, zero, zero, one, {1e-5, 1.5});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().message(), "batch_norm: momentum must be in [0, 1]");
}

TEST(BatchNorm, InferenceUsesRunningStats) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    BnInputs in = bn_inputs({2, 3, 2, 2}, l, 20);
    HostTensor y =
        reference::batch_norm_inference_forward<double>(in.x, in.gamma, in.beta, in.rm, in.rv, {})
            .value();
    testing::for_each_index(in.x.shape(), [&](std::array<std::int64_t, 4> i) {
      const std::int64_t c = i[1];
      const double want = (testing::value_at(in.x, i) - in.rm.get(c)) /
                              std::sqrt(in.rv.get(c) + 1e-5) * in.gamma.get(c) +
                          in.beta.get(c);
      EXPECT_NEAR(testing::value_at(y, i), want, 1e-14);
    });
  }
}

TEST(BatchNorm, GradientsMatchFiniteDifferencesInBothLayouts) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    BnInputs in = bn_inputs({3, 2, 2, 3}, l, 30);
    const HostTensor dy = rand(in.x.shape(), 35, DType::fp64, l);
    auto loss = [&] {
      return dot(
          reference::batch_norm_train_forward<double>(in.x, in.gamma, in.beta, in.rm, in.rv, {})
              .value()
              .y,
          dy);
    };
    auto fwd =
        reference::batch_norm_train_forward<double>(in.x, in.gamma, in.beta, in.rm, in.rv, {})
            .value();
    auto g =
        reference::batch_norm_backward<double>(dy, in.x, in.gamma, fwd.save_mean, fwd.save_invstd)
            .value();
    EXPECT_EQ(g.dx.layout(), l);
    EXPECT_TRUE(all_close(g.dx, numeric_gradient(in.x, loss), kGradRtol, kGradAtol));
    EXPECT_TRUE(all_close(g.dgamma, numeric_gradient(in.gamma, loss), kGradRtol, kGradAtol));
    EXPECT_TRUE(all_close(g.dbeta, numeric_gradient(in.beta, loss), kGradRtol, kGradAtol));
  }
}

// ---- ReLU, add ----

TEST(Relu, ForwardBackwardAndNaN) {
  HostTensor x(desc({5}));
  const double vals[5] = {-2.0, -0.0, 0.0, 3.0, std::numeric_limits<double>::quiet_NaN()};
  for (int i = 0; i < 5; ++i) x.set(i, vals[i]);
  HostTensor y = reference::relu_forward<double>(x).value();
  EXPECT_EQ(y.get(0), 0.0);
  EXPECT_EQ(y.get(3), 3.0);
  EXPECT_TRUE(std::isnan(y.get(4)));  // NaN propagates, as torch.relu
  HostTensor dy = HostTensor::zeros(x.desc());
  dy.fill(5.0);
  HostTensor dx = reference::relu_backward<double>(dy, y).value();
  EXPECT_EQ(dx.get(0), 0.0);
  EXPECT_EQ(dx.get(2), 0.0);  // the gradient at 0 is 0, as PyTorch's threshold_backward
  EXPECT_EQ(dx.get(3), 5.0);
}

TEST(Relu, GradientMatchesFiniteDifferencesAcrossLayouts) {
  HostTensor x = rand({2, 3, 3, 3}, 50, DType::fp64, Layout::nhwc);
  for (double& v : x.values<double>()) {
    if (std::abs(v) < 1e-3) v = 0.5;  // keep finite differences off the kink
  }
  const HostTensor dy = rand(x.shape(), 51);  // NCHW: mixed layouts on purpose
  auto loss = [&] { return dot(reference::relu_forward<double>(x).value(), dy); };
  HostTensor y = reference::relu_forward<double>(x).value();
  HostTensor dx = reference::relu_backward<double>(dy, y).value();
  EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), kGradRtol, kGradAtol));
}

TEST(Add, SumsAcrossLayouts) {
  HostTensor a = rand({2, 3, 2, 2}, 60, DType::fp32, Layout::nchw);
  HostTensor b = rand({2, 3, 2, 2}, 61, DType::fp32, Layout::nhwc);
  HostTensor s = reference::add<float>(a, b).value();
  EXPECT_EQ(s.layout(), Layout::nchw);
  testing::for_each_index(a.shape(), [&](std::array<std::int64_t, 4> i) {
    EXPECT_EQ(testing::value_at(s, i),
              static_cast<float>(testing::value_at(a, i) + testing::value_at(b, i)));
  });
  auto bad = reference::add<float>(a, rand({2, 3, 2, 1}, 62, DType::fp32));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().message(), "add: shapes 2x3x2x2 and 2x3x2x1 differ");
}

// ---- max pool ----

// Independent max pool: pad with -inf explicitly, then take each window's maximum.
HostTensor direct_max_pool(const HostTensor& x, const MaxPool2dParams& p) {
  const Shape& s = x.shape();
  const std::int64_t ph = s[2] + 2 * p.pad[0], pw = s[3] + 2 * p.pad[1];
  HostTensor padded = HostTensor::zeros(desc({s[0], s[1], ph, pw}));
  padded.fill(-std::numeric_limits<double>::infinity());
  testing::for_each_index(s, [&](std::array<std::int64_t, 4> i) {
    padded.at<double>(i[0], i[1], i[2] + p.pad[0], i[3] + p.pad[1]) = testing::value_at(x, i);
  });
  const std::int64_t oh = (ph - p.kernel[0]) / p.stride[0] + 1;
  const std::int64_t ow = (pw - p.kernel[1]) / p.stride[1] + 1;
  HostTensor y(desc({s[0], s[1], oh, ow}));
  testing::for_each_index(y.shape(), [&](std::array<std::int64_t, 4> i) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t r = 0; r < p.kernel[0]; ++r)
      for (std::int64_t c = 0; c < p.kernel[1]; ++c)
        m = std::max(m,
                     padded.at<double>(i[0], i[1], i[2] * p.stride[0] + r, i[3] * p.stride[1] + c));
    y.at<double>(i[0], i[1], i[2], i[3]) = m;
  });
  return y;
}

const MaxPool2dParams kPools[] = {
    {{3, 3}, {2, 2}, {1, 1}},  // ResNet's stem
    {{2, 2}, {2, 2}, {0, 0}},
    {{3, 2}, {1, 2}, {1, 0}},
};

TEST(MaxPool, ForwardMatchesDirectAndGradientsMatchFiniteDifferences) {
  for (const MaxPool2dParams& p : kPools) {
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      HostTensor x = rand({2, 2, 7, 6}, 70, DType::fp64, l);
      HostTensor y = reference::max_pool2d_forward<double>(x, p).value();
      EXPECT_EQ(y.layout(), l);
      EXPECT_TRUE(all_close(y, direct_max_pool(x, p), 0, 0));
      const HostTensor dy = rand(y.shape(), 71, DType::fp64, l);
      auto loss = [&] { return dot(reference::max_pool2d_forward<double>(x, p).value(), dy); };
      HostTensor dx = reference::max_pool2d_backward<double>(dy, x, p).value();
      EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), kGradRtol, kGradAtol));
    }
  }
}

TEST(MaxPool, TiesGoToTheFirstMaximumAndNaNPropagates) {
  // All-equal input: every window's gradient goes to its first in-bounds element, as in PyTorch.
  HostTensor x = HostTensor::zeros(desc({1, 1, 4, 4}));
  x.fill(1.0);
  const MaxPool2dParams p;
  HostTensor dy = HostTensor::zeros(desc({1, 1, 2, 2}));
  for (int i = 0; i < 4; ++i) dy.set(i, 10.0 * (i + 1));
  // Windows start at rows/cols -1 and 1 (pad 1, stride 2): first elements (0,0), (0,1), (1,0),
  // (1,1). A window of -inf never moves off its first element either.
  for (double fill : {1.0, -std::numeric_limits<double>::infinity()}) {
    x.fill(fill);
    HostTensor dx = reference::max_pool2d_backward<double>(dy, x, p).value();
    EXPECT_EQ(dx.at<double>(0, 0, 0, 0), 10.0) << fill;
    EXPECT_EQ(dx.at<double>(0, 0, 0, 1), 20.0) << fill;
    EXPECT_EQ(dx.at<double>(0, 0, 1, 0), 30.0) << fill;
    EXPECT_EQ(dx.at<double>(0, 0, 1, 1), 40.0) << fill;
    double total = 0;
    for (double v : dx.values<double>()) total += v;
    EXPECT_EQ(total, 100.0) << fill;
  }
  x.fill(1.0);
  x.at<double>(0, 0, 3, 3) = std::numeric_limits<double>::quiet_NaN();
  HostTensor y = reference::max_pool2d_forward<double>(x, p).value();
  EXPECT_TRUE(std::isnan(y.at<double>(0, 0, 1, 1)));
  EXPECT_EQ(y.at<double>(0, 0, 0, 0), 1.0);
}

// ---- global average pool ----

TEST(GlobalAvgPool, ForwardAndGradient) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    HostTensor x = rand({2, 3, 3, 2}, 80, DType::fp64, l);
    HostTensor y = reference::global_avg_pool_forward<double>(x).value();
    ASSERT_EQ(y.shape(), (Shape{2, 3}));
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t c = 0; c < 3; ++c) {
        double sum = 0;
        for (std::int64_t h = 0; h < 3; ++h)
          for (std::int64_t w = 0; w < 2; ++w) sum += x.at<double>(n, c, h, w);
        EXPECT_NEAR(y.at<double>(n, c), sum / 6, 1e-15);
      }
    const HostTensor dy = rand(y.shape(), 81);
    auto loss = [&] { return dot(reference::global_avg_pool_forward<double>(x).value(), dy); };
    HostTensor dx = reference::global_avg_pool_backward<double>(dy, x.desc()).value();
    EXPECT_EQ(dx.layout(), l);
    EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), kGradRtol, kGradAtol));
  }
}

// ---- linear ----

TEST(Linear, HandComputed) {
  // x = [[1, 2]], W = [[1, 0], [2, -1], [0, 3]] (PyTorch's [out, in]), b = [0.5, 0, -1]:
  // y = x W^T + b = [1.5, 0, 5].
  HostTensor x(desc({1, 2}));
  x.set(0, 1);
  x.set(1, 2);
  HostTensor w(desc({3, 2}));
  const double wv[6] = {1, 0, 2, -1, 0, 3};
  for (int i = 0; i < 6; ++i) w.set(i, wv[i]);
  HostTensor b(desc({3}));
  b.set(0, 0.5);
  b.set(1, 0);
  b.set(2, -1);
  HostTensor y = reference::linear_forward<double>(x, w, b).value();
  EXPECT_EQ(y.get(0), 1.5);
  EXPECT_EQ(y.get(1), 0.0);
  EXPECT_EQ(y.get(2), 5.0);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  HostTensor x = rand({3, 4}, 90);
  HostTensor w = rand({5, 4}, 91);
  HostTensor b = rand({5}, 92);
  const HostTensor dy = rand({3, 5}, 93);
  auto loss = [&] { return dot(reference::linear_forward<double>(x, w, b).value(), dy); };
  auto g = reference::linear_backward<double>(dy, x, w).value();
  EXPECT_TRUE(all_close(g.dx, numeric_gradient(x, loss), kGradRtol, kGradAtol));
  EXPECT_TRUE(all_close(g.dw, numeric_gradient(w, loss), kGradRtol, kGradAtol));
  EXPECT_TRUE(all_close(g.db, numeric_gradient(b, loss), kGradRtol, kGradAtol));
}

// ---- cross-entropy ----

HostTensor labels_of(std::initializer_list<std::int64_t> v, DType t = DType::int32) {
  HostTensor l(desc({static_cast<std::int64_t>(v.size())}, t));
  std::int64_t i = 0;
  for (std::int64_t x : v) l.set(i++, static_cast<double>(x));
  return l;
}

TEST(CrossEntropy, MatchesLogSoftmaxFormula) {
  const HostTensor z = rand({4, 5}, 100, DType::fp64, Layout::nchw, -3.0, 3.0);
  const HostTensor y = labels_of({0, 4, 2, 2});
  double want = 0;
  for (std::int64_t n = 0; n < 4; ++n) {
    double denom = 0;
    for (std::int64_t k = 0; k < 5; ++k) denom += std::exp(z.at<double>(n, k));
    want -= std::log(
        std::exp(z.at<double>(n, y.values<std::int32_t>()[static_cast<std::size_t>(n)])) / denom);
  }
  HostTensor loss = reference::cross_entropy_forward<double>(z, y).value();
  EXPECT_NEAR(loss.get(0), want / 4, 1e-14);
  // int64 labels (torch.long) give the same.
  EXPECT_EQ(reference::cross_entropy_forward<double>(z, labels_of({0, 4, 2, 2}, DType::int64))
                .value()
                .get(0),
            loss.get(0));
}

TEST(CrossEntropy, StableForHugeLogits) {
  // exp(1000) overflows; shifting every logit by a constant must not change the loss.
  HostTensor z = rand({2, 3}, 110, DType::fp32, Layout::nchw, -1.0, 1.0);
  HostTensor shifted = z;
  for (float& v : shifted.values<float>()) v += 1000.0f;
  const HostTensor y = labels_of({1, 2});
  const double a = reference::cross_entropy_forward<float>(z, y).value().get(0);
  const double b = reference::cross_entropy_forward<float>(shifted, y).value().get(0);
  EXPECT_TRUE(std::isfinite(b));
  // float resolution at 1000 is 6e-5 per logit.
  EXPECT_NEAR(a, b, 2e-4);
  HostTensor g = reference::cross_entropy_backward<float>(shifted, y, to32(scalar(1.0))).value();
  for (float v : g.values<float>()) EXPECT_TRUE(std::isfinite(v));
}

TEST(CrossEntropy, GradientMatchesFiniteDifferencesAndScales) {
  HostTensor z = rand({3, 4}, 120, DType::fp64, Layout::nchw, -2.0, 2.0);
  const HostTensor y = labels_of({3, 0, 1});
  auto loss = [&] { return reference::cross_entropy_forward<double>(z, y).value().get(0); };
  HostTensor g = reference::cross_entropy_backward<double>(z, y, scalar(1.0)).value();
  EXPECT_TRUE(all_close(g, numeric_gradient(z, loss), kGradRtol, kGradAtol));
  for (std::int64_t n = 0; n < 3; ++n) {
    double row = 0;
    for (std::int64_t k = 0; k < 4; ++k) row += g.at<double>(n, k);
    EXPECT_NEAR(row, 0.0, 1e-15);  // softmax sums to 1, the one-hot too
  }
  // A loss scale (fp16 training) multiplies the gradient.
  HostTensor g8 = reference::cross_entropy_backward<double>(z, y, scalar(8.0)).value();
  for (std::int64_t i = 0; i < g.numel(); ++i) EXPECT_EQ(g8.get(i), 8.0 * g.get(i));
}

TEST(CrossEntropy, RefusesBadLabels) {
  const HostTensor z = rand({2, 3}, 130);
  auto r = reference::cross_entropy_forward<double>(z, labels_of({1, 3}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(), "cross_entropy_forward: label 3 of sample 1 is outside [0, 3)");
  auto neg = reference::cross_entropy_forward<double>(z, labels_of({-100, 0}, DType::int64));
  ASSERT_FALSE(neg.has_value());  // no ignore_index
  auto f = reference::cross_entropy_forward<double>(z, rand({2}, 1));
  ASSERT_FALSE(f.has_value());
  EXPECT_EQ(f.status().message(), "cross_entropy_forward: labels must be int32 or int64, got fp64");
}

}  // namespace
}  // namespace dlprobe
