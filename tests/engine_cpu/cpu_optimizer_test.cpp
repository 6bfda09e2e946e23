// The multi-tensor SGD and AdamW loops of the CPU backend against the reference backend's
// single-tensor steps in fp64, over several steps and parameters of different shapes and layouts;
// and the step a found_inf flag skips.
#include <gtest/gtest.h>

#include <vector>

#include "cpu_test_util.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe {
namespace {

using testing::close;
using testing::desc;
using testing::pair;
using testing::to64;

using CpuOptimizer = testing::CpuBackendTest;

constexpr int kSteps = 4;

// Parameters as a ResNet has them: a conv weight in NHWC (KRSC), a bias-like vector, a matrix.
struct Params {
  std::vector<HostTensor> param, state0, state1;
  std::vector<Shape> shapes = {{4, 3, 3, 3}, {7}, {5, 6}};
  explicit Params(std::uint64_t seed) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Layout l = shapes[i].rank == 4 ? Layout::nhwc : Layout::nchw;
      param.push_back(pair(shapes[i], seed + i, DType::fp32, l).low);
      // State buffers start as garbage: the first step must write them before reading.
      HostTensor s0(param.back().desc());
      HostTensor s1(param.back().desc());
      s0.fill(1e30);
      s1.fill(-7.0);
      state0.push_back(s0);
      state1.push_back(s1);
    }
  }
  std::vector<OptimizerSlot> slots(std::vector<HostTensor>& grads, bool with_state) {
    std::vector<OptimizerSlot> out;
    for (std::size_t i = 0; i < param.size(); ++i) {
      OptimizerSlot s{param[i].view(), grads[i].view(), {}, {}};
      if (with_state) {
        s.state0 = state0[i].view();
        s.state1 = state1[i].view();
      }
      out.push_back(s);
    }
    return out;
  }
};

std::vector<HostTensor> grads_for(const Params& p, std::uint64_t seed) {
  std::vector<HostTensor> g;
  for (std::size_t i = 0; i < p.param.size(); ++i) {
    g.push_back(pair(p.shapes[i], seed + i, DType::fp32, p.param[i].layout()).low);
  }
  return g;
}

// Per-step relative error of fp32 against fp64 stays near 1e-7; a few steps stay well within this.
constexpr testing::Tol kOptTol{1e-5, 1e-6};

TEST_F(CpuOptimizer, SgdMatchesReferenceOverSteps) {
  const std::vector<SgdParams> configs = {
      {0.1, 0.9, 0.0, 1e-4, false},  // ResNet's recipe
      {0.05, 0.9, 0.3, 0.01, false},
      {0.1, 0.8, 0.0, 0.01, true},
      {0.2, 0.0, 0.0, 0.0, false},  // plain: no state buffer at all
  };
  for (const SgdParams& cfg : configs) {
    SCOPED_TRACE(::testing::Message() << "momentum " << cfg.momentum << " dampening "
                                      << cfg.dampening << " nesterov " << cfg.nesterov);
    Params cpu(10);
    std::vector<HostTensor> ref_param;
    std::vector<reference::SgdState> ref_state(cpu.param.size());
    for (const HostTensor& t : cpu.param) ref_param.push_back(to64(t));
    for (std::int64_t step = 1; step <= kSteps; ++step) {
      std::vector<HostTensor> grads = grads_for(cpu, 100 + 10 * static_cast<std::uint64_t>(step));
      const auto slots = cpu.slots(grads, cfg.momentum != 0.0);
      Status s = backend_->sgd_step(slots, cfg, step, TensorView{});
      ASSERT_TRUE(s.is_ok()) << s.message();
      for (std::size_t i = 0; i < ref_param.size(); ++i) {
        auto r = reference::sgd_step<double>(ref_param[i], to64(grads[i]), ref_state[i], cfg);
        ASSERT_TRUE(r.has_value()) << r.status().message();
        ref_param[i] = r->param;
        ref_state[i] = r->state;
        EXPECT_TRUE(close(cpu.param[i], ref_param[i], kOptTol)) << "step " << step;
        if (cfg.momentum != 0.0) {
          EXPECT_TRUE(close(cpu.state0[i], *ref_state[i].momentum_buffer, kOptTol));
        }
      }
    }
  }
}

TEST_F(CpuOptimizer, AdamWMatchesReferenceOverSteps) {
  const std::vector<AdamWParams> configs = {{1e-3, 0.9, 0.999, 1e-8, 1e-2},
                                            {0.05, 0.5, 0.9, 1e-3, 0.1}};
  for (const AdamWParams& cfg : configs) {
    SCOPED_TRACE(::testing::Message() << "lr " << cfg.lr);
    Params cpu(20);
    std::vector<HostTensor> ref_param;
    std::vector<reference::AdamWState> ref_state(cpu.param.size());
    for (const HostTensor& t : cpu.param) ref_param.push_back(to64(t));
    for (std::int64_t step = 1; step <= kSteps; ++step) {
      std::vector<HostTensor> grads = grads_for(cpu, 200 + 10 * static_cast<std::uint64_t>(step));
      const auto slots = cpu.slots(grads, true);
      Status s = backend_->adamw_step(slots, cfg, step, TensorView{});
      ASSERT_TRUE(s.is_ok()) << s.message();
      for (std::size_t i = 0; i < ref_param.size(); ++i) {
        auto r = reference::adamw_step<double>(ref_param[i], to64(grads[i]), ref_state[i], cfg);
        ASSERT_TRUE(r.has_value()) << r.status().message();
        ref_param[i] = r->param;
        ref_state[i] = r->state;
        EXPECT_TRUE(close(cpu.param[i], ref_param[i], kOptTol)) << "step " << step;
        EXPECT_TRUE(close(cpu.state0[i], *ref_state[i].exp_avg, kOptTol));
        EXPECT_TRUE(close(cpu.state1[i], *ref_state[i].exp_avg_sq, kOptTol));
      }
    }
  }
}

TEST_F(CpuOptimizer, FoundInfSkipsTheStep) {
  HostTensor flag = HostTensor::zeros(desc({1}, DType::fp32));
  for (bool adamw : {false, true}) {
    Params cpu(30);
    std::vector<HostTensor> grads = grads_for(cpu, 300);
    const auto slots = cpu.slots(grads, true);
    auto step = [&](std::int64_t n) {
      return adamw ? backend_->adamw_step(slots, AdamWParams{}, n, flag.view())
                   : backend_->sgd_step(slots, SgdParams{0.1, 0.9}, n, flag.view());
    };
    flag.set(0, 0.0);
    ASSERT_TRUE(step(1).is_ok());
    const Params before = cpu;
    flag.set(0, 1.0);
    ASSERT_TRUE(step(2).is_ok());
    for (std::size_t i = 0; i < cpu.param.size(); ++i) {
      EXPECT_TRUE(testing::all_close(cpu.param[i], before.param[i], 0, 0));
      EXPECT_TRUE(testing::all_close(cpu.state0[i], before.state0[i], 0, 0));
      EXPECT_TRUE(testing::all_close(cpu.state1[i], before.state1[i], 0, 0));
    }
    // With the flag clear again the step runs.
    flag.set(0, 0.0);
    ASSERT_TRUE(step(2).is_ok());
    EXPECT_FALSE(testing::all_close(cpu.param[0], before.param[0], 0, 0));
  }
}

TEST_F(CpuOptimizer, RefusesMissingStateAndMismatchedGradients) {
  Params cpu(40);
  std::vector<HostTensor> grads = grads_for(cpu, 400);
  auto slots = cpu.slots(grads, false);
  Status s = backend_->sgd_step(slots, SgdParams{0.1, 0.9}, 1, TensorView{});
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(),
            "cpu backend: sgd_step: parameter fp32[4x3x3x3, NHWC] has no optimizer state buffer");
  HostTensor nchw_grad = grads[0].to_layout(Layout::nchw);
  slots = cpu.slots(grads, true);
  slots[0].grad = nchw_grad.view();
  s = backend_->adamw_step(slots, AdamWParams{}, 1, TensorView{});
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_NE(s.message().find("grad is fp32[4x3x3x3, NCHW]"), std::string::npos) << s.message();
  EXPECT_EQ(backend_->adamw_step(cpu.slots(grads, true), AdamWParams{}, 0, TensorView{}).code(),
            Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe
