// Following a step: the peak agrees with the allocator's own, the timeline covers the step, the
// planned arena is split by the plan, and phases are where they belong.
#include <gtest/gtest.h>

#include <algorithm>

#include "analysis_test_util.h"
#include "dlprobe/memory/step_memory.h"

namespace dlprobe::memory {
namespace {

using engine::MemoryPlan;
using testing::make_rig;
using testing::small_config;

void expect_timeline_covers(const StepMemory& m, std::size_t calls) {
  ASSERT_FALSE(m.timeline.empty());
  std::size_t next = 0;
  bool peak_seen = false;
  for (const LayerVisit& v : m.timeline) {
    EXPECT_EQ(v.first_call, next);
    EXPECT_LE(v.first_call, v.last_call);
    EXPECT_LE(v.high.allocated_bytes, m.peak.allocated_bytes) << v.layer;
    next = v.last_call + 1;
    if (v.first_call <= m.peak_call && m.peak_call <= v.last_call) {
      peak_seen = true;
      EXPECT_EQ(v.high.allocated_bytes, m.peak.allocated_bytes);
      EXPECT_EQ(v.layer, m.peak_layer);
      EXPECT_EQ(v.phase, m.peak_phase);
    }
  }
  EXPECT_EQ(next, calls);
  EXPECT_TRUE(peak_seen);
  EXPECT_EQ(m.timeline.front().phase, Phase::forward);
}

TEST(FollowStep, ThePeakIsTheAllocatorsOwn) {
  testing::Rig r = make_rig(small_config(4));
  ASSERT_TRUE(r.step);
  ASSERT_TRUE(r.step->run_step().has_value());  // warm the cache
  Result<StepMemory> m = follow_step(*r.step, *r.allocator);
  ASSERT_TRUE(m.has_value()) << m.status().message();
  const MemoryStats s = r.allocator->stats();
  EXPECT_EQ(m->peak.allocated_bytes, s.peak.allocated_bytes);
  EXPECT_EQ(m->peak.allocated_bytes, s.all.allocated_bytes_peak);
  for (Category c : kAllCategories) {
    EXPECT_EQ(m->peak[c], s.peak.allocated_by_category[static_cast<std::size_t>(c)])
        << category_name(c);
  }
  EXPECT_EQ(m->reserved_peak_bytes, s.reserved_bytes_peak);
  EXPECT_GE(m->peak.waste_bytes(), 0);
  EXPECT_GE(m->peak.fragmentation(), 0.0);
  EXPECT_LE(m->peak.fragmentation(), 1.0);
  // The allocation that set the peak is the entry the follower places it at.
  const engine::Call& at = r.step->calls()[m->peak_call];
  EXPECT_EQ(at.kind, engine::CallKind::alloc);
  EXPECT_EQ(at.layer, s.peak.owner);
  EXPECT_EQ(m->peak_call_name, at.name);
  // A ResNet peaks when backward starts: every saved activation is still held.
  EXPECT_EQ(m->peak_phase, Phase::backward);
  EXPECT_GT(m->events, 0);
  EXPECT_FALSE(m->arena.has_value());
  expect_timeline_covers(*m, r.step->calls().size());
  EXPECT_EQ(m->timeline.back().phase, Phase::update);
}

TEST(FollowStep, SplitsThePlannedArenaByThePlan) {
  testing::Rig r = make_rig(small_config(4, MemoryPlan::planned));
  ASSERT_TRUE(r.step);
  Result<StepMemory> m = follow_step(*r.step, *r.allocator);
  ASSERT_TRUE(m.has_value()) << m.status().message();
  ASSERT_TRUE(m->arena.has_value());
  EXPECT_EQ(m->events, 0);
  // The arena's block, with any remainder the allocator did not split off.
  const std::int64_t arena = r.allocator->stats()[Category::arena].allocated_bytes;
  EXPECT_GE(arena, static_cast<std::int64_t>(m->arena->bytes));
  // Outside the arena only the loss is a temporary (a long-lived one).
  const std::int64_t loss = r.allocator->stats()[Category::temporaries].allocated_bytes;
  EXPECT_EQ(r.allocator->stats()[Category::activations].allocated_bytes, 0);
  // The most the arena holds at one call is the plan's own bound.
  EXPECT_EQ(m->peak[Category::activations] + m->peak[Category::temporaries] - loss,
            static_cast<std::int64_t>(m->arena->peak_live_bytes));
  for (const LayerVisit& v : m->timeline) {
    EXPECT_EQ(v.high[Category::activations] + v.high[Category::temporaries] - loss +
                  v.high[Category::arena],
              arena)
        << v.layer;
    EXPECT_GE(v.high[Category::arena], 0) << v.layer;
  }
  EXPECT_EQ(m->peak.allocated_bytes, r.allocator->stats().all.allocated_bytes);
  expect_timeline_covers(*m, r.step->calls().size());
}

TEST(CallPhases, FollowTheStepMode) {
  for (engine::StepMode mode :
       {engine::StepMode::train, engine::StepMode::grads, engine::StepMode::infer}) {
    engine::StepConfig c = small_config();
    c.mode = mode;
    testing::Rig r = make_rig(c);
    ASSERT_TRUE(r.step);
    const auto& calls = r.step->calls();
    const std::vector<Phase> phases = call_phases(calls);
    ASSERT_EQ(phases.size(), calls.size());
    EXPECT_TRUE(std::is_sorted(phases.begin(), phases.end()));
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].kind == engine::CallKind::conv_backward_data) {
        EXPECT_EQ(phases[i], Phase::backward);
      }
      if (calls[i].kind == engine::CallKind::conv_forward) {
        EXPECT_EQ(phases[i], Phase::forward);
      }
      if (calls[i].kind == engine::CallKind::sgd_step) {
        EXPECT_EQ(phases[i], Phase::update);
      }
      if (calls[i].name == "loss.backward") {
        EXPECT_EQ(phases[i], Phase::backward);
      }
      // The loss gradient's buffer is allocated for the backward pass.
      if (i + 1 < calls.size() && calls[i + 1].name == "loss.backward" &&
          calls[i].kind == engine::CallKind::alloc) {
        EXPECT_EQ(phases[i], Phase::backward);
      }
    }
    const bool has_update = std::find(phases.begin(), phases.end(), Phase::update) != phases.end();
    const bool has_backward =
        std::find(phases.begin(), phases.end(), Phase::backward) != phases.end();
    EXPECT_EQ(has_update, mode == engine::StepMode::train);
    EXPECT_EQ(has_backward, mode != engine::StepMode::infer);
  }
}

}  // namespace
}  // namespace dlprobe::memory
