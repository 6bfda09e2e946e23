// A training step on the reference backend over host memory, for the step tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/engine/reference_backend.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::engine::testing {

#ifdef DLPROBE_SANITIZED_BUILD
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

struct Rig {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TrainingStep> step;
};

// ResNet-18 on tiny images at width 16: every layer kind and shape rule of the family, at a
// sixteenth of the work per image.
inline StepConfig tiny_config(std::int64_t image = 32, std::int64_t batch = 4,
                              std::int64_t classes = 10) {
  StepConfig c;
  c.model = {model::Arch::resnet18, image, classes, false, 16};
  c.batch = batch;
  c.seed = 1;
  return c;
}

inline HostTensor images_for(const StepConfig& c, std::uint64_t seed = 11) {
  const Shape s{c.batch, 3, c.model.image_size, c.model.image_size};
  return HostTensor::random(TensorDesc::make(s, DType::fp32).value(), seed, -1.0, 1.0);
}

inline HostTensor labels_for(const StepConfig& c) {
  HostTensor t(TensorDesc::make(Shape{c.batch}, DType::int64).value());
  for (std::int64_t i = 0; i < c.batch; ++i)
    t.set(i, static_cast<double>((i * 7 + 3) % c.model.classes));
  return t;
}

using BackendMaker = std::function<Result<std::unique_ptr<Backend>>(memory::CachingAllocator&)>;

// A planned step on the backend `make_backend` builds over an allocator of `source`, with the
// fixed batch of images_for/labels_for already set. A failure is a test failure and leaves the
// rig without its step.
inline Rig make_rig_on(const StepConfig& c, Result<std::unique_ptr<memory::MemorySource>> source,
                       const BackendMaker& make_backend) {
  Rig r;
  EXPECT_TRUE(source.has_value()) << source.status().message();
  if (!source.has_value()) return r;
  r.allocator = memory::CachingAllocator::create(std::move(source).value()).value();
  Result<std::unique_ptr<Backend>> backend = make_backend(*r.allocator);
  EXPECT_TRUE(backend.has_value()) << backend.status().message();
  if (!backend.has_value()) return r;
  r.backend = std::move(backend).value();
  Result<std::unique_ptr<TrainingStep>> step = TrainingStep::create(c, *r.backend, *r.allocator);
  EXPECT_TRUE(step.has_value()) << step.status().message();
  if (!step.has_value()) return r;
  r.step = std::move(step).value();
  const Status s = r.step->set_input(images_for(c), labels_for(c));
  EXPECT_TRUE(s.is_ok()) << s.message();
  return r;
}

// The same on the reference backend over host memory, its ops in `compute`.
inline Rig make_rig(const StepConfig& c, DType compute = DType::fp32) {
  return make_rig_on(
      c, std::unique_ptr<memory::MemorySource>(std::make_unique<memory::HostMemorySource>()),
      [compute](memory::CachingAllocator&) { return make_reference_backend(compute); });
}

inline double run(Rig& r) {
  Result<StepResult> res = r.step->run_step();
  EXPECT_TRUE(res.has_value()) << res.status().message();
  return res.has_value() ? res->loss : 0.0;
}

}  // namespace dlprobe::engine::testing
