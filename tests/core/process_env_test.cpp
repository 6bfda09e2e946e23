#include "dlprobe/core/process_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace dlprobe {
namespace {

TEST(ProcessEnv, SetsOnlyWhatTheUserLeftUnset) {
  // Names of this test's own, so that no other test's environment is touched.
  unsetenv("DLPROBE_TEST_ENV_UNSET");
  setenv("DLPROBE_TEST_ENV_USER", "7", 1);

  EXPECT_TRUE(set_default_env("DLPROBE_TEST_ENV_UNSET", "32"));
  EXPECT_EQ(std::string(std::getenv("DLPROBE_TEST_ENV_UNSET")), "32");
  EXPECT_TRUE(set_by_dlprobe("DLPROBE_TEST_ENV_UNSET"));

  // The user's value stands, and it is not dlprobe's to take from the children.
  EXPECT_FALSE(set_default_env("DLPROBE_TEST_ENV_USER", "32"));
  EXPECT_EQ(std::string(std::getenv("DLPROBE_TEST_ENV_USER")), "7");
  EXPECT_FALSE(set_by_dlprobe("DLPROBE_TEST_ENV_USER"));

  // A second call leaves dlprobe's own value as it was.
  EXPECT_FALSE(set_default_env("DLPROBE_TEST_ENV_UNSET", "8"));
  EXPECT_EQ(std::string(std::getenv("DLPROBE_TEST_ENV_UNSET")), "32");
  EXPECT_TRUE(set_by_dlprobe("DLPROBE_TEST_ENV_UNSET"));
  EXPECT_FALSE(set_by_dlprobe("DLPROBE_TEST_ENV_NEVER"));
}

}  // namespace
}  // namespace dlprobe
