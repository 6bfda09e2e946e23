#include "dlprobe/core/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace dlprobe {

std::optional<std::uint64_t> host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  // Line by line: some lines (HugePages_Total) have no unit.
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace dlprobe
