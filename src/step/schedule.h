// The schedule: the planner's drafts turned into the step's call list, with the memory of every
// activation and temporary placed by its lifetime (the first and last draft that use it).
#pragma once

#include <vector>

#include "step_state.h"

namespace dlprobe::engine::step_impl {

// Under MemoryPlan::dynamic every transient buffer is allocated by an `alloc` entry just before
// its first use and freed by a `free` entry just after its last; under planned the buffers are
// laid out in one arena (s.arena) from these lifetimes and the list holds only the drafts' calls.
// Fills s.transients either way.
Result<std::vector<Call>> schedule(StepState& s, std::vector<Draft> drafts);

}  // namespace dlprobe::engine::step_impl
