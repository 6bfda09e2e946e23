// The process's own command line: the cmdline format, a file that is not there, and this test's
// own arguments read once.
#include "dlprobe/core/command_line.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/temp_folder.h"
#include "dlprobe/core/files.h"

namespace dlprobe {
namespace {

using Args = std::vector<std::string>;

TEST(CommandLine, SplitsOnNulKeepingEmptyArguments) {
  using namespace std::string_literals;
  EXPECT_EQ(split_command_line("dlprobe\0run\0--\0sh\0-c\0\0"s),
            (Args{"dlprobe", "run", "--", "sh", "-c", ""}));
  EXPECT_EQ(split_command_line("a\0\0b\0"s), (Args{"a", "", "b"}));
  // A process that rewrote its argv may leave the last NUL out.
  EXPECT_EQ(split_command_line("a\0b"s), (Args{"a", "b"}));
  EXPECT_EQ(split_command_line(""), Args{});
}

TEST(CommandLine, ReadsAFileAndSaysWhenItIsMissing) {
  testing::TempFolder dir;
  using namespace std::string_literals;
  ASSERT_TRUE(write_file_atomic(dir / "cmdline", "x\0y z\0"s).is_ok());
  EXPECT_EQ(read_command_line(dir / "cmdline").value(), (Args{"x", "y z"}));
  auto missing = read_command_line(dir / "none");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.status().code(), Errc::not_found);
}

TEST(CommandLine, OwnIsThisProcessesArgumentsReadOnce) {
  const std::vector<std::string>& args = own_command_line();
  EXPECT_EQ(args, ::testing::internal::GetArgvs());
  EXPECT_EQ(&own_command_line(), &args);
}

}  // namespace
}  // namespace dlprobe
