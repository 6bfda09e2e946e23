// The host CPU and memory, read from /proc: what doctor reports on every machine, and all it can
// report where there is no GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe::doctor {

struct CpuInfo {
  std::string model;  // "Intel(R) Xeon(R) Platinum 8480+", or "unknown"
  int sockets = 0;    // distinct "physical id"s (1 when the kernel does not say)
  int cores = 0;      // distinct (physical id, core id) pairs; = threads when not listed
  int threads = 0;    // "processor" entries
  // The ISA features that matter for deep-learning kernels, each with whether the kernel reports
  // it (x86: the "flags" line; Arm: "Features"). Listed in a fixed order, present or not.
  std::vector<std::pair<std::string, bool>> isa;
};

// Parses the text of /proc/cpuinfo.
CpuInfo parse_cpuinfo(std::string_view text);
// MemTotal from the text of /proc/meminfo, in bytes.
std::optional<std::uint64_t> parse_meminfo_total(std::string_view text);

struct HostInfo {
  std::string hostname;
  std::string os;       // "Linux 6.1.0-18-amd64"
  std::string machine;  // "x86_64"
  CpuInfo cpu;
  std::optional<std::uint64_t> memory_total_bytes;
};

// Reads /proc/cpuinfo, /proc/meminfo and uname on this machine.
Result<HostInfo> read_host_info();

}  // namespace dlprobe::doctor
