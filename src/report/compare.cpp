#include "dlprobe/report/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace dlprobe::report {

using results::Configuration;
using results::RunStatus;

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::faster:
      return "faster";
    case Verdict::slower:
      return "slower";
    case Verdict::no_change:
      return "no change";
    case Verdict::not_comparable:
      return "not comparable";
  }
  return "not comparable";
}

double regression(const ComparisonRow& row) {
  if (row.verdict != Verdict::slower || !row.ratio) return 0;
  return 1 - row.ratio->ratio;
}

namespace {

bool measured(const Configuration& c) {
  return c.status == RunStatus::ok && !c.samples.step_seconds.empty();
}

// The spread between runs as a fraction of their mean: the half-width of its t interval.
double run_noise(const Configuration& c) {
  if (!c.run_spread || !(c.run_spread->mean > 0)) return 0;
  const double half = (c.run_spread->ci.high - c.run_spread->ci.low) / 2 / c.run_spread->mean;
  return std::isfinite(half) ? half : 0;
}

// The calls of two profiles whose time moved most (see ComparisonRow::moved_calls).
std::vector<ComparisonRow::MovedCall> moved_calls(const std::vector<results::CallTime>& base,
                                                  const std::vector<results::CallTime>& next) {
  std::map<std::string, ComparisonRow::MovedCall> by_name;
  const auto add = [&](const std::vector<results::CallTime>& calls, bool is_base) {
    for (const results::CallTime& c : calls) {
      ComparisonRow::MovedCall& m = by_name[c.name];
      m.name = c.name;
      std::optional<double>& ms = is_base ? m.base_ms : m.new_ms;
      ms = ms.value_or(0) + c.ms;
    }
  };
  add(base, true);
  add(next, false);
  const auto move = [](const ComparisonRow::MovedCall& m) {
    return std::abs(m.new_ms.value_or(0) - m.base_ms.value_or(0));
  };
  std::vector<ComparisonRow::MovedCall> out;
  for (auto& [name, m] : by_name) {
    if (move(m) > 0) out.push_back(std::move(m));
  }
  std::stable_sort(out.begin(), out.end(),
                   [&](const auto& a, const auto& b) { return move(a) > move(b); });
  if (out.size() > kMovedCalls) out.resize(kMovedCalls);
  return out;
}

Result<ComparisonRow> compare_one(const Configuration& base, const Configuration& next,
                                  const CompareOptions& options) {
  ComparisonRow row;
  row.kind = base.kind;
  row.settings = base.settings;
  row.base_status = base.status;
  row.new_status = next.status;
  if (base.statistics) row.base_throughput = base.statistics->throughput;
  if (next.statistics) row.new_throughput = next.statistics->throughput;
  if (base.profile && next.profile) row.moved_calls = moved_calls(*base.profile, *next.profile);
  row.lost = measured(base) && !measured(next);
  if (!measured(base) || !measured(next)) return row;
  const std::string what = results::describe(base.kind, base.settings);
  auto ratio = stats::throughput_ratio(base.samples.step_seconds, base.samples.step_items,
                                       next.samples.step_seconds, next.samples.step_items,
                                       options.bootstrap);
  if (!ratio) return ratio.status().with_context(what);
  auto mw = stats::mann_whitney_u(base.samples.step_seconds, next.samples.step_seconds);
  if (!mw) return mw.status().with_context(what);
  // Step times near zero (5e-324 s) make the throughput overflow: a ratio of inf or nan and its
  // interval say neither faster nor slower, and "no change" would claim they were compared.
  if (!std::isfinite(ratio->ratio) || !std::isfinite(ratio->ci.low) ||
      !std::isfinite(ratio->ci.high) || !std::isfinite(mw->p_value)) {
    row.why = "throughput is not a finite number";
    return row;
  }
  row.ratio = *ratio;
  row.mann_whitney = *mw;
  row.noise = std::max({options.noise, run_noise(base), run_noise(next)});
  judge(row, options);
  // "No change" because of a spread between runs: which runs, fresh engines or fresh processes.
  if (row.verdict == Verdict::no_change && row.why.empty() && row.noise > options.noise &&
      std::abs(ratio->ratio - 1) < row.noise) {
    const Configuration& noisier = run_noise(base) >= run_noise(next) ? base : next;
    row.why = noisier.runs_in == results::RunsIn::processes ? "within the spread between processes"
                                                            : "within the spread between runs";
  }
  return row;
}

}  // namespace

void judge(ComparisonRow& row, const CompareOptions& options) {
  row.why.clear();
  if (!row.ratio || !row.mann_whitney) {
    row.verdict = Verdict::not_comparable;
    return;
  }
  const stats::Ratio& r = *row.ratio;
  const double p = row.mann_whitney->p_value;
  if (std::abs(r.ratio - 1) < std::max(options.noise, row.noise)) {
    row.verdict = Verdict::no_change;
    return;
  }
  if (r.ci.contains(1.0)) {
    row.verdict = Verdict::no_change;
    if (p < options.alpha) {
      row.why = fmt::format(
          "the step-time test sees a difference, p = {:.3g}, that the throughput interval "
          "does not",
          p);
    }
    return;
  }
  row.verdict = r.ratio > 1 ? Verdict::faster : Verdict::slower;
  if (p >= options.alpha) {
    // The ratio weighs every step's time; the U test ranks them, so a share of much slower (or
    // faster) steps moves the throughput and hardly the ranks.
    row.why = fmt::format(
        "the step-time test does not confirm it, p = {:.3g}: a share of the steps "
        "differs, not the typical step",
        p);
  }
}

Result<Comparison> compare(const results::Document& base, const results::Document& next,
                           const CompareOptions& options) {
  if (!(options.alpha > 0 && options.alpha < 1)) {
    return invalid_argument(fmt::format("alpha must be between 0 and 1, got {}", options.alpha));
  }
  if (!(options.noise >= 0 && options.noise < 1)) {
    return invalid_argument(
        fmt::format("noise threshold must be in [0, 1), got {}", options.noise));
  }
  Comparison out;
  // A file may hold the same settings more than once (a repeated sweep); the k-th occurrence in
  // one file is paired with the k-th in the other.
  std::vector<bool> used(next.configurations.size(), false);
  for (const auto& b : base.configurations) {
    std::optional<std::size_t> match;
    for (std::size_t i = 0; i < next.configurations.size(); ++i) {
      const auto& n = next.configurations[i];
      if (!used[i] && n.kind == b.kind && results::same_settings(b.kind, n.settings, b.settings)) {
        match = i;
        break;
      }
    }
    if (!match) {
      out.only_in_base.push_back(results::describe(b.kind, b.settings));
      continue;
    }
    used[*match] = true;
    DLPROBE_ASSIGN_OR_RETURN(auto row, compare_one(b, next.configurations[*match], options));
    out.rows.push_back(std::move(row));
  }
  for (std::size_t i = 0; i < next.configurations.size(); ++i) {
    if (!used[i]) {
      const auto& n = next.configurations[i];
      out.only_in_new.push_back(results::describe(n.kind, n.settings));
    }
  }
  if (out.rows.empty()) {
    return invalid_argument(
        fmt::format("no configuration matches between the files ({} in base, {} in new); they "
                    "measured different settings",
                    base.configurations.size(), next.configurations.size()));
  }
  return out;
}

namespace {

std::string status_text(const ComparisonRow& r) {
  if (r.base_status == RunStatus::ok && r.new_status == RunStatus::ok) return r.why;
  return fmt::format("base {}, new {}", results::run_status_name(r.base_status),
                     results::run_status_name(r.new_status));
}

std::string optional_fixed(const std::optional<double>& v, int decimals) {
  return v ? fmt::format("{:.{}f}", *v, decimals) : "-";
}

}  // namespace

std::string render_comparison_text(const Comparison& comparison) {
  struct Line {
    std::string cells[7];
  };
  std::vector<Line> lines;
  lines.push_back(
      {{"configuration", "base items/s", "new items/s", "ratio", "95% CI", "p (MWU)", "verdict"}});
  for (const auto& r : comparison.rows) {
    Line l;
    l.cells[0] = results::describe(r.kind, r.settings);
    l.cells[1] = optional_fixed(r.base_throughput, 1);
    l.cells[2] = optional_fixed(r.new_throughput, 1);
    if (r.ratio) {
      l.cells[3] = fmt::format("{:.3f}", r.ratio->ratio);
      l.cells[4] = fmt::format("[{:.3f}, {:.3f}]", r.ratio->ci.low, r.ratio->ci.high);
    } else {
      l.cells[3] = l.cells[4] = "-";
    }
    l.cells[5] = r.mann_whitney ? fmt::format("{:.3g}", r.mann_whitney->p_value) : "-";
    const std::string why = status_text(r);
    l.cells[6] = why.empty() ? std::string(verdict_name(r.verdict))
                             : fmt::format("{} ({})", verdict_name(r.verdict), why);
    lines.push_back(std::move(l));
  }
  std::size_t width[7] = {};
  for (const auto& l : lines) {
    for (std::size_t i = 0; i < 7; ++i) width[i] = std::max(width[i], l.cells[i].size());
  }
  std::string out;
  for (const auto& l : lines) {
    std::string line;
    for (std::size_t i = 0; i < 7; ++i) {
      // The description reads left to right; numbers line up on the right.
      line += i == 0 || i == 6 ? fmt::format("{:<{}}", l.cells[i], width[i])
                               : fmt::format("{:>{}}", l.cells[i], width[i]);
      if (i + 1 < 7) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  for (const auto& r : comparison.rows) {
    if (r.moved_calls.empty()) continue;
    out += fmt::format("\ncalls that moved most (ms a step, base -> new), {}:\n",
                       results::describe(r.kind, r.settings));
    std::size_t name_width = 0;
    for (const auto& m : r.moved_calls) name_width = std::max(name_width, m.name.size());
    for (const auto& m : r.moved_calls) {
      out += fmt::format("  {:<{}}  {:>9} -> {:>9}  {:+.3f}\n", m.name, name_width,
                         optional_fixed(m.base_ms, 3), optional_fixed(m.new_ms, 3),
                         m.new_ms.value_or(0) - m.base_ms.value_or(0));
    }
  }
  for (const auto& d : comparison.only_in_base) out += fmt::format("only in base: {}\n", d);
  for (const auto& d : comparison.only_in_new) out += fmt::format("only in new: {}\n", d);
  return out;
}

nlohmann::json comparison_json(const Comparison& comparison) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : comparison.rows) {
    nlohmann::json row = {
        {"kind", results::kind_name(r.kind)},
        {"configuration", results::describe(r.kind, r.settings)},
        {"base_status", results::run_status_name(r.base_status)},
        {"new_status", results::run_status_name(r.new_status)},
        {"base_throughput", r.base_throughput ? nlohmann::json(*r.base_throughput) : nullptr},
        {"new_throughput", r.new_throughput ? nlohmann::json(*r.new_throughput) : nullptr},
        {"ratio", r.ratio ? nlohmann::json(r.ratio->ratio) : nullptr},
        {"ratio_ci_low", r.ratio ? nlohmann::json(r.ratio->ci.low) : nullptr},
        {"ratio_ci_high", r.ratio ? nlohmann::json(r.ratio->ci.high) : nullptr},
        {"ci_level", r.ratio ? nlohmann::json(r.ratio->level) : nullptr},
        {"mann_whitney_p", r.mann_whitney ? nlohmann::json(r.mann_whitney->p_value) : nullptr},
        {"mann_whitney_exact", r.mann_whitney ? nlohmann::json(r.mann_whitney->exact) : nullptr},
        {"verdict", verdict_name(r.verdict)},
        {"regression", regression(r)},
        {"lost", r.lost}};
    if (!r.moved_calls.empty()) {
      nlohmann::json calls = nlohmann::json::array();
      for (const auto& m : r.moved_calls) {
        calls.push_back({{"name", m.name},
                         {"base_ms", m.base_ms ? nlohmann::json(*m.base_ms) : nullptr},
                         {"new_ms", m.new_ms ? nlohmann::json(*m.new_ms) : nullptr}});
      }
      row["moved_calls"] = std::move(calls);
    }
    rows.push_back(std::move(row));
  }
  return {{"schema", "dlprobe.compare/1"},
          {"rows", rows},
          {"only_in_base", comparison.only_in_base},
          {"only_in_new", comparison.only_in_new}};
}

}  // namespace dlprobe::report
