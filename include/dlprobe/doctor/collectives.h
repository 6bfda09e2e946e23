// NCCL collectives across the GPUs: all-reduce, all-gather and reduce-scatter over a sweep of
// message sizes, reported as nccl-tests reports them, with the links between the GPUs (NVLink or
// PCIe, from NVML) and their peak beside the figures.
//
// nccl-tests' definitions (doc/PERFORMANCE.md of NVIDIA/nccl-tests): a message of S bytes is the
// all-reduce's buffer, all-gather's whole output and reduce-scatter's whole input; algorithm
// bandwidth algbw = S / t; bus bandwidth busbw = algbw x 2(n-1)/n for all-reduce and algbw x
// (n-1)/n for all-gather and reduce-scatter, the bytes each rank's links carry, comparable with
// the links' peak whatever n is. For one rank the factor is 0: nothing crosses a link.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/launcher.h"
#include "dlprobe/core/status.h"

namespace dlprobe::doctor {

enum class Collective { all_reduce, all_gather, reduce_scatter };
inline constexpr Collective kAllCollectives[] = {Collective::all_reduce, Collective::all_gather,
                                                 Collective::reduce_scatter};
std::string_view collective_name(Collective c);  // "all_reduce", ...

// 2(n-1)/n or (n-1)/n; 0 for n = 1. n must be at least 1.
double bus_factor(Collective c, int ranks);
// 10^9 bytes/s; seconds must be above 0.
double algbw_gbs(std::uint64_t bytes, double seconds);
// nullopt for one rank: the bus bandwidth is 0 by definition there, not a measured figure.
std::optional<double> busbw_gbs(Collective c, std::uint64_t bytes, double seconds, int ranks);

// The bytes actually moved for a requested size, as nccl-tests rounds it: whole elements of
// `element_bytes`, and for all-gather and reduce-scatter a whole number of elements per rank.
// 0 when the size holds less than that.
std::uint64_t collective_bytes(Collective c, std::uint64_t requested, int ranks,
                               std::uint64_t element_bytes);
// Device memory one rank needs for a message: send and receive buffers, out of place.
std::uint64_t collective_rank_bytes(Collective c, std::uint64_t bytes, int ranks);

struct SweepBounds {
  std::uint64_t min_bytes = 8;
  std::uint64_t max_bytes = 8ull << 30;  // nccl-tests' -e 8G
};
// The largest power-of-two message within `cap` whose buffers fit in `free_bytes` with
// kNcclMemoryHeadroom left for NCCL's own buffers, on the rank with the least free memory; 0 when
// not even min_bytes fits.
inline constexpr double kNcclMemoryHeadroom = 0.2;
std::uint64_t sweep_max_bytes(std::uint64_t free_bytes, std::uint64_t cap, std::uint64_t min_bytes);
// min, 2 min, 4 min, ... up to max inclusive (nccl-tests' -f 2); max itself ends the list when
// it is not a power-of-two multiple of min.
std::vector<std::uint64_t> sweep_sizes(std::uint64_t min_bytes, std::uint64_t max_bytes);

// ---- links between the GPUs ----

// NVML's nvmlGpuTopologyLevel_t, nearest first.
enum class TopologyLevel { internal, single, multiple, hostbridge, node, system };
std::string_view topology_level_name(TopologyLevel level);  // "PIX", "PXB", "PHB", "NODE", "SYS"

struct GpuPair {
  int a = 0, b = 0;  // CUDA device indices
  std::optional<TopologyLevel> pcie_path;
  std::optional<bool> nvlink;    // NVML's NVLink P2P status is OK
  std::optional<bool> p2p_read;  // peer reads possible over whatever path
  std::string link;              // "NVLink", "PCIe (PIX)", ... or "unknown"
};

struct GpuLinks {
  int device = 0;
  std::optional<int> nvlink_active;       // active NVLink links of this GPU
  std::optional<double> nvlink_peak_gbs;  // per direction, all active links
  std::optional<double> pcie_peak_gbs;    // per direction, the link's current gen and width
};

// NVLink's bandwidth per link and direction, by compute capability: 25 GB/s for NVLink 2-4
// (sm_70 V100, sm_80 A100, sm_90 H100/H200), 50 GB/s for NVLink 5 (sm_100 B200); nullopt for
// others (NVLink bridges of workstation boards differ by board).
std::optional<double> nvlink_gbs_per_link(int cc_major, int cc_minor);

// The peak a ring or tree over these GPUs can approach per rank: the slowest GPU's NVLink when
// every pair is NVLink, else the slowest PCIe link; nullopt when the figures are unknown.
struct LinkPeak {
  double gbs = 0;
  std::string kind;  // "NVLink", "PCIe"
};
std::optional<LinkPeak> link_peak(const std::vector<GpuLinks>& gpus,
                                  const std::vector<GpuPair>& pairs);

// ---- the measurement ----

struct CollectiveOptions {
  SweepBounds bounds;
  int warmup = 5;
  int iterations = 20;
  std::vector<Collective> collectives = {std::begin(kAllCollectives), std::end(kAllCollectives)};
};

struct CollectivePoint {
  std::uint64_t bytes = 0;  // nccl-tests' size (after rounding to whole elements per rank)
  double time_us = 0;       // mean over the iterations
  double algbw_gbs = 0;
  std::optional<double> busbw_gbs;  // none for one rank
};

struct CollectiveSweep {
  Collective collective = Collective::all_reduce;
  std::vector<CollectivePoint> points;
  std::optional<double> peak_busbw_gbs;  // the largest over the sizes
  std::optional<double> peak_ratio;      // peak_busbw / the links' peak
};

struct CollectiveReport {
  bool measured = false;
  std::string why_not;  // when not measured: no NCCL, no GPU, a failed call
  std::string mode;     // "one process, N GPUs" or "one rank per process (torchrun)"
  int ranks = 0;
  std::vector<int> devices;  // this process's CUDA devices
  std::string nccl_version;
  std::string nvls;  // NCCL_NVLS_ENABLE as NCCL saw it
  std::uint64_t max_bytes = 0;
  std::string max_bytes_note;  // why the sweep stops below the requested maximum
  std::vector<GpuLinks> links;
  std::vector<GpuPair> pairs;
  std::optional<LinkPeak> peak;
  std::vector<CollectiveSweep> sweeps;
  std::string note;  // e.g. that one GPU gives no bus bandwidth
};

// Below this fraction of the links' peak the collective_bandwidth_low finding is drawn.
inline constexpr double kCollectiveLowRatio = 0.5;

// The note for a one-rank communicator: what it measured and what it cannot.
std::string one_rank_note();

// Runs the sweep: every visible GPU in this process (one communicator each, ncclCommInitAll),
// or, under a launcher with several ranks, this process's GPU (local rank) in a communicator of
// the launcher's world, bootstrapped through NCCL_COMM_ID. Fails only for unusable options;
// what the machine lacks is a report with measured = false.
Result<CollectiveReport> measure_collectives(const CollectiveOptions& options, const RankEnv& rank);

}  // namespace dlprobe::doctor
