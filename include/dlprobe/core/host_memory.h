// The host's memory as the kernel counts it for this process: /proc/meminfo, and the memory cgroup
// a container runs in.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

namespace dlprobe {

// What this process can take without swapping or being killed: the least of MemAvailable (free
// memory and the page cache that can be dropped) and what its memory cgroup still allows (a
// container's limit, which MemAvailable does not see); nullopt where neither can be read.
std::optional<std::uint64_t> host_memory_available();

// What the memory cgroup named in `self` (the text of /proc/self/cgroup) still lets the process
// take under `cgroup_root` (where the cgroup file system is mounted): v2's memory.max less
// memory.current, v1's memory.limit_in_bytes less memory.usage_in_bytes; nullopt without a
// limit. A container sees its own cgroup at the root, so the root's files stand in for a path
// that is not there.
std::optional<std::uint64_t> cgroup_memory_room(std::string_view self,
                                                const std::filesystem::path& cgroup_root);

}  // namespace dlprobe
