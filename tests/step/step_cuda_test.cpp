// The whole planned step on the CUDA backend against the same step on the reference backend: the
// same initial weights and batch must give the same loss and gradients (within the tolerance of
// different summation orders), in every precision and layout. Needs a GPU (LABELS gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dlprobe/cuda_backend.h"
#include "step_test_util.h"

namespace dlprobe::engine {
namespace {

struct CudaRig {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TrainingStep> step;
};

CudaRig make_cuda_rig(const StepConfig& c) {
  CudaRig r;
  auto source = memory::make_cuda_memory_source(0);
  EXPECT_TRUE(source.has_value()) << source.status().message();
  if (!source.has_value()) return r;
  r.allocator = memory::CachingAllocator::create(std::move(source).value()).value();
  auto backend = make_cuda_backend(0, *r.allocator);
  EXPECT_TRUE(backend.has_value()) << backend.status().message();
  if (!backend.has_value()) return r;
  r.backend = std::move(backend).value();
  auto step = TrainingStep::create(c, *r.backend, *r.allocator);
  EXPECT_TRUE(step.has_value()) << step.status().message();
  if (!step.has_value()) return r;
  r.step = std::move(step).value();
  EXPECT_TRUE(r.step->set_input(testing::images_for(c), testing::labels_for(c)).is_ok());
  return r;
}

// Largest difference relative to the largest magnitude of the reference.
double relative_error(const HostTensor& got, const HostTensor& want) {
  const HostTensor g = got.to_layout(want.layout());
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, std::abs(g.get(i) - want.get(i)));
    scale = std::max(scale, std::abs(want.get(i)));
  }
  return diff / std::max(scale, 1e-30);
}

void compare(Precision precision, Layout layout, StepMode mode, double loss_tol, double grad_tol) {
  StepConfig c = testing::tiny_config();
  c.precision = precision;
  c.layout = layout;
  c.mode = mode;
  testing::Rig ref = testing::make_rig(c);
  CudaRig gpu = make_cuda_rig(c);
  ASSERT_TRUE(ref.step && gpu.step);
  for (int i = 0; i < 2; ++i) {
    Result<StepResult> a = ref.step->run_step();
    Result<StepResult> b = gpu.step->run_step();
    ASSERT_TRUE(a.has_value() && b.has_value()) << b.status().message();
    EXPECT_NEAR(b->loss, a->loss, loss_tol) << "step " << i;
    EXPECT_EQ(b->skipped, a->skipped);
  }
  for (const char* name : {"conv1.weight", "layer2.0.downsample.0.weight", "layer4.1.bn2.weight",
                           "fc.weight", "fc.bias"}) {
    if (mode != StepMode::infer) {
      EXPECT_LE(relative_error(gpu.step->gradient(name).value(), ref.step->gradient(name).value()),
                grad_tol)
          << name;
    }
    EXPECT_LE(relative_error(gpu.step->tensor(name).value(), ref.step->tensor(name).value()),
              grad_tol)
        << name;
  }
  EXPECT_EQ(gpu.step->tensor("bn1.num_batches_tracked")->get(0),
            ref.step->tensor("bn1.num_batches_tracked")->get(0));
}

TEST(StepCudaTest, Fp32TrainNchw) {
  compare(Precision::fp32, Layout::nchw, StepMode::train, 1e-4, 5e-3);
}
TEST(StepCudaTest, Fp32TrainNhwc) {
  compare(Precision::fp32, Layout::nhwc, StepMode::train, 1e-4, 5e-3);
}
TEST(StepCudaTest, Fp32Grads) {
  compare(Precision::fp32, Layout::nhwc, StepMode::grads, 1e-4, 5e-3);
}
TEST(StepCudaTest, Fp32Infer) {
  compare(Precision::fp32, Layout::nhwc, StepMode::infer, 1e-4, 5e-3);
}
TEST(StepCudaTest, Fp16TrainNhwc) {
  compare(Precision::fp16, Layout::nhwc, StepMode::train, 2e-2, 5e-2);
}
TEST(StepCudaTest, Bf16TrainNhwc) {
  compare(Precision::bf16, Layout::nhwc, StepMode::train, 5e-2, 1e-1);
}
TEST(StepCudaTest, AdamW) {
  StepConfig c = testing::tiny_config();
  c.optimizer = OptimizerKind::adamw;
  testing::Rig ref = testing::make_rig(c);
  CudaRig gpu = make_cuda_rig(c);
  ASSERT_TRUE(ref.step && gpu.step);
  EXPECT_NEAR(gpu.step->run_step()->loss, ref.step->run_step()->loss, 1e-4);
  EXPECT_NEAR(gpu.step->run_step()->loss, ref.step->run_step()->loss, 1e-3);
}

}  // namespace
}  // namespace dlprobe::engine
