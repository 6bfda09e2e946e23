// The whole planned step on the oneDNN CPU backend against the same step on the reference backend
// (the yardstick is in step_compare.h): the same comparison the CUDA backend gets on a GPU, here
// in CI. oneDNN sums in its own order, so this is also what shows the yardstick is fair to a
// correct fp32 backend that is not the reference.
#include <gtest/gtest.h>

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/engine/cpu_backend.h"
#include "step_compare.h"

namespace dlprobe::engine {
namespace {

testing::Rig make_cpu_rig(const StepConfig& c) {
  return testing::make_rig_on(
      c, std::unique_ptr<memory::MemorySource>(std::make_unique<memory::HostMemorySource>()),
      [](memory::CachingAllocator& allocator) { return make_cpu_backend(allocator); });
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
