// `dlprobe doctor`: what this machine is, which software stack it runs, whether the pieces fit,
// which measurements will work here, and the GPU's measured ceilings; every problem found comes
// with its fix. The report is plain data, rendered as text or as JSON (schema "dlprobe.doctor/1",
// documented in docs/doctor.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/doctor/ceilings.h"
#include "dlprobe/doctor/collectives.h"
#include "dlprobe/doctor/cpu_info.h"
#include "dlprobe/doctor/versions.h"
#include "dlprobe/monitor/nvml.h"

namespace dlprobe::doctor {

inline constexpr std::string_view kSchema = "dlprobe.doctor/1";

struct Capability {
  std::string name;  // "nvml", "per_process_memory", "cupti", ...
  bool available = false;
  std::string why_not;
};

struct OtherProcess {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_bytes;
};

struct GpuReport {
  int index = 0;             // CUDA device index, or NVML's when CUDA cannot see the GPU
  bool cuda_visible = true;  // false: known from NVML only
  std::string name;
  std::string uuid;
  std::string pci_bus_id;
  // From the CUDA runtime.
  std::optional<int> cc_major, cc_minor;
  std::optional<int> sm_count;
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<int> l2_bytes;
  std::optional<int> memory_bus_width_bits;
  std::optional<double> max_sm_clock_mhz;
  std::optional<double> max_mem_clock_mhz;
  std::string clock_source;  // "cuda" or "nvml"
  std::vector<std::string> tensor_core_dtypes;
  // Theoretical peaks from the properties above (gpu_arch.h).
  std::optional<double> theoretical_memory_gbs;
  std::vector<std::pair<GemmDtype, double>> theoretical_tflops;
  // At the link's current generation and width: links train down when idle, so this can be below
  // what the link reaches under load.
  std::optional<double> theoretical_pcie_gbs;
  // From NVML, at the time doctor ran.
  bool nvml = false;  // false: NVML did not know this GPU and the fields below are unknown
  std::optional<bool> persistence_enabled;
  std::optional<bool> ecc_enabled;
  std::optional<bool> mig_enabled;
  std::optional<double> power_limit_w;
  std::optional<double> power_default_limit_w;
  std::optional<unsigned> pcie_link_gen;
  std::optional<unsigned> pcie_link_width;
  std::optional<unsigned> temperature_c;
  std::optional<std::uint64_t> memory_used_bytes;
  std::optional<std::uint64_t> clock_event_reasons;
  std::vector<std::string> clock_event_names;
  bool throttled = false;
  std::vector<OtherProcess> other_processes;  // this process left out
  std::string processes_why_not;              // when the list could not be read
  std::vector<Capability> capabilities;       // per-GPU NVML measurements
};

struct Report {
  std::string dlprobe_version;
  std::string git_hash;
  bool with_cuda = false;
  bool with_onednn = false;
  std::string cuda_architectures;
  HostInfo host;
  StackVersions versions;
  bool gpu_found = false;     // CUDA or NVML sees a GPU
  std::string no_gpu_reason;  // when gpu_found is false
  std::vector<GpuReport> gpus;
  std::vector<Capability> capabilities;
  std::optional<Ceilings> ceilings;
  std::string ceilings_note;                    // why there are none, or a caveat
  std::optional<CollectiveReport> collectives;  // with --nccl only
  std::vector<Finding> findings;
};

struct DoctorOptions {
  bool ceilings = true;  // measured only when a GPU is present
  int ceilings_device = 0;
  CeilingOptions ceiling_options;
  bool collectives = false;  // the NCCL sweep (--nccl)
  CollectiveOptions collective_options;
};

// Gathers the report on this machine. Fails only when the options are unusable (e.g. a ceilings
// device that does not exist); everything the machine lacks is part of the report.
Result<Report> run_doctor(const DoctorOptions& options);

// ---- pure parts, exposed for tests ----

// Findings about one GPU from its NVML state (other processes, throttling, power cap, persistence,
// ECC, MIG) and whether dlprobe's kernels were built for its architecture.
std::vector<Finding> gpu_findings(const GpuReport& gpu, std::string_view cuda_architectures);
// Findings about the ceilings themselves (below a sane fraction of theoretical, not measured).
std::vector<Finding> ceiling_findings(const Ceilings& ceilings);
// Links between the GPUs of a collectives report from the GPUs' figures and NVML's topology
// (`pair` gives NVML's answer for two CUDA devices); fills links, pairs and peak.
void add_links(CollectiveReport& report, const std::vector<GpuReport>& gpus,
               const std::function<std::optional<nvml::PairTopology>(int, int)>& pair,
               const std::function<std::optional<unsigned>(int)>& nvlink_active);
// Findings about the NCCL sweep: one GPU, the bus bandwidth far below the links' peak.
std::vector<Finding> collective_findings(const CollectiveReport& report);
// "0000:19:00.0", "00000000:19:00.0" and lower case all become "00000000:19:00.0".
std::string normalize_pci_bus_id(std::string_view id);
// "90-real;90-virtual" -> the lowest real or virtual architecture (90); nullopt when unparsable.
std::optional<int> lowest_cuda_architecture(std::string_view cuda_architectures);

std::string render_text(const Report& report);
std::string render_json(const Report& report);  // pretty-printed, ends with a newline

}  // namespace dlprobe::doctor
