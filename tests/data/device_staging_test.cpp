// The host path's staging to the GPU: what goes up is what was written, each device buffer stays
// as it was through the next upload, bad requests are one-line errors, and `dlprobe pipeline`'s
// host batches counted once they are on the device.
#include "dlprobe/data/device_staging.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/temp_folder.h"
#include "dlprobe/data/make_dataset.h"
#include "dlprobe/data/throughput.h"

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

TEST(DeviceStaging, PipelineCountsHostBatchesOnTheDevice) {
  testing::TempFolder dir;
  MakeDatasetOptions m;
  m.images = 24;
  m.classes = 2;
  ASSERT_TRUE(make_dataset(dir / "set", m));
  auto dataset = list_dataset(dir / "set");
  ASSERT_TRUE(dataset) << dataset.status().message();
  ThroughputOptions o;
  o.threads = {2};
  o.stages = {Stage::decode, Stage::augment};
  o.min_time = std::chrono::milliseconds(50);
  o.loader.batch_size = 8;
  o.loader.augment.size = 32;
  o.upload_device = 0;
  auto report = measure_throughput(*dataset, o);
  ASSERT_TRUE(report) << report.status().message();
  ASSERT_EQ(report->points.size(), 2U);
  EXPECT_FALSE(report->points[0].uploaded) << "the decode stage has no batch to send";
  EXPECT_TRUE(report->points[1].uploaded);
  EXPECT_GT(report->points[1].images, 0);
  EXPECT_EQ(report->upload_device, 0);
  const std::string text = render_text(*report);
  EXPECT_NE(text.find("decode+augment+copy"), std::string::npos) << text;
  EXPECT_NE(text.find("copied to cuda:0"), std::string::npos) << text;
}

}  // namespace
}  // namespace dlprobe::data
