// The commit a binary names (doctor, results, the trend between two results) is the one its
// sources were at when it was built, read at every build: a hash taken when CMake configured went
// stale with each incremental build after a commit.
#include "dlprobe/core/build_info.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <optional>
#include <string>

namespace dlprobe {
namespace {

struct GitAnswer {
  int status = 0;  // pclose's: 0 where git exited 0
  std::string out;
};

// git's answer in the source tree the tests were built from, its trailing newline dropped.
std::optional<GitAnswer> git(const std::string& args) {
  const std::string command = "git -C '" DLPROBE_SOURCE_DIR "' " + args + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  GitAnswer answer;
  std::array<char, 256> chunk{};
  while (fgets(chunk.data(), static_cast<int>(chunk.size()), pipe) != nullptr) {
    answer.out += chunk.data();
  }
  answer.status = pclose(pipe);
  if (!answer.out.empty() && answer.out.back() == '\n') answer.out.pop_back();
  return answer;
}

TEST(BuildInfo, GitHashIsTheCommitTheSourcesAreAt) {
  const std::optional<GitAnswer> head = git("rev-parse --short=12 HEAD");
  if (!head || head->status != 0)
    GTEST_SKIP() << "git, or a git checkout of the sources, is missing";
  const std::optional<GitAnswer> diff = git("diff --quiet HEAD --");
  ASSERT_TRUE(diff.has_value());
  EXPECT_EQ(build_info().git_hash, head->out + (diff->status != 0 ? "-dirty" : ""));
}

}  // namespace
}  // namespace dlprobe
