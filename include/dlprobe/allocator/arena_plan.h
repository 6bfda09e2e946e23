// The static memory planner: given buffers with a size and a lifetime (the first and last step of
// a call list that touch them), give each an offset in one arena so that no two buffers live at
// the same step overlap, with the arena as small as the planner can make it. The planned training
// step (engine::MemoryPlan::planned) lays out its activations and temporaries this way: every
// buffer then has one fixed address for every step (what a captured CUDA graph needs) and the
// step makes no allocator calls at all.
//
// No arena can be smaller than the most bytes live at one step (peak_live_bytes); the planner
// reports both, so the cost of the layout itself is visible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"

namespace dlprobe::memory {

// A buffer live from step `first` to step `last`, both included.
struct Lifetime {
  std::uint64_t bytes = 0;
  std::size_t first = 0;
  std::size_t last = 0;
};

struct ArenaPlan {
  std::vector<std::uint64_t> offsets;  // parallel to the buffers; multiples of the alignment
  std::uint64_t arena_bytes = 0;       // the end of the highest buffer
  // The most bytes (sizes rounded up to the alignment) live at one step, and the first step where
  // that many are: the lower bound of any layout.
  std::uint64_t peak_live_bytes = 0;
  std::size_t peak_step = 0;
};

// Sizes are rounded up to `alignment` (a power of two), as the caching allocator rounds requests,
// so every offset is aligned as an allocation would be. An interval with last < first, or an
// alignment that is not a power of two, is Errc::invalid_argument.
Result<ArenaPlan> plan_arena(std::span<const Lifetime> buffers,
                             std::uint64_t alignment = kBlockRound);

// Checks a layout against its buffers: one offset each, aligned, inside the arena, and no two
// buffers that are live at a common step share a byte. Errc::internal names the first violation.
Status check_arena_plan(std::span<const Lifetime> buffers, const ArenaPlan& plan,
                        std::uint64_t alignment = kBlockRound);

}  // namespace dlprobe::memory
