// The host path's staging to the GPU: what goes up is what was written, each device buffer stays
// as it was through the next upload, and bad requests are one-line errors.
#include "dlprobe/data/device_staging.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dlprobe::data {
namespace {

std::vector<std::byte> pattern(std::size_t bytes, std::uint8_t seed) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  }
  return out;
}

std::vector<std::byte> download(const void* device, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

TEST(DeviceStaging, UploadsIntoTwoBuffersThatTakeTurns) {
  constexpr std::size_t kBytes = (std::size_t{3} << 20) + 7;
  auto staging = DeviceStaging::open(0, kBytes);
  ASSERT_TRUE(staging) << staging.status().message();
  ASSERT_EQ((*staging)->host().size(), kBytes);

  const std::vector<std::byte> a = pattern(kBytes, 1);
  const std::vector<std::byte> b = pattern(kBytes, 2);
  std::copy(a.begin(), a.end(), (*staging)->host().begin());
  auto first = (*staging)->upload();
  ASSERT_TRUE(first) << first.status().message();
  std::copy(b.begin(), b.end(), (*staging)->host().begin());
  auto second = (*staging)->upload();
  ASSERT_TRUE(second) << second.status().message();

  EXPECT_NE(*first, *second);
  EXPECT_EQ(download(*first, kBytes), a) << "the first batch stays through the next upload";
  EXPECT_EQ(download(*second, kBytes), b);
  auto third = (*staging)->upload();
  ASSERT_TRUE(third) << third.status().message();
  EXPECT_EQ(*third, *first) << "two buffers take turns";
  EXPECT_EQ(download(*third, kBytes), b);
}

TEST(DeviceStaging, RefusesABadDeviceAndAnEmptyBuffer) {
  auto missing = DeviceStaging::open(99, 16);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("cuda:99"), std::string::npos)
      << missing.status().message();
  EXPECT_EQ(missing.status().message().find('\n'), std::string::npos);
  auto empty = DeviceStaging::open(0, 0);
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.status().message().find("0 bytes"), std::string::npos)
      << empty.status().message();
  EXPECT_EQ(empty.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::data
