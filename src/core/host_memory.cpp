#include "dlprobe/core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace dlprobe {

namespace {

std::optional<std::uint64_t> read_number(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::uint64_t value = 0;
  if (in >> value) return value;
  return std::nullopt;  // missing, or "max" (no limit)
}

// Limit less usage in `dir`, or at the root where `dir` is not there.
std::optional<std::uint64_t> room_in(const std::filesystem::path& root,
                                     const std::filesystem::path& dir, const char* limit_file,
                                     const char* usage_file) {
  for (const std::filesystem::path& at : {dir, root}) {
    const std::optional<std::uint64_t> limit = read_number(at / limit_file);
    const std::optional<std::uint64_t> usage = read_number(at / usage_file);
    if (!usage) continue;
    // v1 writes "no limit" as a number near 2^63.
    if (!limit || *limit >= (std::uint64_t{1} << 62)) return std::nullopt;
    return *limit > *usage ? *limit - *usage : 0;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> cgroup_memory_room(std::string_view self,
                                                const std::filesystem::path& cgroup_root) {
  std::istringstream lines{std::string(self)};
  for (std::string line; std::getline(lines, line);) {
    // "hierarchy:controllers:path"; v2's single hierarchy is "0::path".
    const std::size_t first = line.find(':');
    const std::size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::filesystem::path path =
        std::filesystem::path(line.substr(second + 1)).relative_path();
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      if (auto room = room_in(cgroup_root, cgroup_root / path, "memory.max", "memory.current")) {
        return room;
      }
    }
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name != "memory") continue;
      const std::filesystem::path v1 = cgroup_root / "memory";
      return room_in(v1, v1 / path, "memory.limit_in_bytes", "memory.usage_in_bytes");
    }
  }
  return std::nullopt;
}

std::optional<std::uint64_t> host_memory_available() {
  std::optional<std::uint64_t> available;
  std::ifstream meminfo("/proc/meminfo");
  // Line by line: some lines (HugePages_Total) have no unit.
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  std::ifstream self_file("/proc/self/cgroup");
  std::stringstream self;
  self << self_file.rdbuf();
  const std::optional<std::uint64_t> room = cgroup_memory_room(self.str(), "/sys/fs/cgroup");
  if (available && room) return std::min(*available, *room);
  return available ? available : room;
}

}  // namespace dlprobe
