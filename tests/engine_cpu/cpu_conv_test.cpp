// Convolutions of the CPU backend against the reference backend (fp64 on the same rounded inputs):
// plain, strided, grouped, dilated and asymmetric cases, NCHW and NHWC, fp32 and (where the CPU
// runs it) bf16; and the dtype errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe {
namespace {

using testing::close;
using testing::out;
using testing::pair;
using testing::tol;

struct ConvCase {
  std::string name;
  Shape x;
  Shape w;
  Conv2dParams p;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3_pad1", {2, 8, 7, 6}, {16, 8, 3, 3}, {}},
      // ResNet's downsample: 1x1, stride 2 on an odd size, so the last row and column are unread.
      {"1x1_stride2", {2, 8, 7, 7}, {12, 8, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
      {"grouped", {2, 8, 6, 6}, {8, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 4}},
      {"depthwise_stride2", {1, 6, 8, 8}, {6, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 6}},
      {"dilated", {1, 4, 9, 9}, {6, 4, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}},
      {"asymmetric", {2, 6, 9, 8}, {4, 3, 3, 2}, {{2, 1}, {1, 0}, {1, 2}, 2}},
      {"stem_7x7", {1, 3, 16, 16}, {8, 3, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
  };
}

class CpuConv : public testing::CpuBackendTest {
 protected:
  // Runs all three passes of `c` in `dtype` and `layout` and compares each with the reference.
  void check(const ConvCase& c, DType dtype, Layout layout, std::uint64_t seed) {
    SCOPED_TRACE(c.name + " " + std::string(layout_name(layout)) + " " +
                 std::string(dtype_name(dtype)));
    const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
    auto x = pair(c.x, seed, dtype, layout);
    auto w = pair(c.w, seed + 1, dtype, layout);
    auto dy = pair(ys, seed + 2, dtype, layout);
    const double fwd_terms = static_cast<double>(c.w[1] * c.w[2] * c.w[3]);
    const double wgrad_terms = static_cast<double>(ys[0] * ys[2] * ys[3]);
    const double dgrad_terms = static_cast<double>(c.w[0] / c.p.groups * c.w[2] * c.w[3]);

    HostTensor y = out(testing::desc(ys, dtype, layout));
    Status s = backend_->conv2d_forward(x.low.view(), w.low.view(), y.view(), c.p);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(close(y, reference::conv2d_forward<double>(x.f64, w.f64, c.p).value(),
                      tol(dtype, fwd_terms)));

    HostTensor dx = out(x.low.desc());
    s = backend_->conv2d_backward_data(dy.low.view(), w.low.view(), dx.view(), c.p);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(
        close(dx, reference::conv2d_backward_data<double>(dy.f64, w.f64, x.f64.desc(), c.p).value(),
              tol(dtype, dgrad_terms)));

    HostTensor dw = out(w.low.desc());
    s = backend_->conv2d_backward_weight(x.low.view(), dy.low.view(), dw.view(), c.p);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(close(
        dw, reference::conv2d_backward_weight<double>(x.f64, dy.f64, w.f64.desc(), c.p).value(),
        tol(dtype, wgrad_terms)));
  }
};

TEST_F(CpuConv, Fp32MatchesReferenceInBothLayouts) {
  std::uint64_t seed = 100;
  for (const ConvCase& c : conv_cases()) {
    for (Layout l : {Layout::nchw, Layout::nhwc}) check(c, DType::fp32, l, seed += 10);
  }
}

TEST_F(CpuConv, RepeatedCallsReuseThePrimitiveAndGiveTheSameResult) {
  const ConvCase c = conv_cases()[0];
  auto x = pair(c.x, 1, DType::fp32, Layout::nhwc);
  auto w = pair(c.w, 2, DType::fp32, Layout::nhwc);
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
  HostTensor y1 = out(testing::desc(ys, DType::fp32, Layout::nhwc));
  HostTensor y2 = out(y1.desc());
  ASSERT_TRUE(backend_->conv2d_forward(x.low.view(), w.low.view(), y1.view(), c.p).is_ok());
  ASSERT_TRUE(backend_->conv2d_forward(x.low.view(), w.low.view(), y2.view(), c.p).is_ok());
  EXPECT_TRUE(testing::all_close(y2, y1, 0, 0));
}

TEST_F(CpuConv, ScratchGoesThroughTheAllocatorAsWorkspace) {
  // NHWC weights (KRSC) are never the blocked layout oneDNN's JIT kernels take, so forward
  // reorders them into a workspace buffer; the fixture checks every buffer came back.
  const ConvCase c = conv_cases()[0];
  auto x = pair(c.x, 3, DType::fp32, Layout::nhwc);
  auto w = pair(c.w, 4, DType::fp32, Layout::nhwc);
  HostTensor y =
      out(testing::desc(conv2d_output_shape(c.x, c.w, c.p).value(), DType::fp32, Layout::nhwc));
  ASSERT_TRUE(backend_->conv2d_forward(x.low.view(), w.low.view(), y.view(), c.p).is_ok());
  const auto stats = allocator_->stats();
  EXPECT_GT(stats[memory::Category::workspace].allocation_count, 0);
  EXPECT_EQ(stats.all.allocation_count, stats[memory::Category::workspace].allocation_count);
}

TEST_F(CpuConv, Bf16MatchesReferenceWhereSupported) {
  if (!bf16_supported()) GTEST_SKIP() << "this CPU has no AVX-512: oneDNN 2.6 runs no bf16 here";
  std::uint64_t seed = 500;
  for (const ConvCase& c : conv_cases()) {
    for (Layout l : {Layout::nchw, Layout::nhwc}) check(c, DType::bf16, l, seed += 10);
  }
}

TEST_F(CpuConv, Bf16WithoutAvx512IsAClearError) {
  if (bf16_supported()) GTEST_SKIP() << "this CPU runs bf16; the error cannot happen here";
  const ConvCase c = conv_cases()[0];
  HostTensor x = HostTensor::zeros(testing::desc(c.x, DType::bf16));
  HostTensor w = HostTensor::zeros(testing::desc(c.w, DType::bf16));
  HostTensor y(testing::desc(conv2d_output_shape(c.x, c.w, c.p).value(), DType::bf16));
  Status s = backend_->conv2d_forward(x.view(), w.view(), y.view(), c.p);
  EXPECT_EQ(s.code(), Errc::unsupported);
  EXPECT_NE(s.message().find("conv2d_forward: bf16 needs a CPU with AVX-512"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("this CPU offers avx"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST_F(CpuConv, Fp16IsRefusedWithTheReason) {
  const ConvCase c = conv_cases()[0];
  HostTensor x = HostTensor::zeros(testing::desc(c.x, DType::fp16));
  HostTensor w = HostTensor::zeros(testing::desc(c.w, DType::fp16));
  HostTensor dy(testing::desc(conv2d_output_shape(c.x, c.w, c.p).value(), DType::fp16));
  HostTensor dw(w.desc());
  Status s = backend_->conv2d_backward_weight(x.view(), dy.view(), dw.view(), c.p);
  EXPECT_EQ(s.code(), Errc::unsupported);
  EXPECT_EQ(s.message(),
            "cpu backend: conv2d_backward_weight: fp16 is not supported on CPU (oneDNN 2.6 "
            "computes fp16 only on AVX512-FP16 CPUs, and PyTorch's CPU autocast uses bf16); use "
            "fp32 or bf16");
}

TEST_F(CpuConv, MixedDtypesAreRefused) {
  const ConvCase c = conv_cases()[0];
  HostTensor x = HostTensor::zeros(testing::desc(c.x, DType::fp32));
  HostTensor w = HostTensor::zeros(testing::desc(c.w, DType::bf16));
  HostTensor y(testing::desc(conv2d_output_shape(c.x, c.w, c.p).value(), DType::fp32));
  Status s = backend_->conv2d_forward(x.view(), w.view(), y.view(), c.p);
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.message(), "cpu backend: conv2d_forward: operands mix fp32 and bf16");
}

}  // namespace
}  // namespace dlprobe
