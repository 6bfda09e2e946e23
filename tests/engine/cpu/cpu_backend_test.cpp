// What the oneDNN backend does besides its numerics (the table in backend_ops_test checks those):
// PyTorch's edge cases where oneDNN would differ (NaN through ReLU and max pooling, -inf
// windows), the refusals and their messages, and scratch memory. Each test on a fresh backend
// over a fresh allocator, which must hold no scratch when the test ends.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "engine/backends/reference/reference.h"
#include "host_rows.h"
#include "test_util.h"

namespace dlprobe::testing {
namespace {

class CpuBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = onednn_row().open();
    ASSERT_TRUE(opened.has_value()) << opened.status().message();
    cpu_ = std::move(opened).value();
    backend_ = cpu_.backend.get();
  }
  // Before the allocator goes: every scratch buffer must have been given back.
  void TearDown() override {
    if (cpu_.allocator) {
      EXPECT_EQ(cpu_.allocator->stats().all.live_count, 0) << "a slot kept scratch memory";
    }
  }

  bool bf16_supported() { return !onednn_row().unavailable(*backend_, kBf16).has_value(); }

  OpenedBackend cpu_;
  Backend* backend_ = nullptr;
};

TEST_F(CpuBackend, ReluPropagatesNanAsTorchRelu) {
  // oneDNN's JIT ReLU would give 0 for the NaN.
  HostTensor x(desc({1, 1, 1, 3}, DType::fp32));
  x.set(0, std::nan(""));
  x.set(1, -2.0);
  x.set(2, 3.0);
  HostTensor y(x.desc());
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
  HostTensor dx(x.desc());
  ASSERT_TRUE(backend_->relu_backward(dy.view(), y.view(), dx.view()).is_ok());
  EXPECT_EQ(dx.get(0), 1.0);
  EXPECT_EQ(dx.get(1), 0.0);
  EXPECT_TRUE(std::isnan(dx.get(2)));
}

TEST_F(CpuBackend, MaxPoolPropagatesNanAndKeepsMinusInfinity) {
  // oneDNN's pooling would give 3 for the NaN window and -3.4e38 for the -inf one.
  HostTensor x(desc({1, 1, 2, 4}, DType::fp32));
  const std::vector<double> v = {-kInf, -kInf, 1, std::nan(""), -kInf, -kInf, 2, 3};
  for (std::size_t i = 0; i < v.size(); ++i) x.set(static_cast<std::int64_t>(i), v[i]);
  const MaxPool2dParams p{{2, 2}, {2, 2}, {0, 0}};
  HostTensor y(desc({1, 1, 1, 2}, DType::fp32));
  ASSERT_TRUE(backend_->max_pool2d_forward(x.view(), y.view(), p).is_ok());
  EXPECT_EQ(y.get(0), -kInf);
  EXPECT_TRUE(std::isnan(y.get(1)));
  const HostTensor x64 = x.to_dtype(DType::fp64).value();
  EXPECT_TRUE(
      matches(y, reference::max_pool2d_forward<double>(x64, p).value(), kFp32, {.exact = true}));
  // The gradient goes where the reference sends it: to the first -inf, and to the NaN.
  HostTensor dy = rand({1, 1, 1, 2}, 63, DType::fp32);
  HostTensor dx(x.desc());
  ASSERT_TRUE(backend_->max_pool2d_backward(dy.view(), x.view(), y.view(), dx.view(), p).is_ok());
  EXPECT_TRUE(matches(
      dx, reference::max_pool2d_backward<double>(dy.to_dtype(DType::fp64).value(), x64, p).value(),
      kFp32, {.terms = 4}));
}

TEST_F(CpuBackend, CrossEntropyRefusesALabelOutOfRange) {
  HostTensor logits = rand({2, 3}, 110, DType::fp32);
  HostTensor labels = HostTensor::zeros(desc({2}, DType::int64));
  labels.set(1, 3);
  HostTensor loss(desc({1}, DType::fp32));
  Status s = backend_->cross_entropy_forward(logits.view(), labels.view(), loss.view());
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(),
            "cpu backend: cross_entropy_forward: label 3 of sample 1 is outside [0, 3)");
  EXPECT_TRUE(std::isnan(loss.get(0)));  // nothing written
}

TEST_F(CpuBackend, FillRefusesIntegers) {
  HostTensor labels(desc({2}, DType::int32));
  EXPECT_EQ(backend_->fill(labels.view(), 1.0).code(), Errc::invalid_argument);
}

// ---- convolutions ----

const Shape kX{2, 8, 7, 6};
const Shape kW{16, 8, 3, 3};
const Conv2dParams kConv{};

TEST_F(CpuBackend, RepeatedConvolutionsReuseThePrimitiveAndGiveTheSameResult) {
  HostTensor x = rand(kX, 1, DType::fp32, Layout::nhwc);
  HostTensor w = rand(kW, 2, DType::fp32, Layout::nhwc);
  HostTensor y1(desc(conv2d_output_shape(kX, kW, kConv).value(), DType::fp32, Layout::nhwc));
  HostTensor y2(y1.desc());
  ASSERT_TRUE(backend_->conv2d_forward(x.view(), w.view(), y1.view(), kConv).is_ok());
  ASSERT_TRUE(backend_->conv2d_forward(x.view(), w.view(), y2.view(), kConv).is_ok());
  EXPECT_TRUE(identical(y2, y1));
}

TEST_F(CpuBackend, ConvolutionScratchGoesThroughTheAllocatorAsWorkspace) {
  // NHWC weights (KRSC) are never the blocked layout oneDNN's JIT kernels take, so forward
  // reorders them into a workspace buffer; the fixture checks every buffer came back.
  HostTensor x = rand(kX, 3, DType::fp32, Layout::nhwc);
  HostTensor w = rand(kW, 4, DType::fp32, Layout::nhwc);
  HostTensor y(desc(conv2d_output_shape(kX, kW, kConv).value(), DType::fp32, Layout::nhwc));
  ASSERT_TRUE(backend_->conv2d_forward(x.view(), w.view(), y.view(), kConv).is_ok());
  const auto stats = cpu_.allocator->stats();
  EXPECT_GT(stats[memory::Category::workspace].allocation_count, 0);
  EXPECT_EQ(stats.all.allocation_count, stats[memory::Category::workspace].allocation_count);
}

TEST_F(CpuBackend, Bf16WithoutAvx512IsAClearError) {
  if (bf16_supported()) GTEST_SKIP() << "this CPU runs bf16; the error cannot happen here";
  HostTensor x = HostTensor::zeros(desc(kX, DType::bf16));
  HostTensor w = HostTensor::zeros(desc(kW, DType::bf16));
  HostTensor y(desc(conv2d_output_shape(kX, kW, kConv).value(), DType::bf16));
  Status s = backend_->conv2d_forward(x.view(), w.view(), y.view(), kConv);
  EXPECT_EQ(s.code(), Errc::unsupported);
  EXPECT_NE(s.message().find("conv2d_forward: bf16 needs a CPU with AVX-512"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("this CPU offers avx"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST_F(CpuBackend, Fp16IsRefusedWithTheReason) {
  HostTensor x = HostTensor::zeros(desc(kX, DType::fp16));
  HostTensor w = HostTensor::zeros(desc(kW, DType::fp16));
  HostTensor dy(desc(conv2d_output_shape(kX, kW, kConv).value(), DType::fp16));
  HostTensor dw(w.desc());
  Status s = backend_->conv2d_backward_weight(x.view(), dy.view(), dw.view(), kConv);
  EXPECT_EQ(s.code(), Errc::unsupported);
  EXPECT_EQ(s.message(),
            "cpu backend: conv2d_backward_weight: fp16 is not supported on CPU (oneDNN 2.6 "
            "computes fp16 only on AVX512-FP16 CPUs, and PyTorch's CPU autocast uses bf16); use "
            "fp32 or bf16");
}

TEST_F(CpuBackend, MixedDtypesAreRefused) {
  HostTensor x = HostTensor::zeros(desc(kX, DType::fp32));
  HostTensor w = HostTensor::zeros(desc(kW, DType::bf16));
  HostTensor y(desc(conv2d_output_shape(kX, kW, kConv).value(), DType::fp32));
  Status s = backend_->conv2d_forward(x.view(), w.view(), y.view(), kConv);
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(), "cpu backend: conv2d_forward: operands mix fp32 and bf16");
}

// ---- optimizers ----

TEST_F(CpuBackend, OptimizersRefuseMissingStateAndMismatchedGradients) {
  HostTensor param = rand({4, 3, 3, 3}, 40, DType::fp32, Layout::nhwc);
  HostTensor grad = rand({4, 3, 3, 3}, 41, DType::fp32, Layout::nhwc);
  HostTensor m(param.desc());
  HostTensor v(param.desc());
  HostTensor counters = HostTensor::zeros(step_counters_desc());
  std::vector<OptimizerSlot> slots = {{param.view(), grad.view(), {}, {}}};
  Status s = backend_->sgd_step(slots, SgdParams{0.1, 0.9}, counters.view(), TensorView{});
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(),
            "cpu backend: sgd_step: parameter fp32[4x3x3x3, NHWC] has no optimizer state buffer");
  HostTensor nchw_grad = grad.to_layout(Layout::nchw);
  slots = {{param.view(), nchw_grad.view(), m.view(), v.view()}};
  s = backend_->adamw_step(slots, AdamWParams{}, counters.view(), TensorView{});
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_NE(s.message().find("grad is fp32[4x3x3x3, NCHW]"), std::string::npos) << s.message();
  slots = {{param.view(), grad.view(), m.view(), v.view()}};
  s = backend_->adamw_step(slots, AdamWParams{}, TensorView{}, TensorView{});
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(),
            "adamw_step: the step counters must be an fp64 [4] tensor (step_counters_desc(), "
            "holding a StepCounters), got none");
  HostTensor wrong = HostTensor::zeros(desc({4}, DType::fp32));
  s = backend_->sgd_step(slots, SgdParams{0.1, 0.9}, wrong.view(), TensorView{});
  EXPECT_EQ(s.message(),
            "sgd_step: the step counters must be an fp64 [4] tensor (step_counters_desc(), "
            "holding a StepCounters), got fp32[4]");
}

}  // namespace
}  // namespace dlprobe::testing
