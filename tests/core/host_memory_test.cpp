// The memory a process may take: its memory cgroup read from a fake cgroup file system, v2 and
// v1, from the host's view and from a container's; and the machine's own figure.
#include "dlprobe/core/host_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/temp_folder.h"

namespace dlprobe {
namespace {

void write(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

TEST(CgroupMemoryRoom, V2LimitLessUsage) {
  testing::TempFolder root;
  write(root / "kube/pod/memory.max", "1000");
  write(root / "kube/pod/memory.current", "400");
  EXPECT_EQ(cgroup_memory_room("0::/kube/pod\n", root.path()), 600u);
  // Past its limit (the kernel reclaims): nothing more.
  write(root / "kube/pod/memory.current", "1200");
  EXPECT_EQ(cgroup_memory_room("0::/kube/pod\n", root.path()), 0u);
  write(root / "kube/pod/memory.max", "max");
  EXPECT_EQ(cgroup_memory_room("0::/kube/pod\n", root.path()), std::nullopt);
}

TEST(CgroupMemoryRoom, AContainerSeesItsCgroupAtTheRoot) {
  testing::TempFolder root;
  write(root / "memory.max", "8192");
  write(root / "memory.current", "1024");
  EXPECT_EQ(cgroup_memory_room("0::/kube/pod\n", root.path()), 7168u);
}

TEST(CgroupMemoryRoom, V1MemoryController) {
  testing::TempFolder root;
  write(root / "memory/a/b/memory.limit_in_bytes", "5000");
  write(root / "memory/a/b/memory.usage_in_bytes", "1000");
  const std::string self = "5:cpu,cpuacct:/a/b\n4:memory:/a/b\n0::/\n";
  EXPECT_EQ(cgroup_memory_room(self, root.path()), 4000u);
  // v1 writes "no limit" as a page-rounded 2^63 - 1.
  write(root / "memory/a/b/memory.limit_in_bytes", "9223372036854771712");
  EXPECT_EQ(cgroup_memory_room(self, root.path()), std::nullopt);
}

TEST(CgroupMemoryRoom, NoCgroupNoLimit) {
  testing::TempFolder root;
  EXPECT_EQ(cgroup_memory_room("0::/kube/pod\n", root.path()), std::nullopt);
  EXPECT_EQ(cgroup_memory_room("", root.path()), std::nullopt);
  EXPECT_EQ(cgroup_memory_room("garbage\n:::\n", root.path()), std::nullopt);
}

TEST(HostMemory, ThisMachineHasSome) {
  const std::optional<std::uint64_t> available = host_memory_available();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0u);
}

}  // namespace
}  // namespace dlprobe
