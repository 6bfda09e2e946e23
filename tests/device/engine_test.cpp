// The openers and Engine on the CPU: which backend each kind opens, the compute types, and the
// refusals that come before any memory is taken.
#include <gtest/gtest.h>

#include "dlprobe/device/engine.h"
#include "dlprobe/device/open_backend.h"

namespace dlprobe::device {
namespace {

const Device kCpu{DeviceKind::cpu, 0};

TEST(OpenMemorySource, HostMemoryOnTheCpu) {
  auto source = open_memory_source(kCpu);
  ASSERT_TRUE(source.has_value()) << source.status().message();
  EXPECT_EQ((*source)->name(), "host");
}

TEST(OpenBackend, EachCpuKindOverTheCallersAllocator) {
  auto allocator = memory::CachingAllocator::create(open_memory_source(kCpu).value());
  ASSERT_TRUE(allocator.has_value());
  auto reference = open_backend(kCpu, BackendKind::reference, **allocator);
  ASSERT_TRUE(reference.has_value()) << reference.status().message();
  EXPECT_EQ((*reference)->device(), DeviceKind::cpu);
  auto onednn = open_backend(kCpu, BackendKind::onednn, **allocator);
  EXPECT_EQ(onednn.has_value(), backend_built(BackendKind::onednn)) << onednn.status().message();
  if (onednn.has_value()) {
    EXPECT_NE((*onednn)->name(), (*reference)->name());
  } else {
    EXPECT_EQ(onednn.status().code(), Errc::unavailable);
  }
  // A backend on a device it does not run on, and compute types, are refused.
  EXPECT_EQ(open_backend(kCpu, BackendKind::cuda, **allocator).status().code(),
            Errc::invalid_argument);
  EXPECT_EQ(open_backend(kCpu, BackendKind::onednn, **allocator, {}, DType::fp64).status().code(),
            Errc::invalid_argument);
  EXPECT_EQ(
      open_backend(kCpu, BackendKind::reference, **allocator, {}, DType::fp16).status().code(),
      Errc::invalid_argument);
  EXPECT_TRUE(open_backend(kCpu, BackendKind::reference, **allocator, {}, DType::fp64).has_value());
}

TEST(Engine, SupportsFollowsTheBackendAndTheComputeType) {
  using engine::Precision;
  auto e = Engine::open(kCpu, BackendKind::reference);
  ASSERT_TRUE(e.has_value()) << e.status().message();
  EXPECT_EQ((*e)->kind(), BackendKind::reference);
  EXPECT_EQ((*e)->device().kind, DeviceKind::cpu);
  EXPECT_TRUE((*e)->supports(Precision::fp32).is_ok());
  EXPECT_TRUE((*e)->supports(Precision::fp16).is_ok());
  EXPECT_FALSE((*e)->supports(Precision::fp64).is_ok());  // an fp32 engine
  EXPECT_EQ((*e)->supports(Precision::tf32).code(), Errc::unsupported);
  auto e64 = Engine::open(kCpu, BackendKind::reference, {}, DType::fp64);
  ASSERT_TRUE(e64.has_value());
  EXPECT_TRUE((*e64)->supports(Precision::fp64).is_ok());
  EXPECT_FALSE((*e64)->supports(Precision::fp32).is_ok());
  if (backend_built(BackendKind::onednn)) {
    auto onednn = Engine::open(kCpu, BackendKind::onednn);
    ASSERT_TRUE(onednn.has_value()) << onednn.status().message();
    EXPECT_EQ((*onednn)->supports(Precision::fp16).code(), Errc::unsupported);
    EXPECT_TRUE((*onednn)->supports(Precision::fp32).is_ok());
  }
}

TEST(Engine, RefusesBeforeTakingMemory) {
  EXPECT_EQ(Engine::open(kCpu, BackendKind::cuda).status().code(), Errc::invalid_argument);
  EXPECT_EQ(Engine::open({DeviceKind::cuda, 0}, BackendKind::reference).status().code(),
            Errc::invalid_argument);
  EXPECT_EQ(Engine::open(kCpu, BackendKind::onednn, {}, DType::fp64).status().code(),
            Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe::device
