// End-to-end training on the reference backend: the loss at initialisation, overfitting one batch,
// what each mode changes, and the fp16 loss scaler.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "step_test_util.h"

namespace dlprobe::engine {
namespace {

using testing::make_rig;
using testing::run;
using testing::tiny_config;

// torchvision's initialisation at its width: each logit starts near zero, so the loss near
// ln(classes) (the narrow test models start further from it).
TEST(StepTrainTest, LossAtInitialisationIsNearLnClasses) {
  StepConfig c = tiny_config();
  c.model.width = 64;
  c.mode = StepMode::grads;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const double loss = run(r);
  EXPECT_NEAR(loss, std::log(10.0), 0.3);
}

TEST(StepTrainTest, OverfitsOneBatch) {
  StepConfig c = tiny_config();
  // At lr 0.05 the loss of these four images swings between 0.002 and 4.6 from step to step
  // (momentum 0.9 on a batch of 4), so where it stands after N steps is luck; at 0.02 it falls
  // steadily (2.44, 0.99, 0.48, 0.07, 0.001, ...).
  c.sgd.lr = 0.02;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  // Four memorised images reach a loss near 0 in well under 10 steps; the sanitizer build, several
  // times slower, stops there.
  constexpr int kSteps = testing::kSanitized ? 8 : 15;
  const auto start = std::chrono::steady_clock::now();
  const double first = run(r);
  double loss = first;
  for (int i = 1; i < kSteps; ++i) loss = run(r);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("overfit: loss %.4f -> %.4f in %d steps, %.2f s/step\n", first, loss, kSteps,
              seconds / kSteps);
  EXPECT_EQ(r.step->optimizer_steps(), kSteps);
  EXPECT_LT(loss, 0.02);
}

TEST(StepTrainTest, AdamWTrainsToo) {
  StepConfig c = tiny_config();
  c.optimizer = OptimizerKind::adamw;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const double first = run(r);
  double loss = first;
  for (int i = 0; i < 4; ++i) loss = run(r);
  EXPECT_LT(loss, first / 2);
}

TEST(StepTrainTest, GradsModeLeavesWeightsAloneTrainChangesThem) {
  StepConfig c = tiny_config();
  c.mode = StepMode::grads;
  testing::Rig g = make_rig(c);
  c.mode = StepMode::train;
  testing::Rig t = make_rig(c);
  ASSERT_TRUE(g.step && t.step);
  const HostTensor w0 = g.step->tensor("layer1.0.conv1.weight").value();
  const HostTensor rm0 = g.step->tensor("layer1.0.bn1.running_mean").value();
  run(g);
  run(t);
  const HostTensor wg = g.step->tensor("layer1.0.conv1.weight").value();
  const HostTensor wt = t.step->tensor("layer1.0.conv1.weight").value();
  double changed_g = 0, changed_t = 0;
  for (std::int64_t i = 0; i < w0.numel(); ++i) {
    changed_g = std::max(changed_g, std::abs(wg.get(i) - w0.get(i)));
    changed_t = std::max(changed_t, std::abs(wt.get(i) - w0.get(i)));
  }
  EXPECT_EQ(changed_g, 0.0);
  EXPECT_GT(changed_t, 0.0);
  // Both ran BN in training mode: running statistics and the counter moved in both.
  const HostTensor rm = g.step->tensor("layer1.0.bn1.running_mean").value();
  double moved = 0;
  for (std::int64_t i = 0; i < rm.numel(); ++i) moved += std::abs(rm.get(i) - rm0.get(i));
  EXPECT_GT(moved, 0.0);
  EXPECT_EQ(g.step->tensor("bn1.num_batches_tracked")->get(0), 1.0);
  EXPECT_EQ(t.step->tensor("layer4.1.bn2.num_batches_tracked")->get(0), 1.0);
  EXPECT_EQ(g.step->optimizer_steps(), 0);
  EXPECT_EQ(t.step->optimizer_steps(), 1);
  // The gradient SGD used: w1 = w0 - lr * (g + wd * w0) on the first step (momentum buffer = d).
  const HostTensor grad = g.step->gradient("layer1.0.conv1.weight").value();
  for (std::int64_t i = 0; i < 50; ++i) {
    const double want = w0.get(i) - c.sgd.lr * (grad.get(i) + c.sgd.weight_decay * w0.get(i));
    ASSERT_NEAR(wt.get(i), want, 1e-6) << i;
  }
}

TEST(StepTrainTest, InferModeUsesRunningStatistics) {
  StepConfig c = tiny_config();
  c.mode = StepMode::infer;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const HostTensor rv0 = r.step->tensor("bn1.running_var").value();
  const double a = run(r);
  EXPECT_EQ(run(r), a);  // nothing changes between inference steps
  EXPECT_EQ(r.step->tensor("bn1.num_batches_tracked")->get(0), 0.0);
  EXPECT_EQ(r.step->tensor("bn1.running_var")->get(3), rv0.get(3));
  EXPECT_FALSE(r.step->gradient("fc.weight").has_value());
  // Scaling every running variance of the stem's BN changes what inference computes.
  HostTensor rv = rv0;
  for (std::int64_t i = 0; i < rv.numel(); ++i) rv.set(i, 4.0);
  ASSERT_TRUE(r.step->set_tensor("bn1.running_var", rv).is_ok());
  EXPECT_GT(std::abs(run(r) - a), 1e-4);

  // Training-mode BN ignores running statistics: the same change leaves the loss as it was.
  c.mode = StepMode::grads;
  testing::Rig g1 = make_rig(c);
  testing::Rig g2 = make_rig(c);
  ASSERT_TRUE(g2.step->set_tensor("bn1.running_var", rv).is_ok());
  EXPECT_EQ(run(g1), run(g2));
}

TEST(StepTrainTest, Fp16SkipsTheStepAndBacksOffOnOverflow) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp16;
  // The fp32 loss gradient times 1e30 overflows fp16 when cast down: every gradient is inf/NaN.
  c.scaler.init_scale = 1e30;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const HostTensor w0 = r.step->tensor("fc.weight").value();
  Result<StepResult> res = r.step->run_step();
  ASSERT_TRUE(res.has_value()) << res.status().message();
  EXPECT_TRUE(res->skipped);
  EXPECT_EQ(res->loss_scale, 1e30);
  EXPECT_EQ(r.step->loss_scale(), 0.5e30);
  EXPECT_EQ(r.step->optimizer_steps(), 0);
  const HostTensor w1 = r.step->tensor("fc.weight").value();
  for (std::int64_t i = 0; i < w0.numel(); ++i) ASSERT_EQ(w1.get(i), w0.get(i));
}

TEST(StepTrainTest, Fp16GrowsTheScaleAfterCleanStepsAndSkipsOnInfInput) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp16;
  c.scaler.init_scale = 1024;
  c.scaler.growth_interval = 2;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  Result<StepResult> a = r.step->run_step();
  ASSERT_TRUE(a.has_value()) << a.status().message();
  EXPECT_FALSE(a->skipped);
  // A loss of the right size (LossAtInitialisationIsNearLnClasses checks it closely at full width).
  EXPECT_NEAR(a->loss, std::log(10.0), 0.6);
  EXPECT_EQ(r.step->loss_scale(), 1024);
  Result<StepResult> b = r.step->run_step();
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->skipped);
  EXPECT_EQ(r.step->loss_scale(), 2048);  // two clean steps in a row
  EXPECT_EQ(r.step->optimizer_steps(), 2);

  HostTensor images = testing::images_for(c);
  images.set(5, std::numeric_limits<double>::infinity());
  ASSERT_TRUE(r.step->set_input(images, testing::labels_for(c)).is_ok());
  const HostTensor w0 = r.step->tensor("layer2.0.conv1.weight").value();
  Result<StepResult> d = r.step->run_step();
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->skipped);
  EXPECT_EQ(r.step->loss_scale(), 1024);
  EXPECT_EQ(r.step->optimizer_steps(), 2);
  const HostTensor w1 = r.step->tensor("layer2.0.conv1.weight").value();
  for (std::int64_t i = 0; i < w0.numel(); ++i) ASSERT_EQ(w1.get(i), w0.get(i));
}

TEST(StepTrainTest, MixedPrecisionLossesTrackFp32) {
  StepConfig c = tiny_config();
  c.mode = StepMode::grads;
  testing::Rig f32 = make_rig(c);
  c.precision = Precision::fp16;
  testing::Rig f16 = make_rig(c);
  c.precision = Precision::bf16;
  testing::Rig b16 = make_rig(c);
  const double l32 = run(f32);
  EXPECT_NEAR(run(f16), l32, 0.02);
  EXPECT_NEAR(run(b16), l32, 0.1);
  // bf16 has no loss scaling.
  EXPECT_EQ(b16.step->loss_scale(), 1.0);
}

TEST(StepTrainTest, NhwcAndNchwGiveTheSameLossAndGradients) {
  StepConfig c = tiny_config();
  c.mode = StepMode::grads;
  testing::Rig a = make_rig(c);
  c.layout = Layout::nhwc;
  testing::Rig b = make_rig(c);
  ASSERT_TRUE(a.step && b.step);
  EXPECT_NEAR(run(a), run(b), 1e-5);
  for (const char* name : {"conv1.weight", "layer3.0.downsample.0.weight", "fc.weight"}) {
    const HostTensor ga = a.step->gradient(name).value();
    const HostTensor gb = b.step->gradient(name).value().to_layout(Layout::nchw);
    ASSERT_EQ(ga.layout(), Layout::nchw);
    double scale = 0, diff = 0;
    for (std::int64_t i = 0; i < ga.numel(); ++i) {
      scale = std::max(scale, std::abs(ga.get(i)));
      diff = std::max(diff, std::abs(ga.get(i) - gb.get(i)));
    }
    EXPECT_LE(diff, 1e-4 * scale) << name;
  }
}

// run_steps over three batches for four steps is set_input of batch 0, 1, 2, 0 with run_step
// after each, bit for bit: losses, the updated weights and the running statistics.
TEST(StepTrainTest, RunStepsCyclesThroughTheBatchesAsSingleSteps) {
  const StepConfig c = tiny_config();
  constexpr std::int64_t kBatches = 3;
  constexpr std::int64_t kSteps = 4;
  const HostTensor images = HostTensor::random(
      TensorDesc::make(Shape{kBatches * c.batch, 3, c.model.image_size, c.model.image_size},
                       DType::fp32)
          .value(),
      5);
  HostTensor labels(TensorDesc::make(Shape{kBatches * c.batch}, DType::int64).value());
  for (std::int64_t i = 0; i < labels.numel(); ++i)
    labels.set(i, static_cast<double>((i * 3 + 1) % c.model.classes));

  testing::Rig many = make_rig(c);
  testing::Rig single = make_rig(c);
  ASSERT_TRUE(many.step && single.step);
  const Result<std::vector<StepResult>> losses = many.step->run_steps(images, labels, kSteps);
  ASSERT_TRUE(losses.has_value()) << losses.status().message();
  ASSERT_EQ(losses->size(), static_cast<std::size_t>(kSteps));

  const std::int64_t per_image = 3 * c.model.image_size * c.model.image_size;
  for (std::int64_t i = 0; i < kSteps; ++i) {
    const std::int64_t first = (i % kBatches) * c.batch;
    HostTensor im(
        TensorDesc::make(Shape{c.batch, 3, c.model.image_size, c.model.image_size}, DType::fp32)
            .value());
    HostTensor lb(TensorDesc::make(Shape{c.batch}, DType::int64).value());
    for (std::int64_t j = 0; j < im.numel(); ++j) im.set(j, images.get(first * per_image + j));
    for (std::int64_t j = 0; j < c.batch; ++j) lb.set(j, labels.get(first + j));
    ASSERT_TRUE(single.step->set_input(im, lb).is_ok());
    EXPECT_EQ((*losses)[static_cast<std::size_t>(i)].loss, run(single)) << "step " << i;
  }
  for (const char* name :
       {"conv1.weight", "layer4.1.bn2.weight", "fc.bias", "layer2.0.bn1.running_var"}) {
    const HostTensor a = many.step->tensor(name).value();
    const HostTensor b = single.step->tensor(name).value();
    for (std::int64_t j = 0; j < a.numel(); ++j) ASSERT_EQ(a.get(j), b.get(j)) << name << " " << j;
  }
  EXPECT_EQ(many.step->optimizer_steps(), kSteps);
}

TEST(StepTrainTest, RunStepsRefusesAPartialBatch) {
  const StepConfig c = tiny_config();
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const HostTensor images = HostTensor::random(
      TensorDesc::make(Shape{c.batch + 1, 3, c.model.image_size, c.model.image_size}, DType::fp32)
          .value(),
      5);
  HostTensor labels = HostTensor::zeros(TensorDesc::make(Shape{c.batch + 1}, DType::int64).value());
  const Result<std::vector<StepResult>> out = r.step->run_steps(images, labels, 2);
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.status().message().find("not a whole number of batches"), std::string::npos)
      << out.status().message();
}

}  // namespace
}  // namespace dlprobe::engine
