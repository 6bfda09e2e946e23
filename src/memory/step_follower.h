// Internal to memory analysis: the allocation hook that follows one step, and the ways to run it.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "dlprobe/memory/step_memory.h"

namespace dlprobe::memory {

MemoryMoment moment_of(const MemoryStats& stats);

// Records every allocator event of a step with the call it happened in (`where` says which call
// runs), from start() to stop() (also on destruction), and turns them into a StepMemory.
class StepFollower {
 public:
  StepFollower(const engine::TrainingStep& step, CachingAllocator& allocator,
               std::function<std::size_t()> where);
  ~StepFollower();
  StepFollower(const StepFollower&) = delete;
  StepFollower& operator=(const StepFollower&) = delete;

  // Resets the allocator's peaks, takes the state before the step, installs the hook.
  void start();
  void stop();
  StepMemory result() const;

 private:
  struct Recorded {
    std::size_t call = 0;
    MemoryMoment moment;
  };
  const engine::TrainingStep& step_;
  CachingAllocator& allocator_;
  std::function<std::size_t()> where_;
  MemoryMoment baseline_;
  std::vector<Recorded> events_;
  bool following_ = false;
};

// The dry simulation runs the call list itself (the dry step has no input to set): each entry once,
// in order, with `scratch[i]` bytes of workspace taken from `allocator` around call i when given
// (one entry per call), and the entry running kept in `*current` when given. follow_calls()
// follows such a pass.
Status run_calls(engine::TrainingStep& step, CachingAllocator& allocator,
                 const std::vector<std::int64_t>& scratch, std::size_t* current = nullptr);
Result<StepMemory> follow_calls(engine::TrainingStep& step, CachingAllocator& allocator,
                                const std::vector<std::int64_t>& scratch);

// The entries of a call list that compute, in order (all but alloc and free): what a
// calibration's workspace profile counts.
std::vector<std::size_t> computing_calls(std::span<const engine::Call> calls);

}  // namespace dlprobe::memory
