// SGD and AdamW against sequences worked out by hand (one parameter, gradients 0.5, -1, 0.25,
// lr 0.1, weight decay 0.1), following torch.optim's documented update rules step by step.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/backends/reference/reference.h"
#include "test_util.h"

namespace dlprobe {
namespace {

using testing::desc;
using testing::scalar;

const double kGrads[3] = {0.5, -1.0, 0.25};

std::vector<double> run_sgd(const SgdParams& p) {
  HostTensor param = scalar(1.0);
  reference::SgdState state;
  std::vector<double> out;
  for (double g : kGrads) {
    auto step = reference::sgd_step<double>(param, scalar(g), state, p);
    EXPECT_TRUE(step.has_value()) << step.status().message();
    param = step->param;
    state = step->state;
    out.push_back(param.get(0));
  }
  return out;
}

TEST(Sgd, MomentumWeightDecayHandComputed) {
  // Step 1: d = 0.5 + 0.1 * 1 = 0.6, buf = d (first step), p = 1 - 0.1 * 0.6 = 0.94.
  // Step 2: d = -1 + 0.094 = -0.906, buf = 0.9 * 0.6 - 0.906 = -0.366, p = 0.9766.
  // Step 3: d = 0.25 + 0.09766 = 0.34766, buf = -0.3294 + 0.34766 = 0.01826, p = 0.974774.
  const std::vector<double> p = run_sgd(SgdParams{0.1, 0.9, 0.0, 0.1, false});
  EXPECT_NEAR(p[0], 0.94, 1e-15);
  EXPECT_NEAR(p[1], 0.9766, 1e-15);
  EXPECT_NEAR(p[2], 0.974774, 1e-15);
}

TEST(Sgd, DampeningSkipsTheFirstStep) {
  // Step 1 as above (buf = d, undamped). Step 2: buf = 0.54 + 0.5 * -0.906 = 0.087, p = 0.9313.
  // Step 3: d = 0.25 + 0.09313, buf = 0.0783 + 0.5 * 0.34313 = 0.249865, p = 0.9063135.
  const std::vector<double> p = run_sgd(SgdParams{0.1, 0.9, 0.5, 0.1, false});
  EXPECT_NEAR(p[0], 0.94, 1e-15);
  EXPECT_NEAR(p[1], 0.9313, 1e-15);
  EXPECT_NEAR(p[2], 0.9063135, 1e-15);
}

TEST(Sgd, Nesterov) {
  // Step 1: buf = 0.6, d = 0.6 + 0.9 * 0.6 = 1.14, p = 0.886.
  // Step 2: d = -1 + 0.0886 = -0.9114, buf = 0.54 - 0.9114 = -0.3714,
  //         d = -0.9114 - 0.33426 = -1.24566, p = 1.010566.
  const std::vector<double> p = run_sgd(SgdParams{0.1, 0.9, 0.0, 0.1, true});
  EXPECT_NEAR(p[0], 0.886, 1e-15);
  EXPECT_NEAR(p[1], 1.010566, 1e-15);
  EXPECT_NEAR(p[2], 0.973948646, 1e-15);
}

TEST(Sgd, PlainKeepsNoBuffer) {
  HostTensor param = scalar(1.0);
  auto step =
      reference::sgd_step<double>(param, scalar(0.5), {}, SgdParams{0.1, 0.0, 0.0, 0.1, false});
  ASSERT_TRUE(step.has_value());
  EXPECT_NEAR(step->param.get(0), 0.94, 1e-15);
  EXPECT_FALSE(step->state.momentum_buffer.has_value());
  EXPECT_EQ(param.get(0), 1.0);  // inputs are never modified
}

TEST(Sgd, TensorsAcrossLayoutsAndFloat) {
  // Every element follows the scalar rule; the gradient may come in the other layout.
  const HostTensor p0 = testing::rand({2, 3, 2, 2}, 1, DType::fp64, Layout::nhwc);
  const HostTensor g0 = testing::rand({2, 3, 2, 2}, 2, DType::fp64, Layout::nchw);
  const SgdParams prm{0.05, 0.9, 0.1, 1e-2, false};
  auto s1 = reference::sgd_step<double>(p0, g0, {}, prm).value();
  auto s2 = reference::sgd_step<double>(s1.param, g0, s1.state, prm).value();
  EXPECT_EQ(s2.param.layout(), Layout::nhwc);
  testing::for_each_index(p0.shape(), [&](std::array<std::int64_t, 4> i) {
    const double g = testing::value_at(g0, i);
    double p = testing::value_at(p0, i);
    double d = g + 1e-2 * p;
    double buf = d;
    p -= 0.05 * buf;
    d = g + 1e-2 * p;
    buf = 0.9 * buf + 0.9 * d;
    p -= 0.05 * buf;
    EXPECT_NEAR(testing::value_at(s2.param, i), p, 1e-15);
  });
  const HostTensor pf = p0.to_dtype(DType::fp32).value();
  const HostTensor gf = g0.to_dtype(DType::fp32).value();
  auto f1 = reference::sgd_step<float>(pf, gf, {}, prm).value();
  auto f2 = reference::sgd_step<float>(f1.param, gf, f1.state, prm).value();
  EXPECT_TRUE(testing::all_close(f2.param, s2.param, 1e-6, 1e-7));
}

TEST(Sgd, RefusesMismatchedState) {
  reference::SgdState state;
  state.momentum_buffer = HostTensor::zeros(desc({2}));
  auto r = reference::sgd_step<double>(scalar(1.0), scalar(1.0), state, SgdParams{0.1, 0.9});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(), "sgd_step: momentum buffer is fp64[2], expected fp64[1]");
}

TEST(AdamW, HandComputed) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1, p = 1.
  // Step 1: p = 0.99; m = 0.05; v = 0.00025; step size = 0.1 / (1 - 0.9) = 1;
  //         denom = sqrt(0.00025) / sqrt(0.001) + 1e-8 = 0.5 + 1e-8; p = 0.99 - 0.05 / denom
  //         = 0.890000002 (to 1e-16).
  // Step 2: p = 0.99 * p; m = 0.9 * 0.05 - 0.1 = -0.055; v = 0.999 * 0.00025 + 0.001 = 0.00124975;
  //         step size = 0.1 / 0.19; denom = sqrt(0.00124975) / sqrt(0.001999) + 1e-8.
  const AdamWParams prm{0.1, 0.9, 0.999, 1e-8, 0.1};
  HostTensor param = scalar(1.0);
  reference::AdamWState state;
  std::vector<double> out;
  for (double g : kGrads) {
    auto step = reference::adamw_step<double>(param, scalar(g), state, prm);
    ASSERT_TRUE(step.has_value()) << step.status().message();
    param = step->param;
    state = step->state;
    out.push_back(param.get(0));
  }
  EXPECT_EQ(state.step, 3);
  EXPECT_NEAR(out[0], 0.890000002, 1e-15);
  const double p2 =
      0.99 * out[0] + (0.1 / 0.19) * 0.055 / (std::sqrt(0.00124975) / std::sqrt(0.001999) + 1e-8);
  EXPECT_NEAR(out[1], p2, 1e-15);
  EXPECT_NEAR(out[1], 0.9177103542205653, 1e-15);
  EXPECT_NEAR(out[2], 0.9222023167767704, 1e-15);
  EXPECT_NEAR(state.exp_avg->get(0), 0.9 * -0.055 + 0.1 * 0.25, 1e-16);
}

// The reference backend steps fp32 parameters in a loop of its own, so the backend op test does
// not reach the float instantiations of sgd_step and adamw_step; here they are checked.
TEST(AdamW, FloatAgreesWithDoubleOverSteps) {
  const AdamWParams prm{1e-2, 0.9, 0.999, 1e-8, 1e-2};
  HostTensor pd = testing::rand({4, 3}, 10);
  HostTensor pf = pd.to_dtype(DType::fp32).value();
  pd = pf.to_dtype(DType::fp64).value();
  reference::AdamWState sd, sf;
  for (int i = 0; i < 5; ++i) {
    const HostTensor gf = testing::rand({4, 3}, 20 + static_cast<std::uint64_t>(i), DType::fp32);
    auto d = reference::adamw_step<double>(pd, gf.to_dtype(DType::fp64).value(), sd, prm).value();
    auto f = reference::adamw_step<float>(pf, gf, sf, prm).value();
    pd = d.param;
    sd = d.state;
    pf = f.param;
    sf = f.state;
  }
  EXPECT_TRUE(testing::all_close(pf, pd, 1e-6, 1e-6));
}

TEST(AdamW, RefusesInconsistentState) {
  reference::AdamWState state;
  state.step = 2;
  auto r = reference::adamw_step<double>(scalar(1.0), scalar(1.0), state, AdamWParams{});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(),
            "adamw_step: state at step 2 must have moments exactly when step > 0");
  auto f = reference::adamw_step<float>(scalar(1.0), scalar(1.0), {}, AdamWParams{});
  ASSERT_FALSE(f.has_value());
  EXPECT_EQ(f.status().message(), "adamw_step: param is fp64 but the compute type is fp32");
}

}  // namespace
}  // namespace dlprobe
