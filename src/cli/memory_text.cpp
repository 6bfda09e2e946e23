// What `dlprobe memory` prints.
#include "memory_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "dlprobe/core/units.h"

namespace dlprobe::cli {
namespace {

using memory::Category;

std::string size(std::int64_t bytes) {
  return bytes < 0 ? "-" + format_size(static_cast<std::uint64_t>(-bytes))
                   : format_size(static_cast<std::uint64_t>(bytes));
}

std::string percent_error(std::int64_t predicted, std::int64_t measured) {
  if (measured <= 0) return "n/a";
  return fmt::format("{:+.1f} %", 100.0 * static_cast<double>(predicted - measured) /
                                      static_cast<double>(measured));
}

// What the arena holds at one moment (`a`; `which` names that moment in a StepMemory, so the
// predicted step's is printed beside): its live buffers by category, the temporaries told as the
// gradients the backward pass carries and the rest, then its free rest, each label after `indent`.
template <class Line>
void print_arena_contents(const memory::ArenaMoment& a, const memory::Prediction* predicted,
                          std::optional<memory::ArenaMoment> memory::StepMemory::*which,
                          std::string_view indent, const Line& line) {
  const memory::ArenaMoment* p = nullptr;
  if (predicted != nullptr && (predicted->step.*which)) p = &*(predicted->step.*which);
  const std::vector<memory::ArenaPart> parts = memory::arena_parts(a);
  const std::vector<memory::ArenaPart> beside =
      p != nullptr ? memory::arena_parts(*p) : std::vector<memory::ArenaPart>{};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::optional<std::int64_t> b =
        p != nullptr ? std::optional(beside[i].bytes) : std::nullopt;
    if (parts[i].bytes == 0 && b.value_or(0) == 0) continue;
    line(fmt::format("{}{}", indent, parts[i].name), parts[i].bytes, b);
  }
  line(fmt::format("{}free", indent), a.free_bytes,
       p != nullptr ? std::optional(p->free_bytes) : std::nullopt);
}

// The breakdown at the peak, measured beside predicted where both exist.
void print_breakdown(const memory::Outcome& o) {
  const memory::StepMemory* measured = o.measured ? &o.measured->memory : nullptr;
  const memory::Prediction* predicted = o.predicted ? &*o.predicted : nullptr;
  const memory::Reconciliation* reconciliation =
      o.measured && o.measured->reconciliation ? &*o.measured->reconciliation : nullptr;
  const memory::StepMemory& main = measured != nullptr ? *measured : predicted->step;
  const bool both = measured != nullptr && predicted != nullptr;
  auto line = [&](std::string_view name, std::int64_t m, std::optional<std::int64_t> p) {
    const std::string beside = both && p ? fmt::format("   predicted {:>12}", size(*p)) : "";
    std::printf("  %-26s %12s%s\n", std::string(name).c_str(), size(m).c_str(), beside.c_str());
  };
  std::printf("peak        %s allocated%s at %s, %s (call %zu: %s)\n",
              size(main.peak.allocated_bytes).c_str(), measured != nullptr ? "" : " (predicted)",
              main.peak_layer.c_str(), std::string(memory::phase_name(main.peak_phase)).c_str(),
              main.peak_call, main.peak_call_name.c_str());
  // Under planned the categories count what lies outside the arena, and the arena's block is told
  // apart below its line: its live buffers by category, and its free rest.
  auto outside = [](const memory::StepMemory& s, Category c) {
    if (!s.arena_at_peak) return s.peak[c];
    if (c == Category::arena) return s.arena_at_peak->block_bytes();
    return s.peak[c] - (*s.arena_at_peak)[c];
  };
  auto beside = [&](auto figure) -> std::optional<std::int64_t> {
    if (predicted == nullptr) return std::nullopt;
    return figure(predicted->step);
  };
  for (Category c : memory::kAllCategories) {
    const std::optional<std::int64_t> p =
        beside([&](const memory::StepMemory& s) { return outside(s, c); });
    if (outside(main, c) == 0 && p.value_or(0) == 0) continue;
    line(memory::category_name(c), outside(main, c), p);
    if (c == Category::arena && main.arena_at_peak) {
      print_arena_contents(*main.arena_at_peak, predicted, &memory::StepMemory::arena_at_peak, "  ",
                           line);
    }
  }
  line("= allocated", main.peak.allocated_bytes,
       beside([](const memory::StepMemory& s) { return s.peak.allocated_bytes; }));
  if (reconciliation != nullptr) {
    line("CUDA context + libraries",
         reconciliation->nvml_process_bytes - reconciliation->reserved_bytes, std::nullopt);
  } else if (predicted != nullptr && predicted->outside_allocator_bytes && measured == nullptr) {
    line("CUDA context + libraries", *predicted->outside_allocator_bytes, std::nullopt);
  }
  if (both) {
    std::printf("  %-26s %12s\n", "prediction error",
                percent_error(predicted->step.peak.allocated_bytes, measured->peak.allocated_bytes)
                    .c_str());
  }
  std::printf("reserved    %s at the peak, %s at most\n", size(main.peak.reserved_bytes).c_str(),
              size(main.reserved_peak_bytes).c_str());
  std::printf("waste       %s at the peak (allocated - requested: rounding, unsplit remainders)\n",
              size(main.peak.waste_bytes()).c_str());
  std::printf("fragmentation %.3f at the peak (1 - largest free block / free cache: %s of %s)\n",
              main.peak.fragmentation(), size(main.peak.largest_free_block_bytes).c_str(),
              size(main.peak.reserved_bytes - main.peak.allocated_bytes).c_str());
  if (main.arena) {
    std::printf("arena       %s planned; no layout can be under %s (most bytes live at one call)\n",
                format_size(main.arena->bytes).c_str(),
                format_size(main.arena->peak_live_bytes).c_str());
  }
  if (main.arena_at_peak) {
    std::printf("            at the peak %s of it free, the largest free piece %s\n",
                size(main.arena_at_peak->free_bytes).c_str(),
                size(main.arena_at_peak->largest_free_bytes).c_str());
  }
  if (main.arena_fullest && main.arena_fullest->call == main.peak_call) {
    std::printf("fullest     the arena holds the most live bytes at the peak's call\n");
  } else if (main.arena_fullest) {
    const memory::ArenaMoment& f = *main.arena_fullest;
    std::printf(
        "fullest     the arena holds the most live bytes at %s, %s (call %zu: %s), %s "
        "allocated then\n",
        f.layer.c_str(), std::string(memory::phase_name(f.phase)).c_str(), f.call,
        f.call_name.c_str(), size(f.allocated_bytes).c_str());
    print_arena_contents(f, predicted, &memory::StepMemory::arena_fullest, "", line);
    line("= arena", f.block_bytes(),
         predicted != nullptr && predicted->step.arena_fullest
             ? std::optional(predicted->step.arena_fullest->block_bytes())
             : std::nullopt);
  }
  if (predicted != nullptr && predicted->workspace_bytes > 0) {
    std::printf("workspace   predicted from the calibration's %s (%s)\n",
                size(predicted->workspace_bytes).c_str(),
                predicted->workspace_model == "per call"
                    ? "each call's own, measured at the calibration batch"
                    : "its peak held through the step: the calibration ran another call list");
  }
  if (predicted != nullptr && predicted->outside_allocator_bytes) {
    std::printf("predicted   %s for the process (reserved %s + %s outside the allocator)\n",
                size(*predicted->process_bytes()).c_str(),
                size(predicted->step.reserved_peak_bytes).c_str(),
                size(*predicted->outside_allocator_bytes).c_str());
  } else if (predicted != nullptr && measured == nullptr) {
    std::printf(predicted->calibrated
                    ? "predicted   the allocator's figures only: the calibration has no NVML "
                      "figure for what the process holds outside the allocator (it did not run on "
                      "a GPU)\n"
                    : "predicted   without a calibration: the allocator's own categories only (no "
                      "workspace, no CUDA context or libraries); give --calibration FILE from a "
                      "run on a GPU\n");
  }
  if (reconciliation != nullptr) {
    const memory::Reconciliation& r = *reconciliation;
    std::printf(
        "NVML        %s for this process%s = %s reserved by the allocator + %s CUDA context and "
        "library handles (at start-up) + %s loaded since (kernels on first launch, library "
        "buffers)\n",
        size(r.nvml_process_bytes).c_str(),
        r.nvml_source == "device" ? " (device-wide: NVML does not list our pid)" : "",
        size(r.reserved_bytes).c_str(), size(r.context_bytes).c_str(),
        size(r.lazy_bytes()).c_str());
  }
}

// Where recomputing the block outputs would fit a larger batch, says so and how.
void print_recompute_hint(std::optional<std::int64_t> recomputed) {
  if (!recomputed) return;
  std::printf("recompute   with --recompute block-outputs, batch %lld is predicted to fit\n",
              static_cast<long long>(*recomputed));
}

void print_max_batch(const memory::Outcome& o) {
  const memory::MaxBatchResult& r = *o.max_batch;
  std::printf("== max batch under %s: %s %s, --gpu-memory %s\n", format_size(r.limit_bytes).c_str(),
              model::model_name(o.step.model).c_str(),
              std::string(engine::precision_name(o.step.precision)).c_str(),
              o.gpu_memory.text.c_str());
  std::printf("predicted   %lld\n", static_cast<long long>(r.predicted));
  std::optional<std::int64_t> nvml_most;
  for (const memory::MaxBatchTrial& t : r.trials) {
    if (!t.fits) {
      std::printf("  batch %6lld does not fit: %s\n", static_cast<long long>(t.batch),
                  t.why.c_str());
      continue;
    }
    std::printf("  batch %6lld fits: peak %s allocated, %s reserved%s\n",
                static_cast<long long>(t.batch), size(*t.peak_allocated_bytes).c_str(),
                size(*t.reserved_peak_bytes).c_str(),
                t.nvml_process_bytes
                    ? fmt::format(", NVML {} for the process", size(*t.nvml_process_bytes)).c_str()
                    : "");
    if (t.nvml_process_bytes) nvml_most = std::max(nvml_most.value_or(0), *t.nvml_process_bytes);
  }
  if (nvml_most) {
    std::printf("NVML        at most %s for the process in the runs that fit (limit %s)\n",
                size(*nvml_most).c_str(), format_size(r.limit_bytes).c_str());
  }
  std::printf("found       %lld (measured: it runs a full training step%s)\n",
              static_cast<long long>(r.found),
              r.next_fails ? fmt::format(", {} does not", r.found + 1).c_str()
                           : ", at the search's upper bound");
  print_recompute_hint(r.predicted_recomputed);
}

}  // namespace

std::string describe(const engine::StepConfig& c, const memory::GpuMemoryOption& g) {
  return fmt::format("{} bs{} {} {} {} {}, --gpu-memory {}", model::model_name(c.model), c.batch,
                     engine::precision_name(c.precision), engine::step_mode_name(c.mode),
                     layout_name(c.layout),
                     c.mode == engine::StepMode::train ? engine::optimizer_name(c.optimizer)
                                                       : std::string_view("no optimizer"),
                     g.text);
}

void print_outcome(const memory::Outcome& o, std::optional<std::uint64_t> device_bytes) {
  if (!o.failure.is_ok()) {
    std::printf("== %s: %s\n", describe(o.step, o.gpu_memory).c_str(), o.failure.message().c_str());
    return;
  }
  if (o.max_batch) {
    print_max_batch(o);
    return;
  }
  if (o.measured) {
    if (!o.misfit.empty()) std::printf("(predicted not to fit: %s)\n", o.misfit.c_str());
    std::printf("== %s, %s%s\n", describe(o.step, o.gpu_memory).c_str(),
                o.measured->calibration.device.c_str(),
                o.calibration_run ? ", the calibration run" : "");
    print_breakdown(o);
    return;
  }
  std::printf("== %s, predicted%s\n", describe(o.step, o.gpu_memory).c_str(),
              o.calibration ? fmt::format(" (calibration: {} bs{})", o.calibration->device,
                                          o.calibration->batch)
                                  .c_str()
                            : "");
  print_breakdown(o);
  if (device_bytes) {
    const std::int64_t need =
        o.predicted->process_bytes().value_or(o.predicted->step.reserved_peak_bytes);
    std::printf("fits        %s in %s\n",
                static_cast<std::uint64_t>(need) <= *device_bytes ? "yes" : "no",
                format_size(*device_bytes).c_str());
  }
}

void print_predicted_max_batch(const memory::PredictedMaxBatch& r) {
  std::printf("largest batch predicted to fit %s: %lld (%s %s, --gpu-memory %s%s)\n",
              format_size(r.limit_bytes).c_str(), static_cast<long long>(r.largest),
              model::model_name(r.step.model).c_str(),
              std::string(engine::precision_name(r.step.precision)).c_str(),
              r.gpu_memory.text.c_str(),
              r.calibrated ? "" : "; no calibration: allocator categories only");
  print_recompute_hint(r.recomputed);
}

void MemorySummary::add(const memory::Outcome& o) {
  if (!o.failure.is_ok()) return;
  if (o.max_batch) {
    found_.push_back(
        {o.step.precision, o.gpu_memory.text, o.max_batch->found, o.max_batch->limit_bytes});
  } else if (o.measured) {
    const auto& r = o.measured->reconciliation;
    rows_.push_back({o.step, o.gpu_memory.text, o.predicted->step.peak.allocated_bytes,
                     o.measured->memory.peak.allocated_bytes,
                     o.measured->memory.reserved_peak_bytes,
                     r ? std::optional(r->nvml_process_bytes) : std::nullopt, o.calibration_run});
  }
}

void MemorySummary::print() const {
  if (rows_.size() > 1) {
    std::printf("\n%-10s %6s %-10s %-20s %12s %12s %8s %12s %12s\n", "model", "batch", "precision",
                "gpu-memory", "predicted", "measured", "error", "reserved", "NVML");
    for (const Row& r : rows_) {
      std::printf("%-10s %6lld %-10s %-20s %12s %12s %8s %12s %12s%s\n",
                  model::model_name(r.step.model).c_str(), static_cast<long long>(r.step.batch),
                  std::string(engine::precision_name(r.step.precision)).c_str(),
                  r.gpu_memory.c_str(), size(r.predicted).c_str(), size(r.measured).c_str(),
                  percent_error(r.predicted, r.measured).c_str(), size(r.reserved).c_str(),
                  r.nvml ? size(*r.nvml).c_str() : "-", r.calibration ? "  (calibration)" : "");
    }
  }
  if (found_.size() < 2 || found_.front().batch <= 0) return;
  const Found& first = found_.front();
  std::printf("\nlargest batch under %s, measured:\n", format_size(first.limit_bytes).c_str());
  for (const Found& f : found_) {
    std::printf(
        "  %-6s --gpu-memory %-10s %6lld  (%+.1f %% against %s %s)\n",
        std::string(engine::precision_name(f.precision)).c_str(), f.gpu_memory.c_str(),
        static_cast<long long>(f.batch),
        100.0 * static_cast<double>(f.batch - first.batch) / static_cast<double>(first.batch),
        std::string(engine::precision_name(first.precision)).c_str(), first.gpu_memory.c_str());
  }
}

}  // namespace dlprobe::cli
