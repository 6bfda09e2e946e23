// The schedule of transient buffers: their lifetimes over the drafts, then either one arena laid
// out from them (MemoryPlan::planned) or `alloc`/`free` entries around each buffer's uses
// (dynamic), as PyTorch's caching allocator sees a step (tensors die with their last reference).
#include "schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>

#include "dlprobe/allocator/arena_plan.h"

namespace dlprobe::engine::step_impl {
namespace {

using memory::Category;

// The first and last draft that use each transient buffer, and the buffers in order of first use
// (so allocation follows the step; the maps order by address).
struct Lifetimes {
  std::vector<Buffer*> order;
  std::map<Buffer*, std::size_t> first;
  std::map<Buffer*, std::size_t> last;
};

Lifetimes lifetimes_of(const std::vector<Draft>& drafts) {
  Lifetimes t;
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    for (Buffer* b : drafts[i].uses) {
      if (!b->transient) continue;
      if (t.first.try_emplace(b, i).second) t.order.push_back(b);
      t.last[b] = i;
    }
  }
  return t;
}

// StepConfig::streams: the waits between the backend's two streams, and how long the memory of
// what a stream-1 call touches is kept: until stream 0 has waited for that call, as the device may
// run it any time before. Stream 0 waits for a pending stream-1 call (and so for every one before
// it, the stream runs them in order) only before
//   - a call that uses a buffer it writes (the fp16 gradients' cast), or that lists no buffers
//     (the optimizer's calls, which reach every gradient);
//   - with StepConfig::stream_lag N, any call more than N drafts past it;
//   - the step's end (the runtime's).
// Without a lag the arena keeps every weight gradient's operands until the end. Waiting earlier,
// to keep fewer, cost more than the second stream gained at small batches: on an H200 at batch 32
// (fp16 ResNet-50 gradients), with at most 1, 2, 4 or 16 weight gradients pending the step ran
// 4,650 to 4,700 img/s against 4,816 on one stream, as stream 0 stalled behind stream 1; with none
// of those waits, 4,880 against 4,769 (1.80 against 1.38 GiB). On an H100 (2026-12-06, a lab
// build of this rule beside the binaries of 2bd43ae, `bench_ab --streams 1 2`) a lag of 16 drafts
// ran batch 32 below one stream too (fp16 5,052 against 5,149 img/s), but at batch 256 it kept most
// of the overlap in little more than one stream's arena: fp16 1.007 times one stream's speed
// in 9.15 against 8.76 GiB (unbounded 1.007 in 11.85), bf16 1.017 in 10.45 against 10.27,
// tf32 1.025 in 20.00 against 19.91 (unbounded 22.94); lags 8 and 32 ran within 0.5 % of 16. A
// stream-0 call that only reads what a pending call reads needs no wait: the planner writes a
// gradient once, before the backward of the layer that reads it, and the backward pass writes no
// activation, so what stream 1 reads does not change under it.
void place_stream_waits(std::vector<Draft>& drafts, Lifetimes& t, std::size_t lag) {
  std::deque<std::size_t> pending;  // stream-1 drafts not waited for, oldest first
  // Before draft j, stream 0 waits for the oldest `count` pending drafts.
  auto wait_before = [&](std::size_t j, std::size_t count) {
    if (count == 0) return;
    if (j < drafts.size())
      drafts[j].call.join_through = static_cast<std::int64_t>(pending[count - 1]);
    for (std::size_t k = 0; k < count; ++k) {
      for (Buffer* b : drafts[pending[k]].uses) {
        if (b->transient) t.last[b] = std::max(t.last[b], j - 1);
      }
    }
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(count));
  };
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.call.stream == 1) {
      d.call.fork = true;
      pending.push_back(i);
      continue;
    }
    if (d.uses.empty()) {
      wait_before(i, pending.size());
      continue;
    }
    // Through the newest pending call that writes what this one uses, or that is `lag` behind.
    std::size_t count = 0;
    if (lag > 0) {
      while (count < pending.size() && i - pending[count] > lag) ++count;
    }
    for (std::size_t k = count; k < pending.size(); ++k) {
      const std::vector<Buffer*>& w = drafts[pending[k]].writes;
      const bool uses_it = std::any_of(d.uses.begin(), d.uses.end(), [&](const Buffer* b) {
        return std::find(w.begin(), w.end(), b) != w.end();
      });
      if (uses_it) count = k + 1;
    }
    wait_before(i, count);
  }
  wait_before(drafts.size(), pending.size());
}

// One arena for every transient buffer, each at a fixed offset.
Result<std::vector<Call>> schedule_planned(StepState& s, std::vector<Draft> drafts,
                                           const Lifetimes& t) {
  std::vector<memory::Lifetime> lifetimes;
  lifetimes.reserve(t.order.size());
  for (Buffer* b : t.order) {
    lifetimes.push_back({b->view.desc.bytes(), t.first.at(b), t.last.at(b)});
  }
  DLPROBE_ASSIGN_OR_RETURN(memory::ArenaPlan plan, memory::plan_arena(lifetimes));
  // A wrong layout would corrupt values silently, so it is checked once here.
  DLPROBE_RETURN_IF_ERROR(memory::check_arena_plan(lifetimes, plan));
  DLPROBE_ASSIGN_OR_RETURN(
      s.arena, s.allocator.allocate_buffer(plan.arena_bytes, Category::arena, "planned arena"));
  s.arena_layout = ArenaLayout{plan.arena_bytes, plan.peak_live_bytes};
  auto* base = static_cast<std::byte*>(s.arena.data());
  for (std::size_t k = 0; k < t.order.size(); ++k) {
    Buffer* b = t.order[k];
    b->view.data = base + plan.offsets[k];
    s.transients.push_back({b->owner, b->category, b->view.desc.bytes(), t.first.at(b),
                            t.last.at(b), plan.offsets[k], b->gradient});
  }
  std::vector<Call> calls;
  calls.reserve(drafts.size());
  for (Draft& d : drafts) calls.push_back(std::move(d.call));
  return calls;
}

// "alloc layer1.0.bn1 activations fp32[8x64x8x8, nchw]": the entry's name.
std::string entry_name(std::string_view what, const Buffer& b) {
  return fmt::format("{} {} {} {}", what, b.owner, memory::category_name(b.category),
                     b.view.desc.str());
}

// Each transient buffer allocated just before the draft that first uses it and freed just after
// the last.
std::vector<Call> schedule_dynamic(StepState& s, std::vector<Draft> drafts, const Lifetimes& t) {
  std::vector<std::vector<Buffer*>> allocs(drafts.size());
  std::vector<std::vector<Buffer*>> frees(drafts.size());
  for (Buffer* b : t.order) allocs[t.first.at(b)].push_back(b);
  // Frees in the order the draft uses them.
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    for (Buffer* b : drafts[i].uses) {
      if (!b->transient || t.last.at(b) != i) continue;
      if (std::find(frees[i].begin(), frees[i].end(), b) == frees[i].end()) frees[i].push_back(b);
    }
  }
  std::map<Buffer*, std::size_t> transient_index;
  std::vector<Call> calls;
  memory::CachingAllocator& allocator = s.allocator;
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    for (Buffer* b : allocs[i]) {
      transient_index[b] = s.transients.size();
      s.transients.push_back(
          {b->owner, b->category, b->view.desc.bytes(), calls.size(), 0, 0, b->gradient});
      calls.push_back(
          {entry_name("alloc", *b), CallKind::alloc, b->owner, [&allocator, b]() -> Status {
             DLPROBE_ASSIGN_OR_RETURN(
                 b->view.data, allocator.allocate(b->view.desc.bytes(), b->category, b->owner));
             return Status::ok();
           }});
    }
    calls.push_back(std::move(drafts[i].call));
    for (Buffer* b : frees[i]) {
      s.transients[transient_index[b]].last_call = calls.size();
      calls.push_back({entry_name("free", *b), CallKind::free, b->owner, [&allocator, b] {
                         void* ptr = b->view.data;
                         b->view.data = nullptr;
                         return allocator.deallocate(ptr);
                       }});
    }
  }
  return calls;
}

}  // namespace

Result<std::vector<Call>> schedule(StepState& s, std::vector<Draft> drafts) {
  Lifetimes t = lifetimes_of(drafts);
  if (s.config.memory_plan == MemoryPlan::planned) {
    place_stream_waits(drafts, t, static_cast<std::size_t>(s.config.stream_lag));
    return schedule_planned(s, std::move(drafts), t);
  }
  return schedule_dynamic(s, std::move(drafts), t);
}

}  // namespace dlprobe::engine::step_impl
