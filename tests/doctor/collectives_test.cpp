#include "dlprobe/doctor/collectives.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dlprobe/doctor/doctor.h"

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

CollectiveReport measured_report(int ranks, double busbw) {
  CollectiveReport c;
  c.measured = true;
  c.ranks = ranks;
  c.mode = "one process";
  c.nccl_version = "2.27.3";
  c.nvls = "0";
  for (int d = 0; d < ranks; ++d) c.devices.push_back(d);
  CollectiveSweep s;
  s.collective = Collective::all_reduce;
  CollectivePoint p;
  p.bytes = 1ull << 30;
  p.time_us = 5000;
  p.algbw_gbs = algbw_gbs(p.bytes, 5e-3);
  p.busbw_gbs = busbw_gbs(Collective::all_reduce, p.bytes, 5e-3, ranks);
  if (ranks > 1) {
    p.busbw_gbs = busbw;
    s.peak_busbw_gbs = busbw;
  }
  s.points.push_back(p);
  c.sweeps.push_back(s);
  if (ranks == 1) c.note = one_rank_note();
  return c;
}

std::vector<GpuReport> hopper_gpus(int n) {
  std::vector<GpuReport> gpus(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    gpus[static_cast<std::size_t>(i)].index = i;
    gpus[static_cast<std::size_t>(i)].cc_major = 9;
    gpus[static_cast<std::size_t>(i)].cc_minor = 0;
    gpus[static_cast<std::size_t>(i)].theoretical_pcie_gbs = 63.0;
  }
  return gpus;
}

TEST(Collectives, LinksFromNvml) {
  CollectiveReport c = measured_report(2, 315.0);
  auto nvlink = [](int, int) -> std::optional<nvml::PairTopology> {
    return nvml::PairTopology{50, true, true};
  };
  auto links = [](int) -> std::optional<unsigned> { return 18u; };
  add_links(c, hopper_gpus(2), nvlink, links);
  ASSERT_EQ(c.pairs.size(), 1u);
  EXPECT_EQ(c.pairs[0].link, "NVLink");
  ASSERT_TRUE(c.peak);
  EXPECT_DOUBLE_EQ(c.peak->gbs, 450.0);  // 18 links x 25 GB/s
  EXPECT_NEAR(*c.sweeps[0].peak_ratio, 0.7, 1e-9);
  EXPECT_TRUE(collective_findings(c).empty());

  CollectiveReport pcie = measured_report(2, 20.0);
  auto over_pcie = [](int, int) -> std::optional<nvml::PairTopology> {
    return nvml::PairTopology{40, false, true};
  };
  auto none = [](int) -> std::optional<unsigned> { return std::nullopt; };
  add_links(pcie, hopper_gpus(2), over_pcie, none);
  EXPECT_EQ(pcie.pairs[0].link, "PCIe (NODE)");
  ASSERT_TRUE(pcie.peak);
  EXPECT_EQ(pcie.peak->kind, "PCIe");
  const auto f = collective_findings(pcie);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "collective_bandwidth_low");
  EXPECT_NE(f[0].message.find("32% of the PCIe peak of 63 GB/s (below 50%)"), std::string::npos)
      << f[0].message;
}

TEST(Collectives, OneGpuShowsNoBusBandwidth) {
  Report r;
  r.collectives = measured_report(1, 0);
  const auto doc = nlohmann::json::parse(render_json(r));
  const auto& point = doc["collectives"]["sweeps"][0]["points"][0];
  EXPECT_TRUE(point["busbw_gbs"].is_null());
  EXPECT_GT(point["algbw_gbs"].get<double>(), 0);
  EXPECT_TRUE(doc["collectives"]["sweeps"][0]["peak_busbw_gbs"].is_null());
  const std::string text = render_text(r);
  EXPECT_NE(text.find("bus bandwidth is 0 by definition (not shown)"), std::string::npos) << text;
  EXPECT_NE(text.find("1.00 GiB"), std::string::npos) << text;
  EXPECT_EQ(text.find("0.00\n"), std::string::npos) << text;
  const auto f = collective_findings(*r.collectives);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "collectives_one_gpu");
  EXPECT_NE(f[0].message.find("Run on several GPUs"), std::string::npos);
}

TEST(Collectives, NotMeasuredSaysWhy) {
  CollectiveReport c;
  c.why_not = "NCCL is not loadable (libnccl.so.2: cannot open)";
  const auto f = collective_findings(c);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "collectives_not_measured");
  Report r;
  r.collectives = c;
  EXPECT_NE(render_text(r).find("not measured: NCCL is not loadable"), std::string::npos);
  const auto doc = nlohmann::json::parse(render_json(r))["collectives"];
  EXPECT_TRUE(doc["measured"] == false);
  // What does not apply is null, never 0.
  EXPECT_TRUE(doc["ranks"].is_null()) << doc.dump();
  EXPECT_TRUE(doc["max_bytes"].is_null()) << doc.dump();
  r.collectives = measured_report(1, 0);
  EXPECT_TRUE(nlohmann::json::parse(render_json(r))["collectives"]["ranks"].is_number());
}

}  // namespace
}  // namespace dlprobe::doctor
