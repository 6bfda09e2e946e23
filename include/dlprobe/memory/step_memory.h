// Following a step: where the device memory of one step of the native training step goes.
//
// follow_step() runs one step with an allocation hook on the caching allocator and places every
// allocation and free at the entry of the call list that made it. From that come the step's peak
// (its breakdown by category, the layer, call and phase where it happens), rounding waste and
// fragmentation at the peak, and a timeline with one point per visit of a layer (its forward
// calls, later its backward calls) at the highest moment of the visit. Under MemoryPlan::planned
// the allocator sees one arena; the plan says which of its buffers are live at each call, so the
// arena is split into activations, temporaries and its unused rest (category arena) at every
// point, and what it holds is told at the peak and at its fullest (ArenaMoment).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::memory {

enum class Phase : std::uint8_t { forward, backward, update };
std::string_view phase_name(Phase phase);

// The phase of every entry of a call list: forward up to the loss, backward from the loss
// gradient, update from the gradient unscale or optimizer call. An alloc entry belongs with the
// call after it, a free entry with the call before it.
std::vector<Phase> call_phases(std::span<const engine::Call> calls);

using CategoryBytes = std::array<std::int64_t, kCategoryCount>;

// The allocator's state at one moment of a step.
struct MemoryMoment {
  CategoryBytes by_category{};  // allocated bytes
  std::int64_t allocated_bytes = 0;
  std::int64_t requested_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t largest_free_block_bytes = 0;
  // Rounding and unsplit remainders: allocated - requested.
  std::int64_t waste_bytes() const { return allocated_bytes - requested_bytes; }
  // 1 - largest free block / cached free bytes (reserved - allocated); 0 with no free cache.
  double fragmentation() const;
  std::int64_t operator[](Category c) const { return by_category[static_cast<std::size_t>(c)]; }
};

// Consecutive calls of one layer in one phase, at their highest moment.
struct LayerVisit {
  std::string layer;
  Phase phase = Phase::forward;
  std::size_t first_call = 0;
  std::size_t last_call = 0;
  MemoryMoment high;
};

// Planned only: what the arena's block holds during one call. The plan's buffers live then, by the
// category the planner gives them (activations: kept for the backward pass; temporaries: the
// gradients the backward pass carries, outputs no backward reads, casts), at their sizes rounded
// as the planner rounds them; the rest of the block is free, between and above them (the block is
// the plan's arena rounded up as the allocator rounds it). live_bytes() + free_bytes is the block.
struct ArenaMoment {
  std::size_t call = 0;  // the entry of calls()
  std::string call_name;
  std::string layer;
  Phase phase = Phase::forward;
  CategoryBytes live{};
  // Of live[temporaries], the gradients the backward pass carries (TransientBuffer::gradient).
  std::int64_t gradient_bytes = 0;
  std::int64_t free_bytes = 0;
  std::int64_t largest_free_bytes = 0;  // the longest run of free bytes
  std::int64_t allocated_bytes = 0;     // the allocator's total at the call's highest moment
  std::int64_t live_bytes() const;
  std::int64_t block_bytes() const { return live_bytes() + free_bytes; }
  std::int64_t operator[](Category c) const { return live[static_cast<std::size_t>(c)]; }
};

// What an ArenaMoment's live buffers hold, part by part in one order for every moment (zeros
// included): each category, but temporaries told as the gradients the backward pass carries
// ("backward gradients") and the rest ("other temporaries"). The free rest is free_bytes.
struct ArenaPart {
  std::string_view name;
  std::int64_t bytes = 0;
};
std::vector<ArenaPart> arena_parts(const ArenaMoment& a);

struct StepMemory {
  MemoryMoment peak;
  std::size_t peak_call = 0;  // the entry of calls() during which the peak happened
  std::string peak_call_name;
  std::string peak_layer;
  Phase peak_phase = Phase::forward;
  std::vector<LayerVisit> timeline;
  std::int64_t workspace_peak_bytes = 0;  // the most workspace allocated at one moment
  // Per entry of calls(): the most workspace allocated at one moment of the call.
  std::vector<std::int64_t> workspace_by_call;
  std::int64_t reserved_peak_bytes = 0;  // the most reserved at one moment
  std::int64_t events = 0;               // allocations and frees during the step
  std::optional<engine::ArenaLayout> arena;
  // Planned only: the arena during the peak's call, and during the first call where the most of
  // it is live (its fullest; the same call as the peak unless something outside the arena, such
  // as a call's workspace, makes the peak elsewhere).
  std::optional<ArenaMoment> arena_at_peak;
  std::optional<ArenaMoment> arena_fullest;
};

// Runs one step (input set, warmed up) with a hook on `allocator`, which must be the step's. The
// allocator's peak statistics are reset first, so afterwards they are this step's.
Result<StepMemory> follow_step(engine::TrainingStep& step, CachingAllocator& allocator);

// Planned only: what the arena holds during the first call where the most of it is live, from the
// plan alone (no step runs), in the allocator's block of `block` bytes; none without an arena.
// What StepMemory::arena_fullest gives for a followed step, but its allocated_bytes (0: unknown).
std::optional<ArenaMoment> arena_fullest(const engine::TrainingStep& step, std::int64_t block);

}  // namespace dlprobe::memory
