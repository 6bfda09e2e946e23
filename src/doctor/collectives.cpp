// The parts of the NCCL sweep that need no GPU: nccl-tests' formulas, the size sweep, the links'
// peak. The measurement itself is in collectives_nccl.cpp (CUDA builds).
#include "dlprobe/doctor/collectives.h"

#include <fmt/format.h>

#include <algorithm>

namespace dlprobe::doctor {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
  }
  return "all_reduce";
}

double bus_factor(Collective c, int ranks) {
  const double n = ranks;
  switch (c) {
    case Collective::all_reduce:
      return 2 * (n - 1) / n;
    case Collective::all_gather:
    case Collective::reduce_scatter:
      return (n - 1) / n;
  }
  return 0;
}

double algbw_gbs(std::uint64_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9;
}

std::optional<double> busbw_gbs(Collective c, std::uint64_t bytes, double seconds, int ranks) {
  if (ranks < 2) return std::nullopt;
  return algbw_gbs(bytes, seconds) * bus_factor(c, ranks);
}

std::uint64_t collective_bytes(Collective c, std::uint64_t requested, int ranks,
                               std::uint64_t element_bytes) {
  const std::uint64_t unit = c == Collective::all_reduce
                                 ? element_bytes
                                 : element_bytes * static_cast<std::uint64_t>(ranks);
  return requested / unit * unit;
}

std::uint64_t collective_rank_bytes(Collective c, std::uint64_t bytes, int ranks) {
  const std::uint64_t shard = bytes / static_cast<std::uint64_t>(ranks);
  switch (c) {
    case Collective::all_reduce:
      return 2 * bytes;
    case Collective::all_gather:      // send one shard, receive the whole
    case Collective::reduce_scatter:  // send the whole, receive one shard
      return bytes + shard;
  }
  return 2 * bytes;
}

std::uint64_t sweep_max_bytes(std::uint64_t free_bytes, std::uint64_t cap,
                              std::uint64_t min_bytes) {
  // All-reduce needs the most: a send and a receive buffer of the whole message.
  const auto usable =
      static_cast<std::uint64_t>(static_cast<double>(free_bytes) * (1 - kNcclMemoryHeadroom));
  std::uint64_t best = 0;
  for (std::uint64_t s = min_bytes; s != 0 && s <= cap && s <= usable / 2; s *= 2) {
    best = s;
    if (s > cap / 2) break;  // the next doubling would pass the cap (or overflow)
  }
  return best;
}

std::vector<std::uint64_t> sweep_sizes(std::uint64_t min_bytes, std::uint64_t max_bytes) {
  std::vector<std::uint64_t> out;
  if (min_bytes == 0 || max_bytes < min_bytes) return out;
  for (std::uint64_t s = min_bytes; s <= max_bytes; s *= 2) {
    out.push_back(s);
    if (s > max_bytes / 2) break;
  }
  if (out.back() != max_bytes) out.push_back(max_bytes);
  return out;
}

std::string_view topology_level_name(TopologyLevel level) {
  // nvidia-smi topo -m's abbreviations.
  switch (level) {
    case TopologyLevel::internal:
      return "same board";
    case TopologyLevel::single:
      return "PIX";
    case TopologyLevel::multiple:
      return "PXB";
    case TopologyLevel::hostbridge:
      return "PHB";
    case TopologyLevel::node:
      return "NODE";
    case TopologyLevel::system:
      return "SYS";
  }
  return "SYS";
}

std::optional<double> nvlink_gbs_per_link(int cc_major, int cc_minor) {
  const int cc = cc_major * 10 + cc_minor;
  if (cc == 70 || cc == 80 || cc == 90) return 25.0;
  if (cc == 100) return 50.0;
  return std::nullopt;
}

std::optional<LinkPeak> link_peak(const std::vector<GpuLinks>& gpus,
                                  const std::vector<GpuPair>& pairs) {
  if (gpus.size() < 2) return std::nullopt;
  const bool all_nvlink = !pairs.empty() && std::all_of(pairs.begin(), pairs.end(),
                                                        [](auto& p) { return p.nvlink == true; });
  std::optional<double> lowest;
  for (const auto& g : gpus) {
    const auto& peak = all_nvlink ? g.nvlink_peak_gbs : g.pcie_peak_gbs;
    if (!peak) return std::nullopt;
    lowest = std::min(lowest.value_or(*peak), *peak);
  }
  return LinkPeak{*lowest, all_nvlink ? "NVLink" : "PCIe"};
}

std::string one_rank_note() {
  return "one GPU: the communicator has one rank, so nothing crosses a link and the bus "
         "bandwidth is 0 by definition (not shown); the algorithm bandwidth is a local copy. "
         "Run on several GPUs for link bandwidth figures";
}

#if !DLPROBE_WITH_CUDA
Result<CollectiveReport> measure_collectives(const CollectiveOptions&, const RankEnv&) {
  CollectiveReport r;
  r.why_not = "dlprobe was built without CUDA (DLPROBE_WITH_CUDA=OFF)";
  return r;
}
#endif

}  // namespace dlprobe::doctor
