#include "dlprobe/data/cuda_queues.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace dlprobe::data {
namespace {

// One test: what dlprobe set stays set for the rest of the process. This process makes no CUDA
// call, so the variable changes nothing here.
TEST(CudaQueues, TheUsersValueStandsAndFewQueuesAreNamed) {
  const std::string name(kCudaQueuesVariable);
  unsetenv(name.c_str());
  EXPECT_EQ(narrow_cuda_queues(), std::nullopt);
  for (const auto& [value, named] : {std::pair<const char*, std::optional<int>>{"8", 8},
                                     {"31", 31},
                                     {"32", std::nullopt},
                                     {"1", 1},
                                     {"0", std::nullopt},
                                     {"eight", std::nullopt},
                                     {"8 ", std::nullopt}}) {
    setenv(name.c_str(), value, 1);
    EXPECT_EQ(narrow_cuda_queues(), named) << value;
  }

  setenv(name.c_str(), "4", 1);
  EXPECT_FALSE(widen_cuda_queues());
  EXPECT_EQ(std::string(std::getenv(name.c_str())), "4");
  EXPECT_EQ(narrow_cuda_queues(), 4);

  unsetenv(name.c_str());
  EXPECT_TRUE(widen_cuda_queues());
  EXPECT_EQ(std::string(std::getenv(name.c_str())), "32");
  EXPECT_EQ(narrow_cuda_queues(), std::nullopt);
}

}  // namespace
}  // namespace dlprobe::data
