#include "dlprobe/bench/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "dlprobe/core/units.h"
#include "dlprobe/results/table.h"

namespace dlprobe::bench {
namespace {

std::string range_text(const std::optional<results::Range>& r, std::string_view unit) {
  if (!r) return "unknown";
  return fmt::format("{:.0f} {} (min {:.0f}, max {:.0f})", r->median, unit, r->min, r->max);
}

std::string size_text(std::int64_t bytes) {
  return format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(bytes, 0)));
}

// The first run's warm-up, "12 steps in 1.84 s, steady", and how many runs there were.
std::string warmup_text(const std::vector<results::Warmup>& warmups) {
  if (warmups.empty()) return "none";
  const results::Warmup& w = warmups.front();
  std::string how = "fixed";
  if (w.mode == "steady") how = w.steady ? "steady" : "still falling at its bound";
  std::string out = fmt::format("{} steps in {:.2f} s, {}", w.steps, w.seconds, how);
  if (w.restarts > 0) {
    out += fmt::format(" (window restarted {} time{})", w.restarts, w.restarts == 1 ? "" : "s");
  }
  if (warmups.size() > 1) out += fmt::format(" in the first of {} runs", warmups.size());
  return out;
}

}  // namespace

std::string configurations_text(const std::vector<results::Configuration>& configurations) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"configuration", "status", "img/s", "95% CI", "median ms", "p99 ms", "CV %",
                  "peak mem", "TFLOP/s", "% ceil", "J/img", "util %", "W", "SM MHz"});
  const auto fixed = [](const std::optional<double>& v, int decimals) -> std::string {
    return v ? format_grouped(*v, decimals) : "-";
  };
  for (const results::Configuration& c : configurations) {
    std::vector<std::string> r;
    r.push_back(results::describe(c.kind, c.settings));
    r.push_back(std::string(results::run_status_name(c.status)));
    if (c.statistics) {
      const stats::Summary& s = *c.statistics;
      r.push_back(format_grouped(s.throughput, 1));
      r.push_back(fmt::format("{} - {}", format_grouped(s.throughput_ci.low, 1),
                              format_grouped(s.throughput_ci.high, 1)));
      r.push_back(fmt::format("{:.3f}", s.median_s * 1e3));
      r.push_back(fmt::format("{:.3f}", s.p99_s * 1e3));
      r.push_back(fmt::format("{:.2f}", s.cv * 100));
    } else {
      r.insert(r.end(), 5, "-");
    }
    const auto peak = c.memory ? results::peak_memory_bytes(*c.memory) : std::nullopt;
    r.push_back(peak ? size_text(*peak) : "-");
    const results::Compute* k = c.compute ? &*c.compute : nullptr;
    // Three significant digits: a CPU run reaches a few GFLOP/s, a GPU hundreds of TFLOP/s.
    r.push_back(k && k->achieved_tflops ? fmt::format("{:.3g}", *k->achieved_tflops) : "-");
    r.push_back(k && k->fraction_of_ceiling ? fmt::format("{:.1f}", *k->fraction_of_ceiling * 100)
                                            : "-");
    const results::Telemetry* t = c.telemetry.empty() ? nullptr : &c.telemetry.front();
    std::optional<double> joules;
    if (t && t->energy_j && c.statistics) joules = *t->energy_j / c.statistics->total_items;
    r.push_back(joules ? fmt::format("{:.4f}", *joules) : "-");
    const auto median = [](const std::optional<results::Range>& range) -> std::optional<double> {
      if (!range) return std::nullopt;
      return range->median;
    };
    r.push_back(fixed(t ? median(t->gpu_util_pct) : std::nullopt, 0));
    r.push_back(fixed(t ? median(t->power_w) : std::nullopt, 0));
    r.push_back(fixed(t ? median(t->sm_clock_mhz) : std::nullopt, 0));
    rows.push_back(std::move(r));
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      // Text left, numbers right.
      line += i < 2 ? fmt::format("{:<{}}", r[i], width[i]) : fmt::format("{:>{}}", r[i], width[i]);
      if (i + 1 < r.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  std::string errors;
  for (const results::Configuration& c : configurations) {
    if (c.status != results::RunStatus::ok && !c.error.empty()) {
      errors += fmt::format("  {}: {}: {}\n", results::describe(c.kind, c.settings),
                            results::run_status_name(c.status), c.error);
    }
  }
  if (!errors.empty()) out += "did not finish:\n" + errors;
  return out;
}

std::string findings_text(const std::vector<results::Configuration>& configurations,
                          const std::vector<results::Finding>& sweep_findings) {
  // A warning that several configurations share is printed once, with each one's numbers.
  struct Group {
    const results::Finding* first = nullptr;
    std::vector<std::string> lines;
  };
  std::vector<Group> groups;
  const auto add = [&](const std::string& where, const results::Finding& f) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.first->id == f.id && g.first->severity == f.severity &&
             g.first->message == f.message && g.first->fix == f.fix;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{&f, {}});
    it->lines.push_back(where.empty() ? f.evidence : fmt::format("{}: {}", where, f.evidence));
  };
  for (const results::Configuration& c : configurations) {
    for (const results::Finding& f : c.findings) add(results::describe(c.kind, c.settings), f);
  }
  for (const results::Finding& f : sweep_findings) add("", f);
  if (groups.empty()) return "";
  std::string out = "findings:\n";
  for (const Group& g : groups) {
    out += fmt::format("  [{}] {}: {}\n", severity_name(g.first->severity), g.first->id,
                       g.first->message);
    for (const std::string& line : g.lines) {
      if (!line.empty()) out += "      " + line + "\n";
    }
    if (!g.first->fix.empty()) out += fmt::format("      fix: {}\n", g.first->fix);
  }
  return out;
}

namespace {

// A planned step's arena when most of it is live: the allocator holds the arena as one block, so
// its category lines count it whole as `arena` and the activations in it as none.
std::string arena_text(const memory::ArenaMoment& a) {
  std::string out = fmt::format("  in the arena, at its fullest ({}, {}):\n", a.call_name,
                                memory::phase_name(a.phase));
  for (const memory::ArenaPart& part : memory::arena_parts(a)) {
    if (part.bytes > 0) out += fmt::format("    {:<18} {}\n", part.name, size_text(part.bytes));
  }
  out += fmt::format("    {:<18} {}\n", "free", size_text(a.free_bytes));
  return out;
}

}  // namespace

std::string detail_text(const Sweep& sweep, const results::Configuration& c,
                        const std::vector<BenchResult>& runs) {
  static const BenchResult kNone;  // nothing ran: no memory, no loss
  const BenchResult& r = runs.empty() ? kNone : runs.front();
  const engine::StepConfig& step = sweep.groups.front().step;
  const Protocol& p = sweep.protocol;
  std::string out;
  out += fmt::format("model       {}{}, {}x{} images, {} classes, batch {}\n", c.settings.model,
                     step.model.width == 64 ? "" : fmt::format(" (width {})", step.model.width),
                     c.settings.image_size, c.settings.image_size, c.settings.classes,
                     c.settings.batch);
  out += fmt::format("step        {}, {}, {}, {}\n", c.settings.mode, c.settings.precision,
                     c.settings.layout,
                     step.mode == engine::StepMode::train ? c.settings.optimizer : "no optimizer");
  out += fmt::format("device      {}, {} backend{}\n", c.settings.device, c.settings.backend,
                     sweep.backend == device::BackendKind::reference
                         ? " (plain loops for correctness, not speed)"
                         : "");
  out += fmt::format(
      "protocol    setup {:.2f} s; warm-up {}; {} window{} of >= {} steps and >= {:.2f} s{}\n",
      r.setup_seconds, warmup_text(c.samples.warmup), p.repeat, p.repeat == 1 ? "" : "s",
      p.min_steps, p.min_seconds,
      runs.size() > 1 ? fmt::format(", {} runs from scratch", runs.size()) : "");
  if (c.statistics) {
    const stats::Summary& s = *c.statistics;
    out += fmt::format("timed       {} steps, {:.3f} s\n", s.steps, s.total_seconds);
    out += fmt::format("throughput  {:.2f} img/s ({:.0f}% CI {:.2f} - {:.2f} within the steps)\n",
                       s.throughput, s.ci_level * 100, s.throughput_ci.low, s.throughput_ci.high);
    if (c.run_spread) out += fmt::format("runs        {}\n", run_spread_text(c, "runs"));
    const std::vector<double> windows = results::window_throughputs(c.samples);
    if (windows.size() > 1) {
      std::string each;
      for (double w : windows) each += fmt::format("{}{:.2f}", each.empty() ? "" : ", ", w);
      out += fmt::format("windows     {} img/s\n", each);
    }
    out += fmt::format(
        "step time   median {:.3f} ms, p90 {:.3f} ms, p99 {:.3f} ms, MAD {:.3f} ms, CV {:.2f} %, "
        "{} outliers\n",
        s.median_s * 1e3, s.p90_s * 1e3, s.p99_s * 1e3, s.mad_s * 1e3, s.cv * 100, s.outliers);
  }
  if (c.compute && c.compute->flops_per_item) {
    const results::Compute& k = *c.compute;
    std::string line = fmt::format("{:.2f} GFLOP/img", *k.flops_per_item / 1e9);
    if (k.achieved_tflops) line += fmt::format(", {:.2f} TFLOP/s", *k.achieved_tflops);
    if (k.fraction_of_ceiling && k.ceiling_tflops) {
      line += fmt::format(", {:.1f}% of the measured {} GEMM ceiling ({:.1f} TFLOP/s)",
                          *k.fraction_of_ceiling * 100, k.ceiling_dtype, *k.ceiling_tflops);
    }
    out += fmt::format("compute     {}\n", line);
  }
  for (const results::Telemetry& t : c.telemetry) {
    out += fmt::format("gpu {}       util {}, power {}, SM clock {}\n", t.gpu,
                       range_text(t.gpu_util_pct, "%"), range_text(t.power_w, "W"),
                       range_text(t.sm_clock_mhz, "MHz"));
    if (t.energy_j && c.statistics) {
      out += fmt::format("energy      {:.4f} J/img ({:.1f} J over {:.2f} s, {})\n",
                         *t.energy_j / c.statistics->total_items, *t.energy_j, t.window_s,
                         t.energy_source == "counter" ? "energy counter" : "integrated power");
    }
  }
  if (!r.windows.empty()) {
    out += fmt::format("loss        {:.4f} (last step{})\n", r.last.loss,
                       step.precision == engine::Precision::fp16
                           ? fmt::format(", loss scale {}", r.last.loss_scale)
                           : "");
  }
  const memory::MemoryStats& m = r.memory;
  out += fmt::format("peak memory {} allocated, {} reserved\n",
                     size_text(m.all.allocated_bytes_peak), size_text(m.reserved_bytes_peak));
  for (const memory::Category cat : memory::kAllCategories) {
    out += fmt::format("  {:<16} {} peak, {} at the overall peak\n", memory::category_name(cat),
                       size_text(m[cat].allocated_bytes_peak),
                       size_text(m.peak.allocated_by_category[static_cast<std::size_t>(cat)]));
  }
  if (r.arena_fullest) out += arena_text(*r.arena_fullest);
  if (!m.peak.owner.empty()) out += fmt::format("  peak set by      {}\n", m.peak.owner);
  // The profile the results keep (with --repeat, the last run's), not the first run's.
  if (c.profile && !c.profile->empty()) out += profile_text(*c.profile);
  return out;
}

std::string outcome_text(const Sweep& sweep, const SweepOutcome& outcome,
                         const std::vector<results::Finding>& findings, bool detailed) {
  if (outcome.configurations.empty()) return "";
  std::string out;
  const results::Configuration& first = outcome.configurations.front();
  if (!detailed) {
    out = configurations_text(outcome.configurations);
  } else if (first.status == results::RunStatus::ok ||
             first.status == results::RunStatus::interrupted) {
    out = detail_text(sweep, first, outcome.runs.front());
  }
  return out + findings_text(outcome.configurations, findings);
}

std::string profile_text(const std::vector<results::CallTime>& profile) {
  const std::vector<results::KindTime> kinds = results::time_by_kind(profile);
  double total = 0;
  for (const results::KindTime& k : kinds) total += k.ms;
  std::string out =
      fmt::format("profile     {:.3f} ms per step (median per call), by kind:\n", total);
  for (const results::KindTime& k : kinds) {
    out += fmt::format("  {:<28} {:9.3f} ms {:5.1f} %  {:4d} calls\n", k.kind, k.ms,
                       100.0 * k.ms / std::max(total, 1e-12), k.calls);
  }
  out += "  slowest calls:\n";
  for (const results::CallTime* t : results::slowest_calls(profile, 25))
    out += fmt::format("  {:9.3f} ms  {}\n", t->ms, t->name);
  return out;
}

std::string run_spread_text(const results::Configuration& c, std::string_view what) {
  if (!c.run_spread) return {};
  const stats::RunSpread& spread = *c.run_spread;
  std::string each;
  for (double t : results::run_throughputs(c.samples)) {
    each += fmt::format("{}{:.2f}", each.empty() ? "" : ", ", t);
  }
  return fmt::format(
      "{} img/s; between {} {:.0f}% t interval {:.2f} - {:.2f}, spread {:.2f} - "
      "{:.2f}",
      each, what, spread.level * 100, spread.ci.low, spread.ci.high, spread.min, spread.max);
}

}  // namespace dlprobe::bench
