// Convolution, table-driven: each case runs forward against an independent direct loop (written
// here over an explicitly padded input), a hand-computed tiny case, the adjoint identities that
// tie the three passes together, finite-difference gradients in fp64, NCHW/NHWC invariance, and
// float-vs-double agreement.
#include <gtest/gtest.h>

#include "engine/backends/reference/reference.h"
#include "test_util.h"

namespace dlprobe {
namespace {

using testing::all_close;
using testing::desc;
using testing::rand;

struct ConvCase {
  const char* name;
  Shape x;
  Shape w;
  Conv2dParams p;
};

// Shapes chosen to reach every branch: strides that skip input, padding on both sides, dilation,
// grouped and depthwise, 1x1 and non-square kernels, batch > 1.
const ConvCase kConvCases[] = {
    {"basic3x3", {2, 3, 5, 5}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}},
    {"stride2_pad3_7x7", {1, 2, 9, 9}, {3, 2, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
    {"pointwise_stride2", {2, 4, 6, 6}, {5, 4, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
    {"dilated", {1, 2, 7, 6}, {2, 2, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}},
    {"grouped", {2, 6, 5, 5}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}},
    {"depthwise_stride2", {1, 4, 7, 7}, {4, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 4}},
    {"rect_asym", {2, 2, 6, 8}, {3, 2, 2, 3}, {{2, 1}, {0, 1}, {1, 2}, 1}},
    {"stride_gt_kernel", {1, 1, 8, 8}, {2, 1, 2, 2}, {{3, 3}, {0, 0}, {1, 1}, 1}},
};

// gtest prints a parameter in test names and failures; the case's name says it all.
void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << c.name;
}

// Direct convolution, independent of the reference's tap loop: pad the input with explicit
// zeros first, then gather each output from the padded image.
HostTensor direct_conv(const HostTensor& x, const HostTensor& w, const Conv2dParams& p) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  const std::int64_t ph = xs[2] + 2 * p.pad[0];
  const std::int64_t pw = xs[3] + 2 * p.pad[1];
  HostTensor padded = HostTensor::zeros(desc({xs[0], xs[1], ph, pw}));
  for (std::int64_t n = 0; n < xs[0]; ++n)
    for (std::int64_t c = 0; c < xs[1]; ++c)
      for (std::int64_t h = 0; h < xs[2]; ++h)
        for (std::int64_t v = 0; v < xs[3]; ++v)
          padded.at<double>(n, c, h + p.pad[0], v + p.pad[1]) = x.get(x.desc().offset(n, c, h, v));
  const std::int64_t oh = (ph - p.dilation[0] * (ws[2] - 1) - 1) / p.stride[0] + 1;
  const std::int64_t ow = (pw - p.dilation[1] * (ws[3] - 1) - 1) / p.stride[1] + 1;
  HostTensor y = HostTensor::zeros(desc({xs[0], ws[0], oh, ow}));
  const std::int64_t in_per_group = xs[1] / p.groups;
  const std::int64_t out_per_group = ws[0] / p.groups;
  for (std::int64_t n = 0; n < xs[0]; ++n)
    for (std::int64_t k = 0; k < ws[0]; ++k)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          double acc = 0;
          const std::int64_t first_c = (k / out_per_group) * in_per_group;
          for (std::int64_t c = 0; c < in_per_group; ++c)
            for (std::int64_t r = 0; r < ws[2]; ++r)
              for (std::int64_t s = 0; s < ws[3]; ++s)
                acc += padded.at<double>(n, first_c + c, i * p.stride[0] + r * p.dilation[0],
                                         j * p.stride[1] + s * p.dilation[1]) *
                       w.get(w.desc().offset(k, c, r, s));
          y.at<double>(n, k, i, j) = acc;
        }
  return y;
}

class ConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvTest, ForwardMatchesDirectLoopInBothLayouts) {
  const ConvCase& c = GetParam();
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    HostTensor x = rand(c.x, 1, DType::fp64, l);
    HostTensor w = rand(c.w, 2, DType::fp64, l);
    auto y = reference::conv2d_forward<double>(x, w, c.p);
    ASSERT_TRUE(y.has_value()) << y.status().message();
    EXPECT_EQ(y->layout(), l);
    EXPECT_TRUE(all_close(*y, direct_conv(x, w, c.p), 1e-13, 1e-13)) << layout_name(l);
  }
}

// <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>: all three are the same sum over taps,
// so a transposition mistake in either backward pass breaks an equality.
TEST_P(ConvTest, BackwardPassesAreAdjointsOfForward) {
  const ConvCase& c = GetParam();
  HostTensor x = rand(c.x, 3);
  HostTensor w = rand(c.w, 4);
  HostTensor y = reference::conv2d_forward<double>(x, w, c.p).value();
  HostTensor dy = rand(y.shape(), 5);
  HostTensor dx = reference::conv2d_backward_data<double>(dy, w, x.desc(), c.p).value();
  HostTensor dw = reference::conv2d_backward_weight<double>(x, dy, w.desc(), c.p).value();
  const double forward = testing::dot(y, dy);
  EXPECT_NEAR(testing::dot(x, dx), forward, 1e-12 * std::max(1.0, std::abs(forward)));
  EXPECT_NEAR(testing::dot(w, dw), forward, 1e-12 * std::max(1.0, std::abs(forward)));
}

TEST_P(ConvTest, GradientsMatchFiniteDifferences) {
  const ConvCase& c = GetParam();
  HostTensor x = rand(c.x, 6);
  HostTensor w = rand(c.w, 7);
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
  const HostTensor dy = rand(ys, 8);
  auto loss = [&] {
    return testing::dot(reference::conv2d_forward<double>(x, w, c.p).value(), dy);
  };
  HostTensor dx = reference::conv2d_backward_data<double>(dy, w, x.desc(), c.p).value();
  HostTensor dw = reference::conv2d_backward_weight<double>(x, dy, w.desc(), c.p).value();
  EXPECT_TRUE(
      all_close(dx, testing::numeric_gradient(x, loss), testing::kGradRtol, testing::kGradAtol));
  EXPECT_TRUE(
      all_close(dw, testing::numeric_gradient(w, loss), testing::kGradRtol, testing::kGradAtol));
}

TEST_P(ConvTest, BackwardIsLayoutInvariant) {
  const ConvCase& c = GetParam();
  HostTensor x = rand(c.x, 9);
  HostTensor w = rand(c.w, 10);
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
  HostTensor dy = rand(ys, 11);
  HostTensor dx = reference::conv2d_backward_data<double>(dy, w, x.desc(), c.p).value();
  HostTensor dw = reference::conv2d_backward_weight<double>(x, dy, w.desc(), c.p).value();
  const HostTensor xn = x.to_layout(Layout::nhwc);
  const HostTensor wn = w.to_layout(Layout::nhwc);
  const HostTensor dyn = dy.to_layout(Layout::nhwc);
  HostTensor dxn = reference::conv2d_backward_data<double>(dyn, wn, xn.desc(), c.p).value();
  HostTensor dwn = reference::conv2d_backward_weight<double>(xn, dyn, wn.desc(), c.p).value();
  EXPECT_EQ(dxn.layout(), Layout::nhwc);
  // The same terms summed in the same order: the results agree exactly.
  EXPECT_TRUE(all_close(dxn, dx, 0, 0));
  EXPECT_TRUE(all_close(dwn, dw, 0, 0));
}

// The reference backend runs ungrouped, undilated convolutions in a loop of its own, so the backend
// op test reaches this float instantiation only for the other cases.
TEST_P(ConvTest, FloatAgreesWithDouble) {
  const ConvCase& c = GetParam();
  HostTensor x = rand(c.x, 12);
  HostTensor w = rand(c.w, 13);
  HostTensor xf = x.to_dtype(DType::fp32).value();
  HostTensor wf = w.to_dtype(DType::fp32).value();
  // Compare against double run on the same (float-rounded) inputs, so only arithmetic differs.
  HostTensor xd = xf.to_dtype(DType::fp64).value();
  HostTensor wd = wf.to_dtype(DType::fp64).value();
  HostTensor y = reference::conv2d_forward<double>(xd, wd, c.p).value();
  HostTensor yf = reference::conv2d_forward<float>(xf, wf, c.p).value();
  EXPECT_EQ(yf.dtype(), DType::fp32);
  EXPECT_TRUE(all_close(yf, y, 1e-5, 1e-5));
  HostTensor dy = rand(y.shape(), 14).to_dtype(DType::fp32).value();
  HostTensor dyd = dy.to_dtype(DType::fp64).value();
  EXPECT_TRUE(all_close(reference::conv2d_backward_data<float>(dy, wf, xf.desc(), c.p).value(),
                        reference::conv2d_backward_data<double>(dyd, wd, xd.desc(), c.p).value(),
                        1e-5, 1e-5));
  EXPECT_TRUE(all_close(reference::conv2d_backward_weight<float>(xf, dy, wf.desc(), c.p).value(),
                        reference::conv2d_backward_weight<double>(xd, dyd, wd.desc(), c.p).value(),
                        1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Cases, ConvTest, ::testing::ValuesIn(kConvCases),
                         [](const auto& tp) { return std::string(tp.param.name); });

// Worked by hand: x = [[1,2,3],[4,5,6],[7,8,9]], w = [[1,0],[0,-1]], stride 1, no padding:
// y[i][j] = x[i][j] - x[i+1][j+1] = -4 everywhere. With pad 1, the corners see one element each.
TEST(Conv, HandComputedCase) {
  HostTensor x(desc({1, 1, 3, 3}));
  for (int i = 0; i < 9; ++i) x.set(i, i + 1);
  HostTensor w(desc({1, 1, 2, 2}));
  for (int i = 0; i < 4; ++i)
    w.set(i, std::array{1.0, 0.0, 0.0, -1.0}[static_cast<std::size_t>(i)]);
  HostTensor y = reference::conv2d_forward<double>(x, w, {}).value();
  ASSERT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  for (double v : y.values<double>()) EXPECT_EQ(v, -4.0);
  Conv2dParams pad1;
  pad1.pad = {1, 1};
  HostTensor yp = reference::conv2d_forward<double>(x, w, pad1).value();
  ASSERT_EQ(yp.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(yp.at<double>(0, 0, 0, 0), -1.0);  // only w[1][1] * x[0][0]
  EXPECT_EQ(yp.at<double>(0, 0, 3, 3), 9.0);   // only w[0][0] * x[2][2]
  EXPECT_EQ(yp.at<double>(0, 0, 1, 1), -4.0);
  EXPECT_EQ(yp.at<double>(0, 0, 0, 3), -0.0);  // w[1][0] * x[0][2] = 0
  // dgrad of an all-ones dy (no padding): each x collects the weights that touch it.
  HostTensor ones = HostTensor::zeros(desc({1, 1, 2, 2}));
  ones.fill(1.0);
  HostTensor dx = reference::conv2d_backward_data<double>(ones, w, x.desc(), {}).value();
  const double want[9] = {1, 1, 0, 1, 0, -1, 0, -1, -1};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(dx.get(i), want[i]) << i;
  // wgrad of the same: w[r][s] collects the sum of the 2x2 block of x it touches.
  HostTensor dw = reference::conv2d_backward_weight<double>(x, ones, w.desc(), {}).value();
  EXPECT_EQ(dw.get(0), 1 + 2 + 4 + 5);
  EXPECT_EQ(dw.get(3), 5 + 6 + 8 + 9);
}

TEST(Conv, RefusesWrongDTypeAndShape) {
  HostTensor x = rand({1, 2, 4, 4}, 1, DType::fp32);
  HostTensor w = rand({3, 2, 3, 3}, 2, DType::fp64);
  auto r = reference::conv2d_forward<double>(x, w, {});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(), "conv2d_forward: x is fp32 but the compute type is fp64");
  HostTensor dy = rand({1, 3, 3, 3}, 3);
  auto d = reference::conv2d_backward_data<double>(dy, w, desc({1, 2, 4, 4}), {});
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.status().message(), "conv2d_backward_data: shapes 1x3x3x3 and 1x3x2x2 differ");
}

}  // namespace
}  // namespace dlprobe
