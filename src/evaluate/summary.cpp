#include "dlprobe/evaluate/summary.h"

#include <fmt/format.h>

#include <algorithm>

#include "dlprobe/core/units.h"
#include "dlprobe/doctor/versions.h"
#include "dlprobe/results/table.h"

namespace dlprobe::evaluate {

std::string evaluation_summary(const doctor::Report& report, const bench::Sweep& sweep,
                               const std::vector<results::Configuration>& configurations,
                               const std::vector<results::Finding>& findings,
                               const std::filesystem::path& dir) {
  std::string machine;
  const doctor::StackVersions& v = report.versions;
  const auto gpu = std::find_if(report.gpus.begin(), report.gpus.end(), [&](const auto& g) {
    return g.cuda_visible && g.index == sweep.device.index;
  });
  if (sweep.device.kind == DeviceKind::cuda && gpu != report.gpus.end()) {
    const doctor::GpuReport& g = *gpu;
    machine = fmt::format(
        "{}{}{}, driver {}, CUDA runtime {}, cuDNN {}", g.name,
        g.cc_major && g.cc_minor ? fmt::format(" (cc {}.{}", *g.cc_major, *g.cc_minor) : " (",
        g.memory_total_bytes ? fmt::format(", {})", format_size(*g.memory_total_bytes)) : ")",
        v.driver.value_or("unknown"),
        v.cuda_runtime_loaded > 0 ? doctor::decode_cuda_version(v.cuda_runtime_loaded).str()
                                  : "none",
        v.cudnn.loaded ? v.cudnn.version : "not found");
  } else {
    machine = fmt::format("{} ({} threads), {}, oneDNN {}", report.host.cpu.model,
                          report.host.cpu.threads, report.host.os,
                          v.onednn.loaded ? v.onednn.version : "not found");
  }
  std::string ceilings;
  if (report.ceilings) {
    std::vector<std::string> parts;
    for (const GemmCeiling& g : report.ceilings->gemm) {
      if (g.measured) parts.push_back(fmt::format("{} {:.1f}", gemm_dtype_name(g.dtype), g.tflops));
    }
    ceilings = fmt::format("GEMM {} TFLOP/s", fmt::join(parts, ", "));
    for (const BandwidthCeiling& b : report.ceilings->bandwidth) {
      if (b.measured && b.name == "device_memcpy_d2d") {
        ceilings += fmt::format("; device memory {:.0f} GB/s", b.gbs);
      }
    }
  } else {
    ceilings = report.ceilings_note.empty() ? "not measured" : report.ceilings_note;
  }
  const results::Configuration* best = nullptr;
  const results::Configuration* peak = nullptr;
  std::optional<std::int64_t> peak_bytes;
  std::size_t ran = 0;
  for (const results::Configuration& c : configurations) {
    if (c.status == results::RunStatus::ok) ++ran;
    // The best is the best of the GPU's own work: a run fed from JPEGs is said beside it.
    if (c.statistics && c.status == results::RunStatus::ok && c.settings.input.empty() &&
        (best == nullptr || c.statistics->throughput > best->statistics->throughput)) {
      best = &c;
    }
    const auto bytes = c.memory ? results::peak_memory_bytes(*c.memory) : std::nullopt;
    if (bytes && c.status == results::RunStatus::ok && (!peak_bytes || *bytes > *peak_bytes)) {
      peak_bytes = bytes;
      peak = &c;
    }
  }
  std::string best_line = "nothing ran";
  if (best != nullptr) {
    const stats::Summary& s = *best->statistics;
    best_line =
        fmt::format("{}: {} img/s (95% CI {} - {}", results::describe(best->kind, best->settings),
                    format_grouped(s.throughput, 1), format_grouped(s.throughput_ci.low, 1),
                    format_grouped(s.throughput_ci.high, 1));
    // With several runs, the interval a second evaluation is expected to land in.
    if (best->run_spread) {
      best_line += fmt::format(
          " within the steps; {} - {} between {} runs", format_grouped(best->run_spread->ci.low, 1),
          format_grouped(best->run_spread->ci.high, 1), best->run_spread->runs);
    }
    best_line += ")";
    if (best->compute && best->compute->fraction_of_ceiling) {
      best_line += fmt::format(
          ", {:.1f} TFLOP/s = {:.1f}% of the {} ceiling", *best->compute->achieved_tflops,
          *best->compute->fraction_of_ceiling * 100, best->compute->ceiling_dtype);
    }
    if (const std::optional<double> energy = results::energy_j(*best)) {
      best_line += fmt::format(", {:.3f} J/img", *energy / s.total_items);
    }
    // The same configuration trained from the JPEGs (evaluate --data), run right after it.
    for (const results::Configuration& c : configurations) {
      results::Settings twin = c.settings;
      twin.input = best->settings.input;
      if (c.settings.input.empty() || c.kind != best->kind || !(twin == best->settings)) continue;
      best_line += c.statistics && c.status == results::RunStatus::ok
                       ? fmt::format("; from JPEGs ({}) {} img/s = {:.1f}%", c.settings.input,
                                     format_grouped(c.statistics->throughput, 1),
                                     100 * c.statistics->throughput / s.throughput)
                       : fmt::format("; from JPEGs ({}): {}", c.settings.input,
                                     results::run_status_name(c.status));
      break;
    }
  }
  std::string memory_line = fmt::format("{} of {} configurations ran", ran, configurations.size());
  if (peak != nullptr) {
    memory_line = fmt::format("peak {} allocated ({}); ",
                              format_size(static_cast<std::uint64_t>(*peak_bytes)),
                              results::describe(peak->kind, peak->settings)) +
                  memory_line;
  }
  std::size_t warnings = 0;
  std::size_t errors = 0;
  const auto count = [&](const results::Finding& f) {
    if (f.severity == Severity::warning) ++warnings;
    if (f.severity == Severity::error) ++errors;
  };
  for (const auto& f : findings) count(f);
  for (const auto& c : configurations) {
    for (const auto& f : c.findings) count(f);
  }
  return fmt::format(
      "machine   {}\nceilings  {}\nbest      {}\nmemory    {}\nfindings  {} errors, {} warnings; "
      "report {}, results {}\n",
      machine, ceilings, best_line, memory_line, errors, warnings, (dir / "report.html").string(),
      (dir / "results.json").string());
}

}  // namespace dlprobe::evaluate
