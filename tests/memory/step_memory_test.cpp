// Following a step: the peak agrees with the allocator's own, the timeline covers the step, the
// planned arena is split by the plan (at the peak and at its fullest), and phases are where they
// belong.
#include <gtest/gtest.h>

#include <algorithm>

#include "analysis_test_util.h"
#include "dlprobe/memory/prediction.h"
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

// What the plan says the arena holds during call `i`, worked out from its buffers' intervals and
// offsets over a map of the arena's 512-byte units (the planner's alignment).
struct PlannedContents {
  CategoryBytes live{};
  std::int64_t gradient_bytes = 0;
  std::int64_t free_bytes = 0;
  std::int64_t largest_free_bytes = 0;
};

PlannedContents planned_contents(const std::vector<engine::TransientBuffer>& transients,
                                 std::size_t i, std::int64_t block) {
  const auto unit = static_cast<std::int64_t>(kBlockRound);
  std::vector<bool> used(static_cast<std::size_t>(block / unit), false);
  PlannedContents p;
  for (const engine::TransientBuffer& b : transients) {
    if (i < b.first_call || i > b.last_call) continue;
    const auto units = (static_cast<std::int64_t>(b.bytes) + unit - 1) / unit;
    p.live[static_cast<std::size_t>(b.category)] += units * unit;
    if (b.gradient) p.gradient_bytes += units * unit;
    const auto first = static_cast<std::size_t>(static_cast<std::int64_t>(b.arena_offset) / unit);
    for (std::size_t u = first; u < first + static_cast<std::size_t>(units); ++u) used.at(u) = true;
  }
  std::int64_t run = 0;
  for (const bool u : used) {
    run = u ? 0 : run + unit;
    if (!u) p.free_bytes += unit;
    p.largest_free_bytes = std::max(p.largest_free_bytes, run);
  }
  return p;
}

std::int64_t sum(const CategoryBytes& bytes) {
  std::int64_t total = 0;
  for (const std::int64_t b : bytes) total += b;
  return total;
}

// The arena's parts add up to its block, and the block with what lies outside it to the peak.
void expect_arena_adds_up(const StepMemory& m, const ArenaMoment& a, std::int64_t block) {
  EXPECT_EQ(sum(a.live) + a.free_bytes, block) << a.call_name;
  EXPECT_EQ(a.block_bytes(), block) << a.call_name;
  EXPECT_GE(a.free_bytes, a.largest_free_bytes) << a.call_name;
  const ArenaMoment& at = *m.arena_at_peak;
  std::int64_t outside = 0;
  for (Category c : kAllCategories) {
    if (c != Category::arena) outside += m.peak[c] - at[c];
  }
  EXPECT_EQ(outside + sum(at.live) + at.free_bytes, m.peak.allocated_bytes);
}

TEST(FollowStep, TellsWhatThePlannedArenaHoldsAtThePeakAndAtItsFullest) {
  testing::Rig r = make_rig(small_config(4, MemoryPlan::planned));
  ASSERT_TRUE(r.step);
  Result<StepMemory> m = follow_step(*r.step, *r.allocator);
  ASSERT_TRUE(m.has_value()) << m.status().message();
  ASSERT_TRUE(m->arena_at_peak.has_value());
  ASSERT_TRUE(m->arena_fullest.has_value());
  const ArenaMoment& at = *m->arena_at_peak;
  const std::int64_t block = r.allocator->stats()[Category::arena].allocated_bytes;
  EXPECT_EQ(at.call, m->peak_call);
  EXPECT_EQ(at.call_name, m->peak_call_name);
  EXPECT_EQ(at.allocated_bytes, m->peak.allocated_bytes);
  expect_arena_adds_up(*m, at, block);

  // The plan's own intervals at the peak's call.
  const std::vector<engine::TransientBuffer>& transients = r.step->transients();
  const PlannedContents want = planned_contents(transients, m->peak_call, block);
  for (Category c : kAllCategories) EXPECT_EQ(at[c], want.live[static_cast<std::size_t>(c)]);
  EXPECT_EQ(at.gradient_bytes, want.gradient_bytes);
  EXPECT_EQ(at.free_bytes, want.free_bytes);
  EXPECT_EQ(at.largest_free_bytes, want.largest_free_bytes);
  // A ResNet peaks as backward starts: activations kept for it, and the first gradients.
  EXPECT_GT(at[Category::activations], 0);
  EXPECT_GT(at.gradient_bytes, 0);
  EXPECT_LE(at.gradient_bytes, at[Category::temporaries]);
  EXPECT_EQ(at[Category::weights] + at[Category::gradients] + at[Category::workspace], 0);

  // Its fullest is the plan's bound, at the first call that reaches it; with no workspace on the
  // reference backend nothing outside the arena moves, so that is the peak's call.
  const ArenaMoment& full = *m->arena_fullest;
  EXPECT_EQ(full.live_bytes(), static_cast<std::int64_t>(m->arena->peak_live_bytes));
  std::size_t first_fullest = 0;
  std::int64_t most = -1;
  for (std::size_t i = 0; i < r.step->calls().size(); ++i) {
    const std::int64_t live = sum(planned_contents(transients, i, block).live);
    if (live > most) {
      most = live;
      first_fullest = i;
    }
  }
  EXPECT_EQ(full.call, first_fullest);
  EXPECT_EQ(full.call, m->peak_call);
  expect_arena_adds_up(*m, full, block);
}

TEST(FollowStep, TellsTheArenaAtItsFullestWhereTheWorkspaceMovesThePeak) {
  SimulationOptions o;
  o.step = small_config(4, MemoryPlan::planned);
  Result<StepMemory> plain = simulate_step(o);
  ASSERT_TRUE(plain.has_value()) << plain.status().message();
  ASSERT_TRUE(plain->arena_fullest.has_value());
  // A calibration with one large workspace at the first call, as cuDNN's conv1 takes on a GPU:
  // the peak moves there, where the arena holds little.
  Calibration c;
  c.workspace_bytes = 64 << 20;
  c.calls = plain->timeline.back().last_call + 1;
  c.workspace_by_call = {{0, c.workspace_bytes}};
  Result<StepMemory> m = simulate_step(o, &c);
  ASSERT_TRUE(m.has_value()) << m.status().message();
  ASSERT_TRUE(m->arena_at_peak.has_value() && m->arena_fullest.has_value());
  EXPECT_EQ(m->peak_call, 0u);
  EXPECT_EQ(m->peak[Category::workspace], c.workspace_bytes);
  const ArenaMoment& at = *m->arena_at_peak;
  const ArenaMoment& full = *m->arena_fullest;
  EXPECT_EQ(at.call, 0u);
  EXPECT_EQ(full.call, plain->arena_fullest->call);
  EXPECT_NE(full.call, at.call);
  EXPECT_LT(at.live_bytes(), full.live_bytes());
  EXPECT_EQ(full.live_bytes(), static_cast<std::int64_t>(m->arena->peak_live_bytes));
  EXPECT_EQ(full.allocated_bytes, m->peak.allocated_bytes - c.workspace_bytes);
  const std::int64_t block = at.block_bytes();
  EXPECT_GE(block, static_cast<std::int64_t>(m->arena->bytes));
  expect_arena_adds_up(*m, at, block);
  expect_arena_adds_up(*m, full, block);
  for (Category c2 : kAllCategories) EXPECT_EQ(full[c2], (*plain->arena_fullest)[c2]);
}

// From the plan alone, what a followed step tells of the arena at its fullest (bench prints it
// without following a step); nothing for a step without an arena.
TEST(ArenaFullest, IsWhatAFollowedStepTells) {
  testing::Rig r = make_rig(small_config(4, MemoryPlan::planned));
  ASSERT_TRUE(r.step);
  Result<StepMemory> m = follow_step(*r.step, *r.allocator);
  ASSERT_TRUE(m.has_value()) << m.status().message();
  ASSERT_TRUE(m->arena_fullest.has_value());
  const std::int64_t block = r.allocator->stats()[Category::arena].allocated_bytes;
  const std::optional<ArenaMoment> plan = arena_fullest(*r.step, block);
  ASSERT_TRUE(plan.has_value());
  const ArenaMoment& followed = *m->arena_fullest;
  EXPECT_EQ(plan->call, followed.call);
  EXPECT_EQ(plan->call_name, followed.call_name);
  EXPECT_EQ(plan->layer, followed.layer);
  EXPECT_EQ(plan->phase, followed.phase);
  for (Category c : kAllCategories) EXPECT_EQ((*plan)[c], followed[c]) << category_name(c);
  EXPECT_EQ(plan->gradient_bytes, followed.gradient_bytes);
  EXPECT_EQ(plan->free_bytes, followed.free_bytes);
  EXPECT_EQ(plan->largest_free_bytes, followed.largest_free_bytes);
  EXPECT_EQ(plan->block_bytes(), block);
  EXPECT_GT((*plan)[Category::activations], 0);

  testing::Rig dynamic = make_rig(small_config(4, MemoryPlan::dynamic));
  ASSERT_TRUE(dynamic.step);
  EXPECT_FALSE(arena_fullest(*dynamic.step, 0).has_value());
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
      if (calls[i].kind == engine::CallKind::sgd_step ||
          calls[i].kind == engine::CallKind::advance_step) {
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
