#include "dlprobe/doctor/cpu_info.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

namespace dlprobe::doctor {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::set<std::string, std::less<>> split_words(std::string_view s) {
  std::set<std::string, std::less<>> words;
  std::istringstream in{std::string(s)};
  std::string w;
  while (in >> w) words.insert(w);
  return words;
}

// x86: the vector and matrix extensions GEMM and convolution kernels dispatch on (oneDNN, MKL,
// PyTorch's CPU path). Names as the Linux kernel spells them in /proc/cpuinfo.
constexpr std::string_view kX86Features[] = {
    "sse4_2",      "avx",         "avx2",     "fma",      "f16c",
    "avx_vnni",    "avx512f",     "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"};
// Arm: NEON (asimd), half-precision arithmetic, dot products, SVE and the bf16/int8 matrix
// instructions.
constexpr std::string_view kArmFeatures[] = {"asimd", "asimdhp", "asimddp", "sve",
                                             "sve2",  "bf16",    "i8mm"};

}  // namespace

CpuInfo parse_cpuinfo(std::string_view text) {
  CpuInfo info;
  std::set<std::string> sockets;
  std::set<std::pair<std::string, std::string>> cores;
  std::string physical_id;
  std::string flags_x86;
  std::string features_arm;
  bool any_core_id = false;
  while (!text.empty()) {
    auto eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    auto key = trim(line.substr(0, colon));
    auto value = trim(line.substr(colon + 1));
    if (key == "processor") {
      ++info.threads;
      physical_id.clear();
    } else if (key == "model name" && info.model.empty()) {
      info.model = value;
    } else if (key == "physical id") {
      physical_id = value;
      sockets.insert(physical_id);
    } else if (key == "core id") {
      cores.emplace(physical_id, value);
      any_core_id = true;
    } else if (key == "flags" && flags_x86.empty()) {
      flags_x86 = value;
    } else if (key == "Features" && features_arm.empty()) {
      features_arm = value;
    }
  }
  if (info.model.empty()) info.model = "unknown";
  info.sockets = sockets.empty() ? 1 : static_cast<int>(sockets.size());
  info.cores = any_core_id ? static_cast<int>(cores.size()) : info.threads;
  if (!flags_x86.empty()) {
    auto words = split_words(flags_x86);
    for (auto f : kX86Features) info.isa.emplace_back(std::string(f), words.contains(f));
  } else if (!features_arm.empty()) {
    auto words = split_words(features_arm);
    for (auto f : kArmFeatures) info.isa.emplace_back(std::string(f), words.contains(f));
  }
  return info;
}

std::optional<std::uint64_t> parse_meminfo_total(std::string_view text) {
  const std::string_view key = "MemTotal:";
  auto at = text.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  auto rest = trim(text.substr(at + key.size(), text.find('\n', at) - at - key.size()));
  std::uint64_t kib = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
  if (ec != std::errc()) return std::nullopt;
  // The kernel writes "kB" but means KiB.
  if (trim(std::string_view(end, static_cast<std::size_t>(rest.data() + rest.size() - end))) !=
      "kB")
    return std::nullopt;
  return kib * 1024;
}

namespace {

Result<std::string> read_file(const char* path) {
  std::ifstream in(path);
  if (!in) return error(Errc::io_error, std::string("cannot read ") + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

Result<HostInfo> read_host_info() {
  HostInfo host;
  DLPROBE_ASSIGN_OR_RETURN(auto cpuinfo, read_file("/proc/cpuinfo"));
  host.cpu = parse_cpuinfo(cpuinfo);
  DLPROBE_ASSIGN_OR_RETURN(auto meminfo, read_file("/proc/meminfo"));
  host.memory_total_bytes = parse_meminfo_total(meminfo);
  utsname name{};
  if (uname(&name) == 0) {
    host.hostname = name.nodename;
    host.os = std::string(name.sysname) + " " + name.release;
    host.machine = name.machine;
  }
  return host;
}

}  // namespace dlprobe::doctor
