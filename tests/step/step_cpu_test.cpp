// The whole planned step on the oneDNN CPU backend against the same step on the reference backend
// (the yardstick is in step_compare.h): the same comparison the CUDA backend gets on a GPU, here
// in CI. oneDNN sums in its own order, so this is also what shows the yardstick is fair to a
// correct fp32 backend that is not the reference.
#include <gtest/gtest.h>

#include "dlprobe/cpu_backend.h"
#include "dlprobe/memory_source.h"
#include "step_compare.h"

namespace dlprobe::engine {
namespace {

testing::Rig make_cpu_rig(const StepConfig& c) {
  testing::Rig r;
  r.allocator =
      memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
  auto backend = make_cpu_backend(*r.allocator);
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

TEST(StepCpuTest, Fp32GradientsNchw) {
  testing::compare_gradients(Precision::fp32, Layout::nchw, make_cpu_rig, "onednn");
}
TEST(StepCpuTest, Fp32GradientsNhwc) {
  testing::compare_gradients(Precision::fp32, Layout::nhwc, make_cpu_rig, "onednn");
}
TEST(StepCpuTest, Fp32TrainSgd) {
  testing::compare_training(Precision::fp32, OptimizerKind::sgd, make_cpu_rig, "onednn");
}

}  // namespace
}  // namespace dlprobe::engine
