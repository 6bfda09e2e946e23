// GPU tests (LABELS gpu): the NCCL sweep over every visible GPU, as one process. On a one-GPU
// machine it is a one-rank communicator, which has no bus bandwidth.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "dlprobe/core/launcher.h"
#include "dlprobe/doctor/collectives.h"

namespace dlprobe::doctor {
namespace {

TEST(CollectivesGpu, SweepOverEveryVisibleGpu) {
  unsetenv("NCCL_NVLS_ENABLE");
  ASSERT_TRUE(disable_nvls_in_process());
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  CollectiveOptions o;
  o.bounds.max_bytes = 64ull << 20;
  o.iterations = 5;
  auto r = measure_collectives(o, RankEnv{});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_TRUE(r->measured) << r->why_not;
  EXPECT_EQ(r->ranks, gpus);
  EXPECT_EQ(r->nvls, "0");
  EXPECT_EQ(r->max_bytes, 64ull << 20);
  ASSERT_EQ(r->sweeps.size(), 3u);
  for (const auto& s : r->sweeps) {
    SCOPED_TRACE(std::string(collective_name(s.collective)));
    ASSERT_FALSE(s.points.empty());
    EXPECT_EQ(s.points.back().bytes, 64ull << 20);
    for (std::size_t i = 0; i < s.points.size(); ++i) {
      const auto& p = s.points[i];
      if (i > 0) {
        EXPECT_GT(p.bytes, s.points[i - 1].bytes);
      }
      EXPECT_GT(p.time_us, 0);
      EXPECT_NEAR(p.algbw_gbs, static_cast<double>(p.bytes) / (p.time_us * 1e-6) / 1e9,
                  1e-9 * p.algbw_gbs + 1e-12);
      if (gpus == 1) {
        EXPECT_FALSE(p.busbw_gbs);
      } else {
        ASSERT_TRUE(p.busbw_gbs);
        EXPECT_GT(*p.busbw_gbs, 0);
      }
    }
  }
  if (gpus == 1) {
    EXPECT_EQ(r->note, one_rank_note());
  }
}

}  // namespace
}  // namespace dlprobe::doctor
