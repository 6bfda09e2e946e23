// The shape checks every backend shares: ResNet's own shapes, and one-line errors for the rest.
#include <gtest/gtest.h>

#include "dlprobe/engine/ops.h"

namespace dlprobe {
namespace {

Conv2dParams conv(std::int64_t stride, std::int64_t pad, std::int64_t dilation = 1,
                  std::int64_t groups = 1) {
  return Conv2dParams{{stride, stride}, {pad, pad}, {dilation, dilation}, groups};
}

std::string error_of(const Status& s) {
  return s.is_ok() ? "ok" : s.message();
}

TEST(ConvShape, ResNetLayers) {
  EXPECT_EQ(*conv2d_output_shape({8, 3, 224, 224}, {64, 3, 7, 7}, conv(2, 3)),
            (Shape{8, 64, 112, 112}));
  EXPECT_EQ(*conv2d_output_shape({8, 64, 56, 56}, {64, 64, 3, 3}, conv(1, 1)),
            (Shape{8, 64, 56, 56}));
  EXPECT_EQ(*conv2d_output_shape({8, 256, 56, 56}, {512, 256, 1, 1}, conv(2, 0)),
            (Shape{8, 512, 28, 28}));
  EXPECT_EQ(*conv2d_output_shape({1, 3, 225, 225}, {64, 3, 7, 7}, conv(2, 3)),
            (Shape{1, 64, 113, 113}));  // odd sizes floor, as PyTorch does
  EXPECT_EQ(*conv2d_output_shape({1, 8, 9, 9}, {4, 2, 3, 3}, conv(1, 2, 2, 4)),
            (Shape{1, 4, 9, 9}));
}

TEST(ConvShape, Errors) {
  EXPECT_EQ(error_of(conv2d_output_shape({1, 3, 2, 2}, {64, 3, 7, 7}, conv(2, 0)).status()),
            "conv2d: input 2x2 (padded 2x2) is smaller than the 7x7 kernel");
  EXPECT_EQ(error_of(conv2d_output_shape({1, 4, 8, 8}, {8, 3, 3, 3}, conv(1, 1)).status()),
            "conv2d: weight 8x3x3x3 expects 3 input channels, the input 1x4x8x8 has 4");
  EXPECT_EQ(error_of(conv2d_output_shape({1, 6, 8, 8}, {8, 3, 3, 3}, conv(1, 1, 1, 4)).status()),
            "conv2d: 6 input and 8 output channels do not split into 4 groups");
  EXPECT_EQ(error_of(conv2d_output_shape({1, 3, 8, 8}, {8, 3, 3, 3}, conv(0, 1)).status()),
            "conv2d: stride must be >= 1, got 0x0");
  EXPECT_EQ(error_of(conv2d_output_shape({3, 8, 8}, {8, 3, 3, 3}, conv(1, 1)).status()),
            "conv2d: input must have rank 4, got shape 3x8x8");
}

TEST(MaxPoolShape, StemAndErrors) {
  EXPECT_EQ(*max_pool2d_output_shape({8, 64, 112, 112}, MaxPool2dParams{}), (Shape{8, 64, 56, 56}));
  EXPECT_EQ(*max_pool2d_output_shape({1, 1, 1, 1}, MaxPool2dParams{}), (Shape{1, 1, 1, 1}));
  MaxPool2dParams wide{{3, 3}, {2, 2}, {2, 2}};
  EXPECT_EQ(error_of(max_pool2d_output_shape({1, 1, 8, 8}, wide).status()),
            "max_pool2d: padding 2x2 is more than half the 3x3 kernel");
  MaxPool2dParams big{{5, 5}, {1, 1}, {0, 0}};
  EXPECT_EQ(error_of(max_pool2d_output_shape({1, 1, 4, 4}, big).status()),
            "max_pool2d: input 4x4 (padded 4x4) is smaller than the 5x5 window");
}

TEST(OtherShapes, PoolLinearLoss) {
  EXPECT_EQ(*global_avg_pool_output_shape({8, 2048, 7, 7}), (Shape{8, 2048}));
  EXPECT_EQ(*linear_output_shape({8, 2048}, {1000, 2048}, {1000}), (Shape{8, 1000}));
  EXPECT_EQ(error_of(linear_output_shape({8, 512}, {1000, 2048}, {1000}).status()),
            "linear: weight 1000x2048 takes 2048 features, the input 8x512 has 512");
  EXPECT_EQ(error_of(linear_output_shape({8, 2048}, {1000, 2048}, {10}).status()),
            "linear: bias [10] does not match 1000 outputs");
  EXPECT_EQ(*cross_entropy_output_shape({8, 1000}, {8}), (Shape{1}));
  EXPECT_EQ(error_of(cross_entropy_output_shape({8, 1000}, {4}).status()),
            "cross_entropy: 4 labels for a batch of 8");
  EXPECT_EQ(error_of(same_shape_check("add", {1, 2, 3, 3}, {1, 2, 3, 4})),
            "add: shapes 1x2x3x3 and 1x2x3x4 differ");
}

TEST(BatchNormCheck, ChannelsAndBatchSize) {
  const BatchNormParams p;
  EXPECT_TRUE(batch_norm_check({2, 3, 1, 1}, {3}, p, true).is_ok());
  EXPECT_EQ(error_of(batch_norm_check({1, 3, 1, 1}, {3}, p, true)),
            "batch_norm: training needs more than 1 value per channel, input 1x3x1x1 has 1");
  EXPECT_TRUE(batch_norm_check({1, 3, 1, 1}, {3}, p, false).is_ok());
  EXPECT_EQ(error_of(batch_norm_check({2, 3, 4, 4}, {4}, p, true)),
            "batch_norm: per-channel tensors must be [3], got [4]");
  EXPECT_EQ(error_of(batch_norm_check({2, 3, 4, 4}, {3}, BatchNormParams{0.0, 0.1}, true)),
            "batch_norm: eps must be > 0");
}

TEST(OptimizerChecks, PyTorchRefusals) {
  EXPECT_TRUE(sgd_check(SgdParams{0.1, 0.9, 0.0, 1e-4, true}).is_ok());
  EXPECT_EQ(error_of(sgd_check(SgdParams{-0.1, 0.9, 0.0, 0.0, false})), "sgd: invalid lr -0.1");
  EXPECT_EQ(error_of(sgd_check(SgdParams{0.1, 0.0, 0.0, 0.0, true})),
            "sgd: nesterov needs momentum > 0 and dampening 0");
  EXPECT_EQ(error_of(sgd_check(SgdParams{0.1, 0.9, 0.1, 0.0, true})),
            "sgd: nesterov needs momentum > 0 and dampening 0");
  EXPECT_TRUE(adamw_check(AdamWParams{}).is_ok());
  EXPECT_EQ(error_of(adamw_check(AdamWParams{1e-3, 1.0, 0.999, 1e-8, 0.01})),
            "adamw: betas must be in [0, 1), got (1, 0.999)");
  EXPECT_EQ(error_of(adamw_check(AdamWParams{1e-3, 0.9, 0.999, -1.0, 0.01})),
            "adamw: invalid eps -1");
}

}  // namespace
}  // namespace dlprobe
