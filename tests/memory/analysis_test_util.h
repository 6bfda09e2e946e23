// Shared set-up for the memory-analysis tests: a small ResNet step on the reference backend over
// host memory.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/engine/reference_backend.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::memory::testing {

#ifdef DLPROBE_SANITIZED_BUILD
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// ResNet-18 on 32x32 images: a real network of the family at a cost CI can run.
inline engine::StepConfig small_config(std::int64_t batch = 2,
                                       engine::MemoryPlan plan = engine::MemoryPlan::dynamic,
                                       engine::Precision precision = engine::Precision::fp32) {
  engine::StepConfig c;
  c.model = {model::Arch::resnet18, 32, 10, false, 16};  // width 16: a sixteenth of the work
  c.batch = batch;
  c.precision = precision;
  c.memory_plan = plan;
  c.seed = 3;
  return c;
}

struct Rig {
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<engine::TrainingStep> step;
};

inline Rig make_rig(const engine::StepConfig& c) {
  Rig r;
  r.allocator = CachingAllocator::create(std::make_unique<HostMemorySource>()).value();
  r.backend = make_reference_backend(DType::fp32).value();
  auto step = engine::TrainingStep::create(c, *r.backend, *r.allocator);
  EXPECT_TRUE(step.has_value()) << step.status().message();
  if (!step) return r;
  r.step = std::move(step).value();
  const Shape s{c.batch, 3, c.model.image_size, c.model.image_size};
  const HostTensor images = HostTensor::random(TensorDesc::make(s, DType::fp32).value(), 5);
  HostTensor labels(TensorDesc::make(Shape{c.batch}, DType::int64).value());
  for (std::int64_t i = 0; i < c.batch; ++i) labels.set(i, static_cast<double>(i % 10));
  const Status set = r.step->set_input(images, labels);
  EXPECT_TRUE(set.is_ok()) << set.message();
  return r;
}

}  // namespace dlprobe::memory::testing
