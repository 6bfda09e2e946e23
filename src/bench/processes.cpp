#include "dlprobe/bench/processes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <numeric>

#include "dlprobe/bench/results.h"
#include "dlprobe/bench/text.h"
#include "dlprobe/stats/statistics.h"
#include "dlprobe/stats/steady_state.h"

namespace dlprobe::bench {
namespace {

bool measured(const results::Configuration& c) {
  return c.status == results::RunStatus::ok && !c.samples.step_seconds.empty();
}

// The measured configurations of `settings`, one per process that has it.
std::vector<const results::Configuration*> measured_in(const std::vector<ProcessRun>& processes,
                                                       const results::Configuration& like) {
  std::vector<const results::Configuration*> out;
  for (const ProcessRun& p : processes) {
    if (!p.document) continue;
    for (const results::Configuration& c : p.document->configurations) {
      if (c.kind == like.kind && c.settings == like.settings && measured(c)) {
        out.push_back(&c);
        break;
      }
    }
  }
  return out;
}

// The processes' measurements of one configuration as one, each process a run.
results::Configuration merge_one(const std::vector<const results::Configuration*>& each) {
  results::Configuration c = *each.front();
  results::Samples& s = c.samples;
  s = {};
  s.host_cpus = each.front()->samples.host_cpus;
  for (const results::Configuration* p : each) {
    const results::Samples& from = p->samples;
    s.step_seconds.insert(s.step_seconds.end(), from.step_seconds.begin(), from.step_seconds.end());
    s.step_items.insert(s.step_items.end(), from.step_items.begin(), from.step_items.end());
    s.warmup_steps += from.warmup_steps;
    s.warmup.insert(s.warmup.end(), from.warmup.begin(), from.warmup.end());
    s.window_steps.insert(s.window_steps.end(), from.window_steps.begin(), from.window_steps.end());
    s.window_other_cpu_seconds.insert(s.window_other_cpu_seconds.end(),
                                      from.window_other_cpu_seconds.begin(),
                                      from.window_other_cpu_seconds.end());
    if (each.size() > 1) {
      s.run_steps.push_back(static_cast<std::int64_t>(from.step_seconds.size()));
    }
  }
  // Windows are kept when every process timed several; the other processes' CPU time is one
  // figure a window, so it is kept only where it still is.
  const bool windowed = std::all_of(each.begin(), each.end(), [](const results::Configuration* p) {
    return !p->samples.window_steps.empty();
  });
  if (!windowed) s.window_steps.clear();
  const std::size_t windows = !s.window_steps.empty()
                                  ? s.window_steps.size()
                                  : std::max<std::size_t>(1, s.run_steps.size());
  if (s.window_other_cpu_seconds.size() != windows) {
    s.window_other_cpu_seconds.clear();
    s.host_cpus = 0;
  }
  c.statistics.reset();
  c.run_spread.reset();
  c.runs_in.reset();
  if (auto summary = stats::summarize(s.step_seconds, s.step_items)) {
    c.statistics = *summary;
  } else {
    c.status = results::RunStatus::failed;
    c.error = fmt::format("step statistics: {}", summary.status().message());
  }
  if (s.run_steps.size() >= 2) {
    c.runs_in = results::RunsIn::processes;
    if (auto spread = stats::run_spread(results::run_throughputs(s))) c.run_spread = *spread;
  }
  if (c.compute) {
    c.compute->achieved_tflops.reset();
    c.compute->fraction_of_ceiling.reset();
    if (c.compute->flops_per_item && c.statistics) {
      c.compute->achieved_tflops = *c.compute->flops_per_item * c.statistics->throughput / 1e12;
      if (c.compute->ceiling_tflops && *c.compute->ceiling_tflops > 0) {
        c.compute->fraction_of_ceiling = *c.compute->achieved_tflops / *c.compute->ceiling_tflops;
      }
    }
  }
  c.findings = findings_of(c, {});
  for (const results::Configuration* p : each) {
    for (const results::Finding& f : p->findings) {
      const bool said = std::any_of(c.findings.begin(), c.findings.end(),
                                    [&](const results::Finding& g) { return g.id == f.id; });
      if (!said) c.findings.push_back(f);
    }
  }
  return c;
}

// What became of process `i`, which did not end well, and of its results.
std::string ended_badly(const std::vector<ProcessRun>& processes, std::size_t i) {
  const ProcessRun& p = processes[i];
  if (p.document) {
    return fmt::format("process {} of {} ended with {}; what it measured is kept with the others",
                       i + 1, processes.size(), p.failure);
  }
  return fmt::format("process {} of {} failed ({}) and wrote no results; the others' are kept",
                     i + 1, processes.size(), p.failure);
}

}  // namespace

results::Document merge_processes(const std::vector<ProcessRun>& processes) {
  results::Document out;
  const auto first = std::find_if(processes.begin(), processes.end(),
                                  [](const ProcessRun& p) { return p.document.has_value(); });
  if (first != processes.end()) {
    out.context = first->document->context;
    // Every configuration any process wrote, in the order the processes wrote them: one that
    // stopped early (a crash after its first configuration, or before any) holds fewer.
    for (const ProcessRun& p : processes) {
      if (!p.document) continue;
      for (const results::Configuration& c : p.document->configurations) {
        const bool merged = std::any_of(out.configurations.begin(), out.configurations.end(),
                                        [&](const results::Configuration& o) {
                                          return o.kind == c.kind && o.settings == c.settings;
                                        });
        if (merged) continue;
        const auto each = measured_in(processes, c);
        out.configurations.push_back(each.empty() ? c : merge_one(each));
      }
    }
    for (const ProcessRun& p : processes) {
      if (!p.document) continue;
      for (const results::Finding& f : p.document->findings) {
        const bool said = std::any_of(out.findings.begin(), out.findings.end(),
                                      [&](const results::Finding& g) { return g.id == f.id; });
        if (!said) out.findings.push_back(f);
      }
    }
  }
  for (std::size_t i = 0; i < processes.size(); ++i) {
    if (processes[i].failure.empty()) continue;
    out.findings.push_back({Severity::warning, "process_failed", ended_badly(processes, i),
                            processes[i].failure,
                            "see its stderr above (a crash, a sanitizer's report, a "
                            "configuration that did not finish) and rerun"});
  }
  return out;
}

std::string processes_text(const results::Document& merged,
                           const std::vector<ProcessRun>& processes) {
  const std::size_t ok = static_cast<std::size_t>(std::count_if(
      processes.begin(), processes.end(), [](const ProcessRun& p) { return p.failure.empty(); }));
  std::string out = fmt::format(
      "processes   {} of {} ended well (--repeat-process: each the whole measurement "
      "in a fresh process)\n",
      ok, processes.size());
  for (const results::Configuration& c : merged.configurations) {
    out += fmt::format("{}: {}", results::describe(c.kind, c.settings),
                       results::run_status_name(c.status));
    if (!c.error.empty()) out += ": " + c.error;
    out += "\n";
    if (!c.statistics) continue;
    const stats::Summary& s = *c.statistics;
    out += fmt::format(
        "  throughput  {:.2f} img/s over every process ({:.0f}% CI {:.2f} - {:.2f} within the "
        "steps)\n",
        s.throughput, s.ci_level * 100, s.throughput_ci.low, s.throughput_ci.high);
    if (c.run_spread) out += fmt::format("  processes   {}\n", run_spread_text(c, "processes"));
  }
  for (std::size_t i = 0; i < processes.size(); ++i) {
    if (!processes[i].failure.empty()) out += ended_badly(processes, i) + "\n";
  }
  return out;
}

}  // namespace dlprobe::bench
