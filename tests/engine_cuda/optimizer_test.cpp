// Multi-tensor SGD and AdamW over several parameters of different sizes (one launch each step)
// against the reference optimizers in fp64; the skipped step under found_inf; gradient unscaling
// and its inf/NaN detection.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe::testing {
namespace {

// 1 and 3 elements (no full float4), a chunk boundary crossed (70001 > 2 * 32768, odd), and one
// parameter placed 4 bytes into its buffer, which forces the scalar path for that slot.
const std::int64_t kSizes[] = {1, 3, 64, 1000, 70001};
constexpr std::size_t kMisaligned = 3;

// A device fp32 vector whose data may start one element into its buffer.
struct Param {
  memory::DeviceBuffer buffer;
  TensorView view;
};

Param make_param(const HostTensor& host, bool misaligned) {
  const std::size_t offset = misaligned ? sizeof(float) : 0;
  Param p{CudaEnv::allocator()
              .allocate_buffer(host.desc().bytes() + offset, memory::Category::weights)
              .value(),
          {}};
  p.view = {host.desc(), static_cast<std::byte*>(p.buffer.data()) + offset};
  EXPECT_TRUE(CudaEnv::backend().upload(p.view.data, host.data(), host.desc().bytes()).is_ok());
  return p;
}

struct Slots {
  std::vector<HostTensor> params, grads;
  std::vector<Param> dparams, dgrads, dstate0, dstate1;
  std::vector<OptimizerSlot> slots;
};

// Parameters and (per step) gradients with fresh values; states start as NaN, which the first
// step must not read.
Slots make_slots(std::uint64_t seed, bool state0, bool state1) {
  Slots s;
  for (std::size_t i = 0; i < std::size(kSizes); ++i) {
    const bool mis = i == kMisaligned;
    s.params.push_back(rand({kSizes[i]}, seed + 10 * i, DType::fp32));
    s.grads.push_back(rand({kSizes[i]}, seed + 10 * i + 1, DType::fp32));
    s.dparams.push_back(make_param(s.params.back(), mis));
    s.dgrads.push_back(make_param(s.grads.back(), mis));
    HostTensor nan(s.params.back().desc());
    nan.fill(std::numeric_limits<double>::quiet_NaN());
    s.dstate0.push_back(make_param(nan, mis));
    s.dstate1.push_back(make_param(nan, mis));
    s.slots.push_back({s.dparams.back().view, s.dgrads.back().view,
                       state0 ? s.dstate0.back().view : TensorView{},
                       state1 ? s.dstate1.back().view : TensorView{}});
  }
  return s;
}

// New gradients for the next step, on host and device.
void new_grads(Slots& s, std::uint64_t seed) {
  for (std::size_t i = 0; i < s.grads.size(); ++i) {
    s.grads[i] = rand({kSizes[i]}, seed + i, DType::fp32);
    ASSERT_TRUE(CudaEnv::backend()
                    .upload(s.dgrads[i].view.data, s.grads[i].data(), s.grads[i].desc().bytes())
                    .is_ok());
  }
}

TEST(CudaOptimizer, SgdMatchesReferenceOverSteps) {
  const SgdParams variants[] = {
      {0.1, 0.0, 0.0, 1e-2, false},
      {0.05, 0.9, 0.1, 1e-4, false},
      {0.1, 0.9, 0.0, 5e-4, true},
  };
  std::uint64_t seed = 9000;
  for (const SgdParams& p : variants) {
    SCOPED_TRACE(fmt::format("momentum {} nesterov {}", p.momentum, p.nesterov));
    Slots s = make_slots(seed += 100, p.momentum != 0.0, false);
    std::vector<HostTensor> ref_params;
    std::vector<reference::SgdState> ref_states(s.params.size());
    for (const HostTensor& h : s.params) ref_params.push_back(f64(h));
    for (std::int64_t step = 1; step <= 3; ++step) {
      if (step > 1) new_grads(s, seed += 10);
      const Status st = CudaEnv::backend().sgd_step(s.slots, p, step, TensorView{});
      ASSERT_TRUE(st.is_ok()) << st.message();
      for (std::size_t i = 0; i < s.params.size(); ++i) {
        auto r =
            reference::sgd_step<double>(ref_params[i], f64(s.grads[i]), ref_states[i], p).value();
        ref_params[i] = std::move(r.param);
        ref_states[i] = std::move(r.state);
        EXPECT_TRUE(matches(to_host(s.dparams[i].view), ref_params[i]))
            << "param of slot " << i << " at step " << step;
        if (p.momentum != 0.0) {
          EXPECT_TRUE(matches(to_host(s.dstate0[i].view), *ref_states[i].momentum_buffer))
              << "momentum of slot " << i << " at step " << step;
        }
      }
    }
  }
}

TEST(CudaOptimizer, AdamWMatchesReferenceOverSteps) {
  const AdamWParams p{1e-2, 0.9, 0.999, 1e-8, 1e-2};
  Slots s = make_slots(9500, true, true);
  std::vector<HostTensor> ref_params;
  std::vector<reference::AdamWState> ref_states(s.params.size());
  for (const HostTensor& h : s.params) ref_params.push_back(f64(h));
  std::uint64_t seed = 9600;
  for (std::int64_t step = 1; step <= 3; ++step) {
    if (step > 1) new_grads(s, seed += 10);
    const Status st = CudaEnv::backend().adamw_step(s.slots, p, step, TensorView{});
    ASSERT_TRUE(st.is_ok()) << st.message();
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      auto r =
          reference::adamw_step<double>(ref_params[i], f64(s.grads[i]), ref_states[i], p).value();
      ref_params[i] = std::move(r.param);
      ref_states[i] = std::move(r.state);
      EXPECT_TRUE(matches(to_host(s.dparams[i].view), ref_params[i]))
          << "param of slot " << i << " at step " << step;
      EXPECT_TRUE(matches(to_host(s.dstate0[i].view), *ref_states[i].exp_avg))
          << "exp_avg of slot " << i << " at step " << step;
      EXPECT_TRUE(matches(to_host(s.dstate1[i].view), *ref_states[i].exp_avg_sq))
          << "exp_avg_sq of slot " << i << " at step " << step;
    }
  }
}

TEST(CudaOptimizer, FoundInfSkipsTheStep) {
  auto& backend = CudaEnv::backend();
  Slots s = make_slots(9800, true, true);
  DeviceTensor flag = device_output(desc({1}, DType::fp32));
  // A first step with a clear flag gives the states defined values to compare against.
  ASSERT_TRUE(backend.fill(flag.view(), 0.0).is_ok());
  ASSERT_TRUE(backend.adamw_step(s.slots, {}, 1, flag.view()).is_ok());
  std::vector<HostTensor> before;
  for (std::size_t i = 0; i < s.slots.size(); ++i) {
    before.push_back(to_host(s.dparams[i].view));
    before.push_back(to_host(s.dstate0[i].view));
    before.push_back(to_host(s.dstate1[i].view));
  }
  EXPECT_FALSE(matches(before[0], f64(s.params[0]), {0.0, 0.0})) << "the clear step ran";
  ASSERT_TRUE(backend.fill(flag.view(), 1.0).is_ok());
  ASSERT_TRUE(backend.adamw_step(s.slots, {}, 2, flag.view()).is_ok());
  ASSERT_TRUE(backend.sgd_step(s.slots, {0.1, 0.9, 0.0, 0.0, false}, 2, flag.view()).is_ok());
  for (std::size_t i = 0; i < s.slots.size(); ++i) {
    EXPECT_TRUE(matches(to_host(s.dparams[i].view), before[3 * i], {0.0, 0.0})) << i;
    EXPECT_TRUE(matches(to_host(s.dstate0[i].view), before[3 * i + 1], {0.0, 0.0})) << i;
    EXPECT_TRUE(matches(to_host(s.dstate1[i].view), before[3 * i + 2], {0.0, 0.0})) << i;
  }
}

TEST(CudaOptimizer, UnscaleScalesAndDetectsInfAndNan) {
  auto& backend = CudaEnv::backend();
  const double inv_scale = 1.0 / 65536.0;
  for (double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 0.0}) {
    SCOPED_TRACE(fmt::format("bad value {}", bad));
    std::vector<HostTensor> grads;
    std::vector<Param> dgrads;
    std::vector<TensorView> views;
    for (std::size_t i = 0; i < std::size(kSizes); ++i) {
      HostTensor g = rand({kSizes[i]}, 9900 + i, DType::fp32, Layout::nchw, -1e4, 1e4);
      // One bad value deep in the largest gradient (0.0 is the clean case).
      if (i == std::size(kSizes) - 1 && bad != 0.0) g.set(kSizes[i] - 5, bad);
      grads.push_back(g);
      dgrads.push_back(make_param(g, i == kMisaligned));
      views.push_back(dgrads.back().view);
    }
    DeviceTensor flag = device_output(desc({1}, DType::fp32));
    ASSERT_TRUE(backend.fill(flag.view(), 0.0).is_ok());
    ASSERT_TRUE(backend.unscale_gradients(views, inv_scale, flag.view()).is_ok());
    EXPECT_EQ(to_host(flag).get(0), bad != 0.0 ? 1.0 : 0.0);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      HostTensor expected = f64(grads[i]);
      for (std::int64_t k = 0; k < expected.numel(); ++k) {
        expected.set(k, expected.get(k) * inv_scale);  // a power of two: exact
      }
      const HostTensor got = to_host(dgrads[i].view);
      for (std::int64_t k = 0; k < got.numel(); ++k) {
        const double e = expected.get(k);
        const double a = got.get(k);
        ASSERT_TRUE(a == e || (std::isnan(a) && std::isnan(e))) << i << "[" << k << "]";
      }
    }
    // A set flag stays set when nothing is found.
    if (bad == 0.0) {
      ASSERT_TRUE(backend.fill(flag.view(), 1.0).is_ok());
      ASSERT_TRUE(backend.unscale_gradients(views, 1.0, flag.view()).is_ok());
      EXPECT_EQ(to_host(flag).get(0), 1.0);
    }
  }
}

}  // namespace
}  // namespace dlprobe::testing
