// The host's memory as the kernel counts it (/proc/meminfo).
#pragma once

#include <cstdint>
#include <optional>

namespace dlprobe {

// MemAvailable in bytes: what can be taken without swapping (free memory and the page cache that
// can be dropped); nullopt where /proc/meminfo cannot be read.
std::optional<std::uint64_t> host_memory_available();

}  // namespace dlprobe
