// Following one step through the allocator: every allocation and free, placed at the call that
// made it, turned into the step's peak, its timeline per layer visit, and the figures at the peak.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <utility>

#include "dlprobe/core/units.h"
#include "dlprobe/memory/step_memory.h"
#include "step_follower.h"

namespace dlprobe::memory {
namespace {

using engine::CallKind;

bool is_update(CallKind kind) {
  return kind == CallKind::unscale_gradients || kind == CallKind::sgd_step ||
         kind == CallKind::adamw_step || kind == CallKind::advance_step;
}

std::size_t index_of(Category c) {
  return static_cast<std::size_t>(c);
}

// An alloc entry serves the call after it and a free entry ends a buffer of the call before it,
// so each takes that call's value in `per_call`.
template <class T>
void attach_alloc_and_free(std::span<const engine::Call> calls, std::vector<T>& per_call) {
  const std::size_t n = calls.size();
  for (std::size_t i = n; i-- > 0;) {
    if (calls[i].kind == CallKind::alloc && i + 1 < n) per_call[i] = per_call[i + 1];
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (calls[i].kind == CallKind::free && i > 0) per_call[i] = per_call[i - 1];
  }
}

// The layer each entry works for: its own, or for an alloc or free entry that of the call it
// serves (the owner of a freed buffer may be an earlier layer).
std::vector<std::string_view> call_layers(std::span<const engine::Call> calls) {
  std::vector<std::string_view> layers(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) layers[i] = calls[i].layer;
  attach_alloc_and_free(calls, layers);
  return layers;
}

// Planned: the bytes live in the arena during each of `n` calls (and 0 after them), by category,
// as the arena lays them out (sizes rounded as the planner rounds them).
std::vector<CategoryBytes> live_by_call(std::span<const engine::TransientBuffer> transients,
                                        std::size_t n) {
  std::vector<CategoryBytes> live(n + 1, CategoryBytes{});
  for (const engine::TransientBuffer& b : transients) {
    const auto bytes = static_cast<std::int64_t>(round_up(b.bytes, kBlockRound));
    live[std::min(b.first_call, n)][index_of(b.category)] += bytes;
    live[std::min(b.last_call + 1, n)][index_of(b.category)] -= bytes;
  }
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t c = 0; c < kCategoryCount; ++c) live[i][c] += live[i - 1][c];
  }
  return live;
}

std::int64_t total_of(const CategoryBytes& bytes) {
  std::int64_t total = 0;
  for (const std::int64_t b : bytes) total += b;
  return total;
}

// The first of `n` calls with the most bytes live.
std::size_t fullest_call(const std::vector<CategoryBytes>& live, std::size_t n) {
  std::size_t fullest = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (total_of(live[i]) > total_of(live[fullest])) fullest = i;
  }
  return fullest;
}

// The arena during call `i`: the plan's buffers live then, by category, and the free runs between
// and above them in the allocator's block of `block` bytes.
ArenaMoment arena_during(std::span<const engine::TransientBuffer> transients, std::size_t i,
                         std::int64_t block) {
  ArenaMoment a;
  a.call = i;
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // [offset, end)
  for (const engine::TransientBuffer& b : transients) {
    if (b.first_call > i || i > b.last_call) continue;
    const auto bytes = static_cast<std::int64_t>(round_up(b.bytes, kBlockRound));
    const auto offset = static_cast<std::int64_t>(b.arena_offset);
    a.live[index_of(b.category)] += bytes;
    if (b.gradient) a.gradient_bytes += bytes;
    spans.emplace_back(offset, offset + bytes);
  }
  std::sort(spans.begin(), spans.end());
  std::int64_t end = 0;
  for (const auto& [offset, stop] : spans) {
    a.largest_free_bytes = std::max(a.largest_free_bytes, offset - end);
    end = std::max(end, stop);
  }
  a.largest_free_bytes = std::max(a.largest_free_bytes, block - end);
  a.free_bytes = block - a.live_bytes();
  return a;
}

}  // namespace

std::string_view phase_name(Phase phase) {
  constexpr std::array<std::string_view, 3> kNames = {"forward", "backward", "update"};
  const auto i = static_cast<std::size_t>(phase);
  return i < kNames.size() ? kNames[i] : "?";
}

std::vector<Phase> call_phases(std::span<const engine::Call> calls) {
  const std::size_t n = calls.size();
  std::size_t backward = n;
  std::size_t update = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (backward == n && calls[i].kind == CallKind::cross_entropy_backward) backward = i;
    if (update == n && is_update(calls[i].kind)) update = i;
  }
  auto by_position = [&](std::size_t i) {
    if (i >= update) return Phase::update;
    if (i >= backward) return Phase::backward;
    return Phase::forward;
  };
  std::vector<Phase> phases(n, Phase::forward);
  for (std::size_t i = 0; i < n; ++i) phases[i] = by_position(i);
  attach_alloc_and_free(calls, phases);
  return phases;
}

std::int64_t ArenaMoment::live_bytes() const {
  std::int64_t total = 0;
  for (const std::int64_t bytes : live) total += bytes;
  return total;
}

double MemoryMoment::fragmentation() const {
  const std::int64_t cached_free = reserved_bytes - allocated_bytes;
  if (cached_free <= 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_block_bytes) / static_cast<double>(cached_free);
}

MemoryMoment moment_of(const MemoryStats& s) {
  MemoryMoment m;
  for (std::size_t i = 0; i < kCategoryCount; ++i)
    m.by_category[i] = s.by_category[i].allocated_bytes;
  m.allocated_bytes = s.all.allocated_bytes;
  m.requested_bytes = s.all.requested_bytes;
  m.reserved_bytes = s.reserved_bytes;
  m.largest_free_block_bytes = s.largest_free_block_bytes;
  return m;
}

StepFollower::StepFollower(const engine::TrainingStep& step, CachingAllocator& allocator,
                           std::function<std::size_t()> where)
    : step_(step), allocator_(allocator), where_(std::move(where)) {}

StepFollower::~StepFollower() {
  stop();
}

void StepFollower::start() {
  allocator_.reset_peak_stats();
  baseline_ = moment_of(allocator_.stats());
  events_.clear();
  allocator_.set_hook([this](const AllocationEvent& e) {
    events_.push_back(
        {where_(), MemoryMoment{.by_category = e.allocated_by_category,
                                .allocated_bytes = e.allocated_bytes,
                                .requested_bytes = e.requested_total_bytes,
                                .reserved_bytes = e.reserved_bytes,
                                .largest_free_block_bytes = e.largest_free_block_bytes}});
  });
  following_ = true;
}

void StepFollower::stop() {
  if (!following_) return;
  allocator_.set_hook({});
  following_ = false;
}

StepMemory StepFollower::result() const {
  const std::vector<engine::Call>& calls = step_.calls();
  const std::size_t n = calls.size();
  const std::vector<Phase> phases = call_phases(calls);
  const std::vector<std::string_view> layers = call_layers(calls);
  StepMemory out;
  out.arena = step_.arena();
  out.events = static_cast<std::int64_t>(events_.size());

  const std::vector<CategoryBytes> live =
      out.arena ? live_by_call(step_.transients(), n) : std::vector<CategoryBytes>(n + 1);
  auto live_total = [&](std::size_t i) { return total_of(live[i]); };
  auto split_arena = [&](MemoryMoment m, std::size_t i) {
    if (!out.arena || i >= n) return m;
    for (std::size_t c = 0; c < kCategoryCount; ++c) m.by_category[c] += live[i][c];
    m.by_category[index_of(Category::arena)] -= live_total(i);
    return m;
  };
  // The higher of two moments: more allocated, or as much with more of it in live buffers (under
  // planned the total stands still while the arena's contents move).
  auto key = [](const MemoryMoment& m) {
    return std::make_tuple(m.allocated_bytes, m[Category::activations] + m[Category::temporaries]);
  };
  auto note = [&](const MemoryMoment& m) {
    out.workspace_peak_bytes = std::max(out.workspace_peak_bytes, m[Category::workspace]);
    out.reserved_peak_bytes = std::max(out.reserved_peak_bytes, m.reserved_bytes);
  };

  note(baseline_);
  if (n == 0) {
    for (const Recorded& r : events_) note(r.moment);
    out.peak = baseline_;
    return out;
  }
  // Events come in call order; an index that is not (one from before the step, or past its end)
  // is held to the order.
  std::vector<std::size_t> at(events_.size());
  for (std::size_t k = 0; k < events_.size(); ++k) {
    at[k] = std::min(std::max(events_[k].call, k > 0 ? at[k - 1] : 0), n - 1);
  }
  std::vector<MemoryMoment> high(n);
  out.workspace_by_call.assign(n, 0);
  MemoryMoment state = baseline_;
  std::size_t e = 0;
  for (std::size_t i = 0; i < n; ++i) {
    high[i] = split_arena(state, i);
    out.workspace_by_call[i] = state[Category::workspace];
    for (; e < events_.size() && at[e] == i; ++e) {
      state = events_[e].moment;
      const MemoryMoment m = split_arena(state, i);
      note(m);
      if (key(m) > key(high[i])) high[i] = m;
      out.workspace_by_call[i] = std::max(out.workspace_by_call[i], m[Category::workspace]);
    }
  }
  std::size_t peak = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (key(high[i]) > key(high[peak])) peak = i;
  }
  out.peak = high[peak];
  out.peak_call = peak;
  out.peak_call_name = calls[peak].name;
  out.peak_layer = std::string(layers[peak]);
  out.peak_phase = phases[peak];
  if (out.arena) {
    const std::size_t fullest = fullest_call(live, n);
    auto arena_at = [&](std::size_t i) {
      // The allocator's block: what split_arena left unused plus what it moved out.
      ArenaMoment a = arena_during(step_.transients(), i, high[i][Category::arena] + live_total(i));
      a.call_name = calls[i].name;
      a.layer = std::string(layers[i]);
      a.phase = phases[i];
      a.allocated_bytes = high[i].allocated_bytes;
      return a;
    };
    out.arena_at_peak = arena_at(peak);
    out.arena_fullest = arena_at(fullest);
  }

  for (std::size_t i = 0; i < n;) {
    LayerVisit v;
    v.layer = std::string(layers[i]);
    v.phase = phases[i];
    v.first_call = i;
    v.high = high[i];
    std::size_t j = i + 1;
    while (j < n && layers[j] == v.layer && phases[j] == v.phase) {
      if (key(high[j]) > key(v.high)) v.high = high[j];
      ++j;
    }
    v.last_call = j - 1;
    out.timeline.push_back(std::move(v));
    i = j;
  }
  return out;
}

Result<StepMemory> follow_step(engine::TrainingStep& step, CachingAllocator& allocator) {
  StepFollower follower(step, allocator, [&step] { return step.current_call(); });
  follower.start();
  Result<engine::StepResult> ran = step.run_step();
  follower.stop();
  if (!ran) return ran.status();
  return follower.result();
}

std::vector<ArenaPart> arena_parts(const ArenaMoment& a) {
  std::vector<ArenaPart> parts;
  for (const Category c : kAllCategories) {
    if (c != Category::temporaries) {
      parts.push_back({category_name(c), a[c]});
      continue;
    }
    parts.push_back({"backward gradients", a.gradient_bytes});
    parts.push_back({"other temporaries", a[c] - a.gradient_bytes});
  }
  return parts;
}

std::optional<ArenaMoment> arena_fullest(const engine::TrainingStep& step, std::int64_t block) {
  if (!step.arena()) return std::nullopt;
  const std::vector<engine::Call>& calls = step.calls();
  const std::size_t n = calls.size();
  if (n == 0) return std::nullopt;
  const std::size_t i = fullest_call(live_by_call(step.transients(), n), n);
  ArenaMoment a = arena_during(step.transients(), i, block);
  a.call_name = calls[i].name;
  a.layer = std::string(call_layers(calls)[i]);
  a.phase = call_phases(calls)[i];
  return a;
}

namespace {

// One call, with its calibrated scratch around it as a backend would take it.
Status run_call(const engine::Call& call, CachingAllocator& allocator, std::int64_t scratch) {
  DeviceBuffer buffer;
  if (scratch > 0) {
    DLPROBE_ASSIGN_OR_RETURN(
        buffer, allocator.allocate_buffer(static_cast<std::size_t>(scratch), Category::workspace,
                                          "workspace (calibrated)"));
  }
  const Status s = call.run();
  if (!s.is_ok()) return s.with_context(call.name);
  return Status::ok();
}

}  // namespace

Status run_calls(engine::TrainingStep& step, CachingAllocator& allocator,
                 const std::vector<std::int64_t>& scratch, std::size_t* current) {
  const std::vector<engine::Call>& calls = step.calls();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (current != nullptr) *current = i;
    DLPROBE_RETURN_IF_ERROR(run_call(calls[i], allocator, scratch.empty() ? 0 : scratch[i]));
  }
  return Status::ok();
}

Result<StepMemory> follow_calls(engine::TrainingStep& step, CachingAllocator& allocator,
                                const std::vector<std::int64_t>& scratch) {
  std::size_t current = 0;
  StepFollower follower(step, allocator, [&current] { return current; });
  follower.start();
  DLPROBE_RETURN_IF_ERROR(run_calls(step, allocator, scratch, &current));
  follower.stop();
  return follower.result();
}

std::vector<std::size_t> computing_calls(std::span<const engine::Call> calls) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].kind != CallKind::alloc && calls[i].kind != CallKind::free) out.push_back(i);
  }
  return out;
}

}  // namespace dlprobe::memory
