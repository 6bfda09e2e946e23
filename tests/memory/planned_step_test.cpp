// The planned memory mode of the training step: one arena, fixed addresses, no allocator calls,
// the same numbers as the dynamic step; and the lifetimes (and which buffers hold gradients) both
// modes expose.
#include <gtest/gtest.h>

#include <cstring>

#include "analysis_test_util.h"
#include "dlprobe/memory/step_memory.h"

namespace dlprobe::memory {
namespace {

using engine::CallKind;
using engine::MemoryPlan;
using testing::make_rig;
using testing::small_config;

TEST(PlannedStep, HoldsEveryBufferInOneArenaAndCallsNoAllocator) {
  testing::Rig r = make_rig(small_config(2, MemoryPlan::planned));
  ASSERT_TRUE(r.step);
  for (const engine::Call& call : r.step->calls()) {
    EXPECT_NE(call.kind, CallKind::alloc) << call.name;
    EXPECT_NE(call.kind, CallKind::free) << call.name;
  }
  const auto arena = r.step->arena();
  ASSERT_TRUE(arena.has_value());
  EXPECT_GE(arena->bytes, arena->peak_live_bytes);
  // On a ResNet the layout comes within 2 % of the bound no layout can beat.
  EXPECT_LE(static_cast<double>(arena->bytes), 1.02 * static_cast<double>(arena->peak_live_bytes));
  ASSERT_FALSE(r.step->transients().empty());
  for (const engine::TransientBuffer& b : r.step->transients()) {
    EXPECT_LE(b.arena_offset + b.bytes, arena->bytes) << b.owner;
    EXPECT_LE(b.first_call, b.last_call);
    EXPECT_LT(b.last_call, r.step->calls().size());
  }
  EXPECT_EQ(r.allocator->stats()[Category::arena].allocated_bytes,
            static_cast<std::int64_t>(arena->bytes));

  int events = 0;
  r.allocator->set_hook([&](const AllocationEvent&) { ++events; });
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(r.step->run_step().has_value());
  r.allocator->set_hook({});
  EXPECT_EQ(events, 0);  // the reference backend asks for no workspace either
  r.step.reset();
  EXPECT_EQ(r.allocator->stats().all.allocated_bytes, 0);
}

TEST(PlannedStep, TrainsExactlyAsTheDynamicStep) {
  for (engine::Precision p : {engine::Precision::fp32, engine::Precision::fp16}) {
    testing::Rig dynamic = make_rig(small_config(2, MemoryPlan::dynamic, p));
    testing::Rig planned = make_rig(small_config(2, MemoryPlan::planned, p));
    ASSERT_TRUE(dynamic.step && planned.step);
    // Two steps carry the first step's update into the second; one in the slower sanitizer build.
    for (int i = 0; i < (testing::kSanitized ? 1 : 2); ++i) {
      auto a = dynamic.step->run_step();
      auto b = planned.step->run_step();
      ASSERT_TRUE(a.has_value() && b.has_value());
      EXPECT_EQ(a->loss, b->loss) << engine::precision_name(p) << " step " << i;
    }
    for (const char* name : {"conv1.weight", "layer2.0.bn1.weight", "fc.bias"}) {
      const HostTensor ga = dynamic.step->gradient(name).value();
      const HostTensor gb = planned.step->gradient(name).value();
      ASSERT_EQ(ga.desc().bytes(), gb.desc().bytes());
      EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.desc().bytes()), 0) << name;
    }
  }
}

TEST(PlannedStep, UsesLessReservedMemoryThanTheDynamicStep) {
  testing::Rig dynamic = make_rig(small_config(8, MemoryPlan::dynamic));
  testing::Rig planned = make_rig(small_config(8, MemoryPlan::planned));
  ASSERT_TRUE(dynamic.step && planned.step);
  ASSERT_TRUE(dynamic.step->run_step().has_value());
  ASSERT_TRUE(planned.step->run_step().has_value());
  EXPECT_LE(planned.allocator->stats().reserved_bytes_peak,
            dynamic.allocator->stats().reserved_bytes_peak);
}

TEST(PlannedStep, MarksTheGradientsTheBackwardPassCarries) {
  for (const auto& [plan, precision] : {std::pair{MemoryPlan::planned, engine::Precision::fp16},
                                        std::pair{MemoryPlan::dynamic, engine::Precision::fp32}}) {
    testing::Rig r = make_rig(small_config(2, plan, precision));
    ASSERT_TRUE(r.step);
    const std::vector<Phase> phases = call_phases(r.step->calls());
    int gradients = 0;
    for (const engine::TransientBuffer& b : r.step->transients()) {
      // Made by the backward pass exactly when first used there (an alloc entry serves the call
      // after it).
      EXPECT_EQ(b.gradient, phases[b.first_call] == Phase::backward) << b.owner;
      if (!b.gradient) continue;
      ++gradients;
      EXPECT_EQ(b.category, Category::temporaries) << b.owner;
    }
    EXPECT_GT(gradients, 0);
  }
  engine::StepConfig infer = small_config(2, MemoryPlan::planned);
  infer.mode = engine::StepMode::infer;
  testing::Rig r = make_rig(infer);
  ASSERT_TRUE(r.step);
  for (const engine::TransientBuffer& b : r.step->transients()) EXPECT_FALSE(b.gradient) << b.owner;
}

TEST(DynamicStep, TransientsNameTheirAllocAndFreeEntries) {
  testing::Rig r = make_rig(small_config());
  ASSERT_TRUE(r.step);
  EXPECT_FALSE(r.step->arena().has_value());
  const auto& calls = r.step->calls();
  std::size_t allocs = 0;
  for (const engine::Call& c : calls) allocs += c.kind == CallKind::alloc ? 1 : 0;
  EXPECT_EQ(r.step->transients().size(), allocs);
  for (const engine::TransientBuffer& b : r.step->transients()) {
    ASSERT_LT(b.first_call, b.last_call);
    EXPECT_EQ(calls[b.first_call].kind, CallKind::alloc);
    EXPECT_EQ(calls[b.last_call].kind, CallKind::free);
    EXPECT_EQ(calls[b.first_call].layer, b.owner);
    EXPECT_NE(calls[b.first_call].name.find(std::string(category_name(b.category))),
              std::string::npos);
  }
}

TEST(DynamicStep, CurrentCallPlacesEveryAllocation) {
  testing::Rig r = make_rig(small_config());
  ASSERT_TRUE(r.step);
  const auto& calls = r.step->calls();
  std::vector<std::pair<bool, std::size_t>> seen;
  r.allocator->set_hook(
      [&](const AllocationEvent& e) { seen.emplace_back(e.allocation, r.step->current_call()); });
  ASSERT_TRUE(r.step->run_step().has_value());
  r.allocator->set_hook({});
  ASSERT_FALSE(seen.empty());
  for (const auto& [allocation, call] : seen) {
    EXPECT_EQ(calls[call].kind, allocation ? CallKind::alloc : CallKind::free) << calls[call].name;
  }
}

}  // namespace
}  // namespace dlprobe::memory
