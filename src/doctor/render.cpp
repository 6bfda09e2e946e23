// The two renderings of a doctor report. The JSON structure is the stable one (docs/doctor.md); a
// value that is unknown is null, never 0.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "dlprobe/core/json_optional.h"
#include "dlprobe/core/units.h"
#include "dlprobe/doctor/doctor.h"

namespace dlprobe::doctor {

namespace {

using json = nlohmann::ordered_json;

json library_json(const LibraryProbe& p) {
  return {{"loaded", p.loaded},
          {"version", p.loaded ? json(p.version) : json(nullptr)},
          {"built_with", p.built_with.empty() ? json(nullptr) : json(p.built_with)},
          {"path", p.path.empty() ? json(nullptr) : json(p.path)},
          {"detail", p.detail.empty() ? json(nullptr) : json(p.detail)}};
}

json capabilities_json(const std::vector<Capability>& caps) {
  json out = json::object();
  for (const auto& c : caps) {
    out[c.name] = {{"available", c.available},
                   {"why_not", c.available ? json(nullptr) : json(c.why_not)}};
  }
  return out;
}

std::string cuda_text(int v) {
  return v > 0 ? decode_cuda_version(v).str() : std::string();
}

json cuda_version_json(int v) {
  return v > 0 ? json(cuda_text(v)) : json(nullptr);
}

json gpu_json(const GpuReport& g) {
  json theoretical_tflops = json::object();
  for (const auto& [dtype, tflops] : g.theoretical_tflops)
    theoretical_tflops[std::string(gemm_dtype_name(dtype))] = tflops;
  json processes = json::array();
  for (const auto& p : g.other_processes)
    processes.push_back({{"pid", p.pid}, {"used_bytes", p.used_bytes}});
  return {
      {"index", g.index},
      {"name", g.name},
      {"uuid", g.uuid.empty() ? json(nullptr) : json(g.uuid)},
      {"pci_bus_id", g.pci_bus_id.empty() ? json(nullptr) : json(g.pci_bus_id)},
      {"compute_capability", g.cc_major && g.cc_minor
                                 ? json(fmt::format("{}.{}", *g.cc_major, *g.cc_minor))
                                 : json(nullptr)},
      {"sm_count", g.sm_count},
      {"memory_total_bytes", g.memory_total_bytes},
      {"l2_bytes", g.l2_bytes},
      {"memory_bus_width_bits", g.memory_bus_width_bits},
      {"max_sm_clock_mhz", g.max_sm_clock_mhz},
      {"max_mem_clock_mhz", g.max_mem_clock_mhz},
      {"clock_source", g.clock_source.empty() ? json(nullptr) : json(g.clock_source)},
      {"tensor_core_dtypes", g.tensor_core_dtypes},
      {"theoretical",
       {{"memory_bandwidth_gbs", g.theoretical_memory_gbs},
        {"gemm_tflops", theoretical_tflops},
        {"pcie_gbs", g.theoretical_pcie_gbs}}},
      {"nvml", g.nvml},
      {"persistence_mode", g.persistence_enabled},
      {"ecc", g.ecc_enabled},
      {"mig", g.mig_enabled},
      {"power_limit_w", g.power_limit_w},
      {"power_default_limit_w", g.power_default_limit_w},
      {"pcie_link_gen", g.pcie_link_gen},
      {"pcie_link_width", g.pcie_link_width},
      {"temperature_c", g.temperature_c},
      {"memory_used_bytes", g.memory_used_bytes},
      {"clock_event_reasons", g.clock_event_reasons ? json(g.clock_event_names) : json(nullptr)},
      {"throttled", g.clock_event_reasons ? json(g.throttled) : json(nullptr)},
      {"other_processes", g.nvml && g.processes_why_not.empty() ? processes : json(nullptr)},
      {"processes_why_not",
       g.processes_why_not.empty() ? json(nullptr) : json(g.processes_why_not)},
      {"capabilities", capabilities_json(g.capabilities)},
  };
}

json ceilings_json(const Ceilings& c) {
  json gemm = json::array();
  for (const auto& g : c.gemm) {
    gemm.push_back({
        {"dtype", gemm_dtype_name(g.dtype)},
        {"m", g.m},
        {"n", g.n},
        {"k", g.k},
        {"layout", g.layout},
        {"measured", g.measured},
        {"tflops", g.measured ? json(g.tflops) : json(nullptr)},
        {"tflops_min", g.measured ? json(g.tflops_min) : json(nullptr)},
        {"tflops_max", g.measured ? json(g.tflops_max) : json(nullptr)},
        {"theoretical_tflops", g.theoretical_tflops},
        {"fraction_of_theoretical", g.measured && g.theoretical_tflops
                                        ? json(g.tflops / *g.theoretical_tflops)
                                        : json(nullptr)},
        {"check_error", g.check_error},
        {"check_tolerance", gemm_check_tolerance(g.dtype)},
        {"why_not", g.why_not.empty() ? json(nullptr) : json(g.why_not)},
    });
  }
  json bandwidth = json::array();
  for (const auto& b : c.bandwidth) {
    bandwidth.push_back({
        {"name", b.name},
        {"measured", b.measured},
        {"bytes", b.measured ? json(b.bytes) : json(nullptr)},
        {"gbs", b.measured ? json(b.gbs) : json(nullptr)},
        {"theoretical_gbs", b.theoretical_gbs},
        {"fraction_of_theoretical",
         b.measured && b.theoretical_gbs ? json(b.gbs / *b.theoretical_gbs) : json(nullptr)},
        {"why_not", b.why_not.empty() ? json(nullptr) : json(b.why_not)},
    });
  }
  return {{"device", c.device},
          {"device_name", c.device_name},
          {"sm_clock_mhz", c.sm_clock_mhz},
          {"gemm", gemm},
          {"bandwidth", bandwidth}};
}

json collectives_json(const CollectiveReport& c) {
  json links = json::array();
  for (const auto& l : c.links) {
    links.push_back({{"device", l.device},
                     {"nvlink_active", l.nvlink_active},
                     {"nvlink_peak_gbs", l.nvlink_peak_gbs},
                     {"pcie_peak_gbs", l.pcie_peak_gbs}});
  }
  json pairs = json::array();
  for (const auto& p : c.pairs) {
    pairs.push_back(
        {{"a", p.a},
         {"b", p.b},
         {"link", p.link},
         {"pcie_path", p.pcie_path ? json(topology_level_name(*p.pcie_path)) : json(nullptr)},
         {"nvlink", p.nvlink},
         {"p2p_read", p.p2p_read}});
  }
  json sweeps = json::array();
  for (const auto& s : c.sweeps) {
    json points = json::array();
    for (const auto& p : s.points) {
      points.push_back({{"bytes", p.bytes},
                        {"time_us", p.time_us},
                        {"algbw_gbs", p.algbw_gbs},
                        {"busbw_gbs", p.busbw_gbs}});
    }
    sweeps.push_back({{"collective", collective_name(s.collective)},
                      {"peak_busbw_gbs", s.peak_busbw_gbs},
                      {"peak_ratio", s.peak_ratio},
                      {"points", points}});
  }
  auto text_or_null = [](const std::string& t) { return t.empty() ? json(nullptr) : json(t); };
  // Null where unknown, not 0 (the schema's rule for what does not apply): the ranks are known
  // once the communicator formed, even where the collectives then did not run.
  auto count_or_null = [](auto n) { return n > 0 ? json(n) : json(nullptr); };
  return {
      {"measured", c.measured},
      {"why_not", text_or_null(c.why_not)},
      {"mode", text_or_null(c.mode)},
      {"ranks", count_or_null(c.ranks)},
      {"devices", c.devices},
      {"nccl_version", text_or_null(c.nccl_version)},
      {"nvls", text_or_null(c.nvls)},
      {"max_bytes", count_or_null(c.max_bytes)},
      {"max_bytes_note", text_or_null(c.max_bytes_note)},
      {"links", links},
      {"pairs", pairs},
      {"link_peak", c.peak ? json{{"kind", c.peak->kind}, {"gbs", c.peak->gbs}} : json(nullptr)},
      {"sweeps", sweeps},
      {"note", text_or_null(c.note)}};
}

void collectives_text(std::string& out, const CollectiveReport& c) {
  out += "NCCL collectives\n";
  if (!c.measured) {
    out += fmt::format("  not measured: {}\n\n", c.why_not);
    return;
  }
  out += fmt::format("  {}; NCCL {}; NCCL_NVLS_ENABLE={}\n", c.mode, c.nccl_version, c.nvls);
  for (const auto& p : c.pairs) out += fmt::format("  GPU {} <-> GPU {}: {}\n", p.a, p.b, p.link);
  if (c.peak)
    out += fmt::format("  link peak per GPU: {:.0f} GB/s ({})\n", c.peak->gbs, c.peak->kind);
  if (!c.max_bytes_note.empty()) out += fmt::format("  {}\n", c.max_bytes_note);
  if (!c.note.empty()) out += fmt::format("  {}\n", c.note);
  for (const auto& s : c.sweeps) {
    out += fmt::format("  {}\n", collective_name(s.collective));
    out += fmt::format("    {:>10} {:>12} {:>12} {:>12}\n", "size", "time us", "algbw GB/s",
                       "busbw GB/s");
    for (const auto& p : s.points) {
      out += fmt::format("    {:>10} {:12.1f} {:12.2f} {:>12}\n", format_size(p.bytes), p.time_us,
                         p.algbw_gbs,
                         p.busbw_gbs ? fmt::format("{:.2f}", *p.busbw_gbs) : std::string("-"));
    }
    if (s.peak_busbw_gbs) {
      out += fmt::format("    peak bus bandwidth {:.1f} GB/s", *s.peak_busbw_gbs);
      if (s.peak_ratio) out += fmt::format(", {:.0f}% of the link peak", 100 * *s.peak_ratio);
      out += "\n";
    }
  }
  out += "\n";
}

}  // namespace

std::string render_json(const Report& r) {
  const auto& v = r.versions;
  json isa = json::object();
  for (const auto& [name, present] : r.host.cpu.isa) isa[name] = present;
  json findings = json::array();
  for (const auto& f : r.findings) {
    findings.push_back({{"severity", severity_name(f.severity)},
                        {"id", f.id},
                        {"message", f.message},
                        {"fix", f.fix.empty() ? json(nullptr) : json(f.fix)}});
  }
  json gpus = json::array();
  for (const auto& g : r.gpus) gpus.push_back(gpu_json(g));
  json doc = {
      {"schema", kSchema},
      {"dlprobe",
       {{"version", r.dlprobe_version},
        {"git_hash", r.git_hash},
        {"with_cuda", r.with_cuda},
        {"with_onednn", r.with_onednn},
        {"cuda_architectures", r.cuda_architectures}}},
      {"host",
       {{"hostname", r.host.hostname},
        {"os", r.host.os},
        {"machine", r.host.machine},
        {"cpu",
         {{"model", r.host.cpu.model},
          {"sockets", r.host.cpu.sockets},
          {"cores", r.host.cpu.cores},
          {"threads", r.host.cpu.threads},
          {"isa", isa}}},
        {"memory_total_bytes", r.host.memory_total_bytes}}},
      {"versions",
       {{"driver", v.driver},
        {"driver_source", v.driver ? json(v.driver_source) : json(nullptr)},
        {"cuda_driver_api", v.cuda_driver_api && *v.cuda_driver_api > 0
                                ? json(cuda_text(*v.cuda_driver_api))
                                : json(nullptr)},
        {"cuda_runtime",
         {{"built_with", cuda_version_json(v.cuda_runtime_built)},
          {"loaded", cuda_version_json(v.cuda_runtime_loaded)},
          {"linkage", v.cuda_runtime_built > 0 ? json("static") : json(nullptr)}}},
        {"cudnn", library_json(v.cudnn)},
        {"cudnn_cuda_version", v.cudnn_cudart_version
                                   ? json(cuda_text(static_cast<int>(*v.cudnn_cudart_version)))
                                   : json(nullptr)},
        {"cublas", library_json(v.cublas)},
        {"cublaslt", library_json(v.cublaslt)},
        {"nccl", library_json(v.nccl)},
        {"cupti", library_json(v.cupti)},
        {"onednn", library_json(v.onednn)}}},
      {"gpu_found", r.gpu_found},
      {"no_gpu_reason", r.gpu_found ? json(nullptr) : json(r.no_gpu_reason)},
      {"gpus", gpus},
      {"capabilities", capabilities_json(r.capabilities)},
      {"ceilings", r.ceilings ? ceilings_json(*r.ceilings) : json(nullptr)},
      {"ceilings_note", r.ceilings_note.empty() ? json(nullptr) : json(r.ceilings_note)},
      {"collectives", r.collectives ? collectives_json(*r.collectives) : json(nullptr)},
      {"findings", findings},
  };
  return doc.dump(2) + "\n";
}

namespace {

template <class T>
std::string or_unknown(const std::optional<T>& v) {
  return v ? fmt::format("{}", *v) : std::string("unknown");
}

std::string yes_no(const std::optional<bool>& v, std::string_view yes = "on",
                   std::string_view no = "off") {
  return v ? std::string(*v ? yes : no) : std::string("unknown");
}

void library_line(std::string& out, const LibraryProbe& p) {
  if (p.loaded) {
    out += fmt::format("  {:<20} {}", p.name, p.version);
    if (!p.built_with.empty()) out += fmt::format(" (built with {})", p.built_with);
    if (!p.path.empty()) out += fmt::format("  {}", p.path);
    out += "\n";
  } else {
    out += fmt::format("  {:<20} not loaded: {}\n", p.name, p.detail);
  }
}

}  // namespace

std::string render_text(const Report& r) {
  std::string out;
  const auto& v = r.versions;
  out += fmt::format("dlprobe {} ({}), CUDA backend {}, oneDNN backend {}\n\n", r.dlprobe_version,
                     r.git_hash, r.with_cuda ? "on" : "off", r.with_onednn ? "on" : "off");

  out += "Host\n";
  out += fmt::format("  {} ({}, {})\n", r.host.hostname, r.host.os, r.host.machine);
  out += fmt::format("  CPU     {}: {} socket(s), {} cores, {} threads\n", r.host.cpu.model,
                     r.host.cpu.sockets, r.host.cpu.cores, r.host.cpu.threads);
  std::string have, lack;
  for (const auto& [name, present] : r.host.cpu.isa) (present ? have : lack) += " " + name;
  if (!r.host.cpu.isa.empty()) {
    out += fmt::format("  ISA     has:{}\n", have.empty() ? " none of the listed" : have);
    if (!lack.empty()) out += fmt::format("          lacks:{}\n", lack);
  }
  out += fmt::format("  Memory  {}\n\n", r.host.memory_total_bytes
                                             ? format_size(*r.host.memory_total_bytes)
                                             : std::string("unknown"));

  out += "Versions\n";
  out += fmt::format("  {:<20} {}\n", "driver",
                     v.driver ? fmt::format("{} (from {})", *v.driver, v.driver_source)
                              : std::string("not found"));
  out += fmt::format("  {:<20} {}\n", "CUDA driver API",
                     !v.cuda_driver_api        ? std::string("unknown")
                     : *v.cuda_driver_api == 0 ? std::string("none (no driver)")
                                               : cuda_text(*v.cuda_driver_api));
  if (v.cuda_runtime_built > 0) {
    out += fmt::format("  {:<20} {} (built with {}, linked statically)\n", "CUDA runtime",
                       cuda_text(v.cuda_runtime_loaded), cuda_text(v.cuda_runtime_built));
  } else {
    out += fmt::format("  {:<20} none (built without CUDA)\n", "CUDA runtime");
  }
  library_line(out, v.cudnn);
  if (v.cudnn_cudart_version)
    out += fmt::format("  {:<20} CUDA {}\n", "cuDNN built for",
                       cuda_text(static_cast<int>(*v.cudnn_cudart_version)));
  library_line(out, v.cublas);
  library_line(out, v.cublaslt);
  library_line(out, v.nccl);
  library_line(out, v.cupti);
  library_line(out, v.onednn);
  out += "\n";

  out += "GPUs\n";
  if (!r.gpu_found) out += fmt::format("  no GPU found: {}\n", r.no_gpu_reason);
  for (const auto& g : r.gpus) {
    out += fmt::format("  [{}] {}  {}\n", g.index, g.name, g.pci_bus_id);
    out +=
        fmt::format("      sm_{}  {} SMs  {} memory  {} L2  {}-bit bus\n",
                    g.cc_major && g.cc_minor ? fmt::format("{}{}", *g.cc_major, *g.cc_minor) : "??",
                    or_unknown(g.sm_count),
                    g.memory_total_bytes ? format_size(*g.memory_total_bytes) : "unknown",
                    g.l2_bytes ? format_size(static_cast<std::uint64_t>(*g.l2_bytes)) : "unknown",
                    or_unknown(g.memory_bus_width_bits));
    out += fmt::format("      max clocks: SM {} MHz, memory {} MHz\n",
                       or_unknown(g.max_sm_clock_mhz), or_unknown(g.max_mem_clock_mhz));
    std::string dtypes;
    for (const auto& d : g.tensor_core_dtypes) dtypes += " " + d;
    // Which tensor-core types a GPU has follows from its compute capability: none known without it.
    out += fmt::format("      tensor cores:{}\n", !dtypes.empty() ? dtypes
                                                  : g.cc_major    ? " none"
                                                                  : " unknown");
    if (g.nvml) {
      out +=
          fmt::format("      persistence {}, ECC {}, MIG {}, power limit {} W (default {} W)\n",
                      yes_no(g.persistence_enabled), yes_no(g.ecc_enabled), yes_no(g.mig_enabled),
                      or_unknown(g.power_limit_w), or_unknown(g.power_default_limit_w));
      std::string reasons;
      for (const auto& n : g.clock_event_names) reasons += " " + n;
      out += fmt::format("      clock events:{}{}\n",
                         !g.clock_event_reasons ? " unknown"
                         : reasons.empty()      ? " none"
                                                : reasons,
                         g.throttled ? " (throttled)" : "");
      if (!g.processes_why_not.empty()) {
        out += fmt::format("      other processes: unknown ({})\n", g.processes_why_not);
      } else if (g.other_processes.empty()) {
        out += "      other processes: none\n";
      } else {
        for (const auto& p : g.other_processes)
          out += fmt::format("      other process: pid {} holds {}\n", p.pid,
                             p.used_bytes ? format_size(*p.used_bytes) : "an unknown amount");
      }
    } else {
      out += "      NVML: no data\n";
    }
    if (g.theoretical_memory_gbs)
      out += fmt::format("      theoretical memory bandwidth {:.0f} GB/s\n",
                         *g.theoretical_memory_gbs);
    if (!g.theoretical_tflops.empty()) {
      out += "      theoretical dense TFLOP/s:";
      for (const auto& [d, t] : g.theoretical_tflops)
        out += fmt::format(" {} {:.1f}", gemm_dtype_name(d), t);
      out += "\n";
    }
  }
  out += "\n";

  out += "Capabilities\n";
  auto caps = [&](const std::vector<Capability>& list, std::string_view indent) {
    for (const auto& c : list) {
      out += fmt::format("{}{:<24} {}\n", indent, c.name,
                         c.available ? std::string("yes") : "no: " + c.why_not);
    }
  };
  caps(r.capabilities, "  ");
  for (const auto& g : r.gpus) {
    if (g.capabilities.empty()) continue;
    out += fmt::format("  GPU {}\n", g.index);
    caps(g.capabilities, "    ");
  }
  out += "\n";

  out += "Ceilings\n";
  if (!r.ceilings) {
    out += fmt::format("  {}\n", r.ceilings_note);
  } else {
    const auto& c = *r.ceilings;
    out += fmt::format("  GPU {} ({}); theoretical peaks at the max SM clock {:.0f} MHz\n",
                       c.device, c.device_name, c.sm_clock_mhz);
    for (const auto& g : c.gemm) {
      const std::string name =
          fmt::format("GEMM {} {}x{}x{}", gemm_dtype_name(g.dtype), g.m, g.n, g.k);
      if (!g.measured) {
        out += fmt::format("  {:<32} not measured: {}\n", name, g.why_not);
        continue;
      }
      out += fmt::format("  {:<32} {:8.1f} TFLOP/s", name, g.tflops);
      if (g.theoretical_tflops)
        out += fmt::format("  of {:.1f} theoretical ({:.0f}%)", *g.theoretical_tflops,
                           100 * g.tflops / *g.theoretical_tflops);
      out += "\n";
    }
    for (const auto& b : c.bandwidth) {
      if (!b.measured) {
        out += fmt::format("  {:<32} not measured: {}\n", b.name, b.why_not);
        continue;
      }
      out += fmt::format("  {:<32} {:8.1f} GB/s", b.name, b.gbs);
      if (b.theoretical_gbs)
        out += fmt::format("  of {:.0f} theoretical ({:.0f}%)", *b.theoretical_gbs,
                           100 * b.gbs / *b.theoretical_gbs);
      out += "\n";
    }
  }
  out += "\n";

  if (r.collectives) collectives_text(out, *r.collectives);

  out += "Findings\n";
  if (r.findings.empty()) out += "  none\n";
  for (const auto& f : r.findings) {
    out += fmt::format("  [{}] {}\n", severity_name(f.severity), f.message);
    if (!f.fix.empty()) out += fmt::format("      fix: {}\n", f.fix);
  }
  return out;
}

}  // namespace dlprobe::doctor
