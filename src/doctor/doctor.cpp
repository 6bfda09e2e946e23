#include "dlprobe/doctor/doctor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

#include "dlprobe/core/build_info.h"
#include "dlprobe/core/launcher.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/device/availability.h"

#if DLPROBE_WITH_CUDA
#include "gpu_cuda.h"
#endif

namespace dlprobe::doctor {

std::string normalize_pci_bus_id(std::string_view id) {
  std::string s;
  for (char c : id) s += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto colon = s.find(':');
  // domain:bus:device.function; NVML pads the domain to 8 hex digits, others to 4.
  if (colon != std::string::npos && s.find(':', colon + 1) != std::string::npos && colon < 8)
    s.insert(0, 8 - colon, '0');
  return s;
}

std::optional<int> lowest_cuda_architecture(std::string_view archs) {
  std::optional<int> lowest;
  std::string item;
  std::istringstream in{std::string(archs)};
  while (std::getline(in, item, ';')) {
    int value = 0;
    std::size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) {
      value = value * 10 + (item[digits] - '0');
      ++digits;
    }
    // "native", "all" and "all-major" name no architecture here.
    if (digits == 0) return std::nullopt;
    if (!lowest || value < *lowest) lowest = value;
  }
  return lowest;
}

std::vector<Finding> gpu_findings(const GpuReport& g, std::string_view cuda_architectures) {
  std::vector<Finding> out;
  const std::string gpu = fmt::format("GPU {} ({})", g.index, g.name);
  if (g.cc_major && g.cc_minor) {
    const int cc = *g.cc_major * 10 + *g.cc_minor;
    auto lowest = lowest_cuda_architecture(cuda_architectures);
    if (lowest && cc < *lowest) {
      out.push_back({Severity::error, "architecture_not_built",
                     fmt::format("{} is sm_{} but dlprobe's kernels were built for {} and cannot "
                                 "run on it",
                                 gpu, cc, cuda_architectures),
                     fmt::format("rebuild with -DCMAKE_CUDA_ARCHITECTURES=\"{}-real;{}\"", cc,
                                 cuda_architectures)});
    }
  }
  if (!g.other_processes.empty()) {
    std::uint64_t total = 0;
    bool all_known = true;
    std::string pids;
    for (const auto& p : g.other_processes) {
      if (p.used_bytes)
        total += *p.used_bytes;
      else
        all_known = false;
      pids += fmt::format("{}{}", pids.empty() ? "" : ", ", p.pid);
    }
    out.push_back(
        {Severity::warning, "other_processes",
         fmt::format("{} other process{} hold{} {}{} on {} (pid {}): they compete for memory and "
                     "compute, so measurements are lower and noisier",
                     g.other_processes.size(), g.other_processes.size() == 1 ? "" : "es",
                     g.other_processes.size() == 1 ? "s" : "", all_known ? "" : "at least ",
                     format_size(total), gpu, pids),
         "stop them or pick another GPU (CUDA_VISIBLE_DEVICES); nvidia-smi "
         "--query-compute-apps=pid,process_name,used_memory --format=csv lists them"});
  }
  if (g.throttled) {
    std::string names;
    for (const auto& n : g.clock_event_names)
      names += fmt::format("{}{}", names.empty() ? "" : ", ", n);
    out.push_back(
        {Severity::warning, "clocks_throttled",
         fmt::format("{} runs below its clocks right now ({})", gpu, names),
         "check power limit and cooling: nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE"});
  }
  if (g.power_limit_w && g.power_default_limit_w &&
      *g.power_limit_w < *g.power_default_limit_w - 1) {
    out.push_back(
        {Severity::warning, "power_capped",
         fmt::format("{} is power-capped at {:.0f} W (board default {:.0f} W): "
                     "throughput under load is lower than the GPU can do",
                     gpu, *g.power_limit_w, *g.power_default_limit_w),
         fmt::format("sudo nvidia-smi -i {} -pl {:.0f}", g.index, *g.power_default_limit_w)});
  }
  if (g.persistence_enabled == false) {
    out.push_back({Severity::info, "persistence_off",
                   fmt::format("persistence mode is off on {}: the driver tears the GPU state "
                               "down when no process uses it, so every first CUDA call pays "
                               "seconds of initialisation",
                               gpu),
                   "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)"});
  }
  if (g.ecc_enabled == false) {
    out.push_back({Severity::info, "ecc_off",
                   fmt::format("ECC is off on {}: memory errors go undetected (on GDDR boards this "
                               "also gives a little more memory and bandwidth than with it on)",
                               gpu),
                   fmt::format("to enable: sudo nvidia-smi -i {} -e 1, then reboot", g.index)});
  }
  if (g.mig_enabled == true) {
    out.push_back({Severity::warning, "mig_enabled",
                   fmt::format("MIG is enabled on {}: CUDA sees MIG instances with a fraction of "
                               "the SMs and memory, and ceilings are per instance",
                               gpu),
                   fmt::format("to use the whole GPU: sudo nvidia-smi -i {} -mig 0 (with no "
                               "process on it)",
                               g.index)});
  }
  if (!g.nvml) {
    out.push_back({Severity::info, "no_nvml_for_gpu",
                   fmt::format("NVML has no data for {}: its state (clocks, power, processes) is "
                               "unknown and `dlprobe monitor` cannot sample it",
                               gpu),
                   "run where libnvidia-ml.so.1 from the driver is loadable"});
  }
  return out;
}

std::vector<Finding> ceiling_findings(const Ceilings& c) {
  std::vector<Finding> out;
  for (const auto& g : c.gemm) {
    if (!g.measured) continue;
    // Tuned libraries reach 60-90% of the tensor-core peak at these sizes; far below points at
    // clocks, power or another tenant rather than the GEMM.
    if (g.theoretical_tflops && g.tflops < 0.4 * *g.theoretical_tflops) {
      out.push_back({Severity::warning, "gemm_ceiling_low",
                     fmt::format("{} GEMM reached {:.1f} TFLOP/s, {:.0f}% of the theoretical "
                                 "{:.1f}",
                                 gemm_dtype_name(g.dtype), g.tflops,
                                 100 * g.tflops / *g.theoretical_tflops, *g.theoretical_tflops),
                     "look at the clock, power and process findings above; rerun on an idle GPU"});
    }
  }
  for (const auto& b : c.bandwidth) {
    if (b.measured && b.theoretical_gbs && b.gbs < 0.5 * *b.theoretical_gbs) {
      out.push_back(
          {Severity::warning, "bandwidth_ceiling_low",
           fmt::format("{} reached {:.0f} GB/s, {:.0f}% of the theoretical {:.0f} GB/s", b.name,
                       b.gbs, 100 * b.gbs / *b.theoretical_gbs, *b.theoretical_gbs),
           b.name.find("h2d") != std::string::npos || b.name.find("d2h") != std::string::npos
               ? "check the PCIe link (nvidia-smi -q -d PCI) and the NUMA node this "
                 "process runs on (numactl --cpunodebind)"
               : "look at the clock and process findings; rerun on an idle GPU"});
    }
  }
  return out;
}

namespace {

std::optional<TopologyLevel> topology_level(int nvml_level) {
  switch (nvml_level) {
    case 0:
      return TopologyLevel::internal;
    case 10:
      return TopologyLevel::single;
    case 20:
      return TopologyLevel::multiple;
    case 30:
      return TopologyLevel::hostbridge;
    case 40:
      return TopologyLevel::node;
    case 50:
      return TopologyLevel::system;
    default:
      return std::nullopt;
  }
}

}  // namespace

void add_links(CollectiveReport& report, const std::vector<GpuReport>& gpus,
               const std::function<std::optional<nvml::PairTopology>(int, int)>& pair,
               const std::function<std::optional<unsigned>(int)>& nvlink_active) {
  auto gpu_of = [&](int device) -> const GpuReport* {
    for (const auto& g : gpus) {
      if (g.index == device && g.cuda_visible) return &g;
    }
    return nullptr;
  };
  for (int d : report.devices) {
    GpuLinks l;
    l.device = d;
    const GpuReport* g = gpu_of(d);
    if (g != nullptr) l.pcie_peak_gbs = g->theoretical_pcie_gbs;
    if (auto active = nvlink_active(d)) {
      l.nvlink_active = static_cast<int>(*active);
      if (g != nullptr && g->cc_major && g->cc_minor) {
        if (auto per_link = nvlink_gbs_per_link(*g->cc_major, *g->cc_minor))
          l.nvlink_peak_gbs = *per_link * *active;
      }
    }
    report.links.push_back(l);
  }
  for (std::size_t i = 0; i < report.devices.size(); ++i) {
    for (std::size_t j = i + 1; j < report.devices.size(); ++j) {
      GpuPair p;
      p.a = report.devices[i];
      p.b = report.devices[j];
      if (auto t = pair(p.a, p.b)) {
        if (t->common_ancestor) p.pcie_path = topology_level(*t->common_ancestor);
        p.nvlink = t->nvlink;
        p.p2p_read = t->p2p_read;
      }
      p.link = p.nvlink == true ? "NVLink"
               : p.pcie_path    ? fmt::format("PCIe ({})", topology_level_name(*p.pcie_path))
                                : "unknown";
      report.pairs.push_back(std::move(p));
    }
  }
  report.peak = link_peak(report.links, report.pairs);
  for (auto& sweep : report.sweeps) {
    if (report.peak && sweep.peak_busbw_gbs && report.peak->gbs > 0)
      sweep.peak_ratio = *sweep.peak_busbw_gbs / report.peak->gbs;
  }
}

std::vector<Finding> collective_findings(const CollectiveReport& c) {
  std::vector<Finding> out;
  if (!c.measured) {
    out.push_back({Severity::warning, "collectives_not_measured",
                   "NCCL collectives not measured: " + c.why_not, ""});
    return out;
  }
  if (c.ranks == 1) {
    out.push_back({Severity::info, "collectives_one_gpu", c.note,
                   "run `dlprobe doctor --nccl` where several GPUs are visible, or one rank per "
                   "GPU under torchrun, mpirun or srun"});
  }
  for (const auto& s : c.sweeps) {
    // nccl-tests reaches about 80% of the links' peak at large messages on NVLink and PCIe
    // alike; below half, a link trained down, P2P off or traffic through the CPU is likelier
    // than NCCL itself.
    if (s.peak_ratio && *s.peak_ratio < kCollectiveLowRatio) {
      out.push_back(
          {Severity::warning, "collective_bandwidth_low",
           fmt::format("{} reached {:.1f} GB/s bus bandwidth, {:.0f}% of the {} peak of {:.0f} "
                       "GB/s (below {:.0f}%)",
                       collective_name(s.collective), *s.peak_busbw_gbs, 100 * *s.peak_ratio,
                       c.peak->kind, c.peak->gbs, 100 * kCollectiveLowRatio),
           "check `nvidia-smi topo -m` and `nvidia-smi nvlink -s`; rerun with NCCL_DEBUG=INFO to "
           "see the transport NCCL chose (P2P, SHM or NET)"});
    }
  }
  return out;
}

namespace {

std::optional<std::string> read_proc_driver() {
  std::ifstream in("/proc/driver/nvidia/version");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_proc_driver_version(text.str());
}

Capability capability(std::string name, bool ok, std::string why_not) {
  return {std::move(name), ok, ok ? std::string() : std::move(why_not)};
}

Capability library_capability(std::string name, const LibraryProbe& p) {
  return capability(std::move(name), p.loaded, p.detail);
}

// A GPU library is a capability only where a GPU can run it: installed beside no usable device,
// nothing it does will work, and the line says that rather than "yes".
Capability gpu_library_capability(std::string name, const LibraryProbe& p, bool gpu_usable,
                                  const std::string& why_no_gpu) {
  if (!p.loaded || gpu_usable) return library_capability(std::move(name), p);
  return capability(std::move(name), false,
                    fmt::format("no usable GPU ({}); the library is installed ({})", why_no_gpu,
                                p.version.empty() ? p.path : p.version));
}

void add_nvml_state(GpuReport& g, const nvml::Library& nvml, unsigned nvml_index) {
  auto info = nvml.device_info(nvml_index);
  if (!info) {
    log_debug("NVML device_info({}): {}", nvml_index, info.status().message());
    return;
  }
  g.nvml = true;
  if (g.name.empty()) g.name = info->name;
  if (g.uuid.empty()) g.uuid = info->uuid;
  if (g.pci_bus_id.empty()) g.pci_bus_id = normalize_pci_bus_id(info->pci_bus_id);
  if (!g.memory_total_bytes) g.memory_total_bytes = info->memory_total_bytes;
  if (!g.cc_major && info->cc_major && info->cc_minor) {
    g.cc_major = info->cc_major;
    g.cc_minor = info->cc_minor;
    g.tensor_core_dtypes = tensor_core_dtypes(*info->cc_major, *info->cc_minor);
  }
  if (!g.max_sm_clock_mhz && info->max_sm_clock_mhz) {
    g.max_sm_clock_mhz = *info->max_sm_clock_mhz;
    g.clock_source = "nvml";
  }
  if (!g.max_mem_clock_mhz && info->max_mem_clock_mhz)
    g.max_mem_clock_mhz = *info->max_mem_clock_mhz;
  g.persistence_enabled = info->persistence_enabled;
  g.ecc_enabled = info->ecc_enabled;
  g.mig_enabled = info->mig_enabled;
  g.power_limit_w = info->power_limit_w;
  g.power_default_limit_w = info->power_default_limit_w;
  g.pcie_link_gen = info->pcie_link_gen;
  g.pcie_link_width = info->pcie_link_width;

  if (auto s = nvml.sample(nvml_index)) {
    g.temperature_c = s->temperature_c;
    g.memory_used_bytes = s->mem_used_bytes;
    g.clock_event_reasons = s->clock_event_reasons;
    if (s->clock_event_reasons) {
      g.clock_event_names = nvml::clock_event_reason_names(*s->clock_event_reasons);
      g.throttled = nvml::clock_events_throttle(*s->clock_event_reasons);
    }
  }
  const auto self = static_cast<unsigned>(getpid());
  if (auto procs = nvml.processes(nvml_index)) {
    for (const auto& p : *procs) {
      if (p.pid != self) g.other_processes.push_back({p.pid, p.used_bytes});
    }
  } else {
    g.processes_why_not = procs.status().message();
  }
  for (auto [name, cap] :
       {std::pair{"per_process_memory", nvml.per_process_memory(nvml_index)},
        std::pair{"per_process_utilization", nvml.per_process_utilization(nvml_index)},
        std::pair{"energy_counter", nvml.energy_counter(nvml_index)}}) {
    g.capabilities.push_back(capability(name, cap.available, cap.why_not));
  }
}

void add_theoretical(GpuReport& g) {
  if (g.memory_bus_width_bits && g.max_mem_clock_mhz && *g.memory_bus_width_bits > 0)
    g.theoretical_memory_gbs =
        theoretical_memory_bandwidth_gbs(*g.memory_bus_width_bits, *g.max_mem_clock_mhz);
  if (g.cc_major && g.cc_minor && g.sm_count && g.max_sm_clock_mhz) {
    for (GemmDtype d : kAllGemmDtypes) {
      if (auto t = theoretical_gemm_tflops(*g.cc_major, *g.cc_minor, *g.sm_count,
                                           *g.max_sm_clock_mhz, d))
        g.theoretical_tflops.emplace_back(d, *t);
    }
  }
  if (g.pcie_link_gen && g.pcie_link_width)
    g.theoretical_pcie_gbs = theoretical_pcie_gbs(*g.pcie_link_gen, *g.pcie_link_width);
}

}  // namespace

Result<Report> run_doctor(const DoctorOptions& options) {
  Report r;
  const auto& build = build_info();
  r.dlprobe_version = build.version;
  r.git_hash = build.git_hash;
  r.with_cuda = build.with_cuda;
  r.with_onednn = build.with_onednn;
  r.cuda_architectures = build.cuda_architectures;

  if (auto host = read_host_info()) {
    r.host = std::move(host).value();
  } else {
    r.findings.push_back({Severity::warning, "host_info", host.status().message(), ""});
  }
  r.versions = probe_versions();

  auto nvml = nvml::Library::open();
  if (nvml) {
    r.versions.driver = nvml.value()->driver_version();
    if (r.versions.driver) r.versions.driver_source = "NVML";
    if (!r.versions.cuda_driver_api)
      r.versions.cuda_driver_api = nvml.value()->cuda_driver_version();
  }
  if (!r.versions.driver) {
    r.versions.driver = read_proc_driver();
    if (r.versions.driver) r.versions.driver_source = "/proc/driver/nvidia/version";
  }

  // The GPUs: the CUDA runtime's list (its indices are what CUDA programs use), each matched to its
  // NVML device by PCI bus id, since the two number devices differently. When CUDA sees none (no
  // CUDA build, or a runtime the driver cannot serve) NVML's list is reported so the GPUs and their
  // state still show.
  std::string cuda_why_none = "dlprobe was built without CUDA (DLPROBE_WITH_CUDA=OFF)";
#if DLPROBE_WITH_CUDA
  CudaGpus cuda = query_cuda_gpus();
  r.gpus = std::move(cuda.gpus);
  cuda_why_none = cuda.why_none;
#endif
  // CUDA sees none: what is missing in the words bench and memory use (no NVIDIA GPU on the bus,
  // no driver, no CUDA in this build, a driver too old). Without a driver the runtime itself
  // blames an "insufficient driver".
  if (r.gpus.empty()) cuda_why_none = device::explain_gpus(device::gather_gpu_facts()).why_none;
  const std::size_t cuda_gpus = r.gpus.size();
  if (nvml) {
    const nvml::Library& lib = *nvml.value();
    const unsigned count = lib.device_count().value_or(0);
    for (unsigned i = 0; i < count; ++i) {
      if (cuda_gpus == 0) {
        GpuReport g;
        g.index = static_cast<int>(i);
        g.cuda_visible = false;
        add_nvml_state(g, lib, i);
        r.gpus.push_back(std::move(g));
        continue;
      }
      auto info = lib.device_info(i);
      if (!info) continue;
      const std::string bus = normalize_pci_bus_id(info->pci_bus_id);
      for (auto& g : r.gpus) {
        if (normalize_pci_bus_id(g.pci_bus_id) == bus) add_nvml_state(g, lib, i);
      }
    }
  }
  for (auto& g : r.gpus) add_theoretical(g);
  r.gpu_found = !r.gpus.empty();
  if (!r.gpu_found) r.no_gpu_reason = cuda_why_none;

  // What will work here.
  r.capabilities.push_back(capability("gpu", r.gpu_found, r.no_gpu_reason));
  r.capabilities.push_back(capability("cuda", cuda_gpus > 0, cuda_why_none));
  r.capabilities.push_back(capability("nvml", nvml.has_value(), nvml.status().message()));
  const bool gpu_usable = cuda_gpus > 0;
  for (const auto& [name, probe] :
       {std::pair<const char*, const LibraryProbe*>{"cupti", &r.versions.cupti},
        {"cudnn", &r.versions.cudnn},
        {"cublaslt", &r.versions.cublaslt},
        {"nccl", &r.versions.nccl}}) {
    r.capabilities.push_back(gpu_library_capability(name, *probe, gpu_usable, cuda_why_none));
  }
  r.capabilities.push_back(library_capability("onednn", r.versions.onednn));

  for (auto& f : compatibility_findings(r.versions)) r.findings.push_back(std::move(f));
  if (!r.gpu_found) {
    r.findings.push_back(
        {Severity::info, "no_gpu",
         fmt::format("no GPU found ({}). What still works: this report of the host and the "
                     "libraries{}; GPU measurements, `dlprobe monitor` and the ceilings need a GPU",
                     r.no_gpu_reason, r.with_onednn ? ", and dlprobe's CPU backend (oneDNN)" : ""),
         ""});
  } else if (cuda_gpus == 0) {
    r.findings.push_back(
        {Severity::error, "cuda_unusable",
         fmt::format("NVML sees {} GPU(s) but CUDA cannot use them: {}", r.gpus.size(),
                     cuda_why_none),
         r.with_cuda
             ? "see the driver/runtime findings; `nvidia-smi` shows the driver's CUDA version"
             : "rebuild dlprobe with the CUDA toolkit (-DDLPROBE_WITH_CUDA=ON)"});
  }
  if (r.gpu_found && !nvml) {
    r.findings.push_back({Severity::warning, "nvml_unavailable",
                          fmt::format("NVML is unavailable ({}): GPU state, other processes and "
                                      "`dlprobe monitor` are not available",
                                      nvml.status().message()),
                          "make the driver's libnvidia-ml.so.1 loadable (in a container: the "
                          "NVIDIA Container Toolkit's utility capability)"});
  }
  for (const auto& g : r.gpus) {
    for (auto& f : gpu_findings(g, r.cuda_architectures)) r.findings.push_back(std::move(f));
  }

  // Under a launcher every rank would measure the same GPU at once.
  std::optional<RankEnv> rank;
  if (options.collectives) {
    auto env = read_rank_env(process_env());
    if (!env) return env.status();
    rank = *env;
  }

  // Ceilings last: they load the GPU, and the state above should be what it was before.
  if (!options.ceilings) {
    r.ceilings_note = "skipped (--no-ceilings)";
  } else if (rank && rank->world_size > 1) {
    r.ceilings_note = fmt::format(
        "skipped: one rank of {} under {} (--nccl); run doctor without the launcher for them",
        rank->world_size, launcher_name(rank->launcher));
  } else if (!r.with_cuda) {
    r.ceilings_note = "not measured: dlprobe was built without CUDA";
  } else if (cuda_gpus == 0) {
    r.ceilings_note =
        r.gpu_found ? "not measured: CUDA cannot use the GPU" : "not measured: no GPU";
  } else {
    const int device = options.ceilings_device;
    if (device < 0 || device >= static_cast<int>(cuda_gpus))
      return invalid_argument(fmt::format("--device {}: this machine has {} CUDA GPU(s) (0-{})",
                                          device, cuda_gpus, cuda_gpus - 1));
    auto ceilings = measure_ceilings(device, options.ceiling_options);
    if (!ceilings) {
      r.ceilings_note = "failed: " + ceilings.status().message();
      r.findings.push_back({Severity::error, "ceilings_failed", r.ceilings_note, ""});
    } else {
      for (auto& f : ceiling_findings(*ceilings)) r.findings.push_back(std::move(f));
      r.ceilings = std::move(ceilings).value();
    }
  }
  r.capabilities.push_back(capability("ceilings", r.ceilings.has_value(), r.ceilings_note));

  if (rank) {
    // Before NCCL's first call: NVLink multicast stays off unless the user asked for it.
    disable_nvls_in_process();
    CollectiveReport c;
    if (cuda_gpus == 0) {
      c.why_not = r.gpu_found ? "CUDA cannot use the GPU" : "no GPU";
    } else if (!r.versions.nccl.loaded) {
      c.why_not = "NCCL is not loadable (" + r.versions.nccl.detail + ")";
    } else {
      auto measured = measure_collectives(options.collective_options, *rank);
      if (!measured) return measured.status();
      c = std::move(measured).value();
    }
    if (c.measured) {
      // CUDA device -> NVML index, by PCI bus id as above.
      std::map<int, unsigned> nvml_index;
      if (nvml) {
        const nvml::Library& lib = *nvml.value();
        const unsigned count = lib.device_count().value_or(0);
        for (unsigned i = 0; i < count; ++i) {
          auto info = lib.device_info(i);
          if (!info) continue;
          for (const auto& g : r.gpus) {
            if (g.cuda_visible &&
                normalize_pci_bus_id(g.pci_bus_id) == normalize_pci_bus_id(info->pci_bus_id))
              nvml_index[g.index] = i;
          }
        }
      }
      auto pair = [&](int a, int b) -> std::optional<nvml::PairTopology> {
        if (!nvml || !nvml_index.count(a) || !nvml_index.count(b)) return std::nullopt;
        auto t = nvml.value()->pair_topology(nvml_index[a], nvml_index[b]);
        if (!t) return std::nullopt;
        return *t;
      };
      auto active = [&](int d) -> std::optional<unsigned> {
        if (!nvml || !nvml_index.count(d)) return std::nullopt;
        auto n = nvml.value()->nvlink_active_links(nvml_index[d]);
        if (!n) return std::nullopt;
        return *n;
      };
      add_links(c, r.gpus, pair, active);
    }
    for (auto& f : collective_findings(c)) r.findings.push_back(std::move(f));
    r.capabilities.push_back(capability("nccl_collectives", c.measured, c.why_not));
    r.collectives = std::move(c);
  }
  return r;
}

}  // namespace dlprobe::doctor
