// Findings about the GPUs of one run against each other: one idle while the others work, one
// holding far more memory than the others.
#include <fmt/format.h>

#include <algorithm>

#include "dlprobe/core/units.h"
#include "dlprobe/run/runner.h"

namespace dlprobe::run {

namespace {

template <class T>
T median_of(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : v[n / 2 - 1] / 2 + v[n / 2] / 2;
}

std::string gpu_list(const std::vector<unsigned>& gpus) {
  std::string out;
  for (unsigned g : gpus) out += fmt::format("{}{}", out.empty() ? "" : ", ", g);
  return out;
}

}  // namespace

std::vector<diagnosis::Finding> gpu_imbalance_findings(const std::vector<PerGpuFigures>& gpus,
                                                       bool utilisation) {
  std::vector<diagnosis::Finding> out;
  if (gpus.size() < 2) return out;

  if (utilisation) {
    std::vector<unsigned> idle;
    std::vector<double> busy;
    for (const auto& g : gpus) {
      if (!g.util_median_pct) continue;
      if (*g.util_median_pct < kIdleGpuUtilPct)
        idle.push_back(g.index);
      else
        busy.push_back(*g.util_median_pct);
    }
    if (!idle.empty() && !busy.empty()) {
      const double others = median_of(busy);
      if (others >= kBusyGpuUtilPct) {
        diagnosis::Finding f;
        f.id = "gpu_idle_while_others_work";
        f.severity = Severity::warning;
        f.title = fmt::format("GPU {} idle while the other GPUs work", gpu_list(idle));
        f.evidence = fmt::format(
            "GPU {} below {:.0f}% utilisation (median) while the other {} GPU{} of the run "
            "reach {:.0f}% (median, at least {:.0f}% counts as working), though the workload "
            "holds memory on {}",
            gpu_list(idle), kIdleGpuUtilPct, busy.size(), busy.size() == 1 ? "" : "s", others,
            kBusyGpuUtilPct, idle.size() == 1 ? "it" : "them");
        f.fix =
            "check that every rank got work: the launcher's world size and the device each rank "
            "selects (LOCAL_RANK), a rank stuck in a collective (NCCL_DEBUG=INFO), or a model "
            "placed on one GPU only";
        f.numbers = {{"idle_gpus", static_cast<double>(idle.size())},
                     {"others_util_median_pct", others}};
        out.push_back(std::move(f));
      }
    }
  }

  for (const auto& g : gpus) {
    if (!g.peak_bytes) continue;
    std::vector<std::uint64_t> others;
    for (const auto& o : gpus) {
      if (&o != &g && o.peak_bytes) others.push_back(*o.peak_bytes);
    }
    if (others.empty()) continue;
    const std::uint64_t typical = median_of(others);
    if (static_cast<double>(*g.peak_bytes) > kMemoryImbalanceRatio * static_cast<double>(typical) &&
        *g.peak_bytes - typical >= kMemoryImbalanceMinBytes) {
      diagnosis::Finding f;
      f.id = "gpu_memory_imbalance";
      f.severity = Severity::warning;
      f.title = fmt::format("GPU {} holds far more memory than the other GPUs", g.index);
      f.evidence = fmt::format(
          "GPU {} peaked at {}, the other GPUs at {} (median): more than {:.1f}x and {} above "
          "them",
          g.index, format_size(*g.peak_bytes), format_size(typical), kMemoryImbalanceRatio,
          format_size(kMemoryImbalanceMinBytes));
      f.fix =
          "look for what every rank puts on this GPU: a CUDA context per rank on GPU 0 (select "
          "the rank's device before any CUDA call, e.g. torch.cuda.set_device(local_rank)), "
          "torch.load without map_location, or metrics gathered on rank 0";
      f.numbers = {{"gpu", static_cast<double>(g.index)},
                   {"peak_bytes", static_cast<double>(*g.peak_bytes)},
                   {"others_median_bytes", static_cast<double>(typical)}};
      out.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace dlprobe::run
