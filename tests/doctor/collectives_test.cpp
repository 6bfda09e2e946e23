#include "dlprobe/doctor/collectives.h"

#include <gtest/gtest.h>

namespace dlprobe::doctor {
namespace {

// nccl-tests' doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for
// all-gather and reduce-scatter.
TEST(Collectives, BusFactorIsNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_reduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_reduce, 1), 0.0);
}

TEST(Collectives, Bandwidths) {
  // 8 GiB in 50 ms on 8 ranks: algbw 171.8 GB/s; all-reduce busbw 300.6 GB/s.
  const std::uint64_t bytes = 8ull << 30;
  EXPECT_NEAR(algbw_gbs(bytes, 0.05), 171.80, 0.01);
  EXPECT_NEAR(*busbw_gbs(Collective::all_reduce, bytes, 0.05, 8), 300.65, 0.01);
  EXPECT_NEAR(*busbw_gbs(Collective::all_gather, bytes, 0.05, 8), 150.32, 0.01);
  // One rank: no bus bandwidth, not a zero that reads as a measurement.
  EXPECT_FALSE(busbw_gbs(Collective::all_reduce, bytes, 0.05, 1));
}

TEST(Collectives, BytesRoundToWholeElementsPerRank) {
  EXPECT_EQ(collective_bytes(Collective::all_reduce, 10, 3, 4), 8u);
  EXPECT_EQ(collective_bytes(Collective::all_gather, 100, 3, 4), 96u);
  EXPECT_EQ(collective_bytes(Collective::reduce_scatter, 8, 4, 4), 0u);
  EXPECT_EQ(collective_bytes(Collective::reduce_scatter, 8ull << 30, 8, 4), 8ull << 30);
  EXPECT_EQ(collective_rank_bytes(Collective::all_reduce, 1024, 4), 2048u);
  EXPECT_EQ(collective_rank_bytes(Collective::all_gather, 1024, 4), 1280u);
  EXPECT_EQ(collective_rank_bytes(Collective::reduce_scatter, 1024, 4), 1280u);
}

TEST(Collectives, SweepSizesDoubleFromMinToMax) {
  const auto sizes = sweep_sizes(8, 8ull << 30);
  ASSERT_EQ(sizes.size(), 31u);  // 2^3 .. 2^33
  EXPECT_EQ(sizes.front(), 8u);
  EXPECT_EQ(sizes[1], 16u);
  EXPECT_EQ(sizes.back(), 8ull << 30);
  EXPECT_EQ(sweep_sizes(8, 100), (std::vector<std::uint64_t>{8, 16, 32, 64, 100}));
  EXPECT_EQ(sweep_sizes(8, 8), (std::vector<std::uint64_t>{8}));
  EXPECT_TRUE(sweep_sizes(16, 8).empty());
}

TEST(Collectives, SweepMaxIsBoundedByFreeMemoryAndTheCap) {
  // 141 GB free: all-reduce's 2 x 8 GiB fits well within 80%; the cap decides.
  EXPECT_EQ(sweep_max_bytes(141ull << 30, 8ull << 30, 8), 8ull << 30);
  // 10 GiB free: 80% is 8 GiB, so 4 GiB (two buffers) is the largest.
  EXPECT_EQ(sweep_max_bytes(10ull << 30, 8ull << 30, 8), 4ull << 30);
  EXPECT_EQ(sweep_max_bytes(141ull << 30, 1ull << 20, 8), 1ull << 20);
  EXPECT_EQ(sweep_max_bytes(10, 8ull << 30, 8), 0u);
  EXPECT_EQ(sweep_max_bytes(~0ull, ~0ull, 8), 1ull << 62);
}

TEST(Collectives, NvlinkPerLinkByArchitecture) {
  EXPECT_EQ(nvlink_gbs_per_link(9, 0), 25.0);
  EXPECT_EQ(nvlink_gbs_per_link(10, 0), 50.0);
  EXPECT_FALSE(nvlink_gbs_per_link(8, 6));
}

TEST(Collectives, LinkPeakIsTheSlowestGpu) {
  std::vector<GpuLinks> gpus{{0, 18, 450.0, 55.0}, {1, 16, 400.0, 55.0}};
  std::vector<GpuPair> pairs{{0, 1, TopologyLevel::system, true, true, "NVLink"}};
  auto peak = link_peak(gpus, pairs);
  ASSERT_TRUE(peak);
  EXPECT_EQ(peak->kind, "NVLink");
  EXPECT_DOUBLE_EQ(peak->gbs, 400.0);
  pairs[0].nvlink = false;
  peak = link_peak(gpus, pairs);
  ASSERT_TRUE(peak);
  EXPECT_EQ(peak->kind, "PCIe");
  EXPECT_DOUBLE_EQ(peak->gbs, 55.0);
  gpus[1].pcie_peak_gbs.reset();
  EXPECT_FALSE(link_peak(gpus, pairs));
  EXPECT_FALSE(link_peak({gpus[0]}, {}));
}

}  // namespace
}  // namespace dlprobe::doctor
