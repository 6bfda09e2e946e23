// The findings that compare the GPUs of one run, on constructed per-GPU figures.
#include <gtest/gtest.h>

#include "dlprobe/run/runner.h"

namespace dlprobe::run {
namespace {

constexpr std::uint64_t kOneGiB = 1ull << 30;

PerGpuFigures gpu(unsigned index, std::optional<double> util, std::uint64_t peak) {
  PerGpuFigures g;
  g.index = index;
  g.util_median_pct = util;
  g.peak_bytes = peak;
  return g;
}

std::vector<std::string> ids(const std::vector<diagnosis::Finding>& findings) {
  std::vector<std::string> out;
  for (const auto& f : findings) out.push_back(f.id);
  return out;
}

TEST(GpuImbalance, BalancedRunHasNoFinding) {
  EXPECT_TRUE(
      gpu_imbalance_findings(
          {gpu(0, 95, 20 * kOneGiB), gpu(1, 93, 20 * kOneGiB), gpu(2, 96, 21 * kOneGiB)}, true)
          .empty());
}

TEST(GpuImbalance, OneGpuIdleWhileTheOthersWork) {
  const auto f = gpu_imbalance_findings({gpu(0, 92, 20 * kOneGiB), gpu(1, 2, 20 * kOneGiB),
                                         gpu(2, 90, 20 * kOneGiB), gpu(3, 91, 20 * kOneGiB)},
                                        true);
  ASSERT_EQ(ids(f), (std::vector<std::string>{"gpu_idle_while_others_work"}));
  EXPECT_EQ(f[0].title, "GPU 1 idle while the other GPUs work");
  EXPECT_NE(f[0].evidence.find("below 10% utilisation"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("at least 50% counts as working"), std::string::npos);
  EXPECT_DOUBLE_EQ(f[0].numbers.at("others_util_median_pct"), 91);
}

TEST(GpuImbalance, IdleNeedsTheOthersBusyAndAWindow) {
  // Everybody low: an input-bound or host-bound run, not one idle GPU.
  EXPECT_TRUE(gpu_imbalance_findings({gpu(0, 30, kOneGiB), gpu(1, 3, kOneGiB)}, true).empty());
  // No window: the medians include start-up and say nothing about the work.
  EXPECT_TRUE(gpu_imbalance_findings({gpu(0, 90, kOneGiB), gpu(1, 3, kOneGiB)}, false).empty());
  // Exactly at the thresholds: 10% is not idle, 50% is working.
  EXPECT_TRUE(gpu_imbalance_findings({gpu(0, 50, kOneGiB), gpu(1, 10, kOneGiB)}, true).empty());
  EXPECT_EQ(ids(gpu_imbalance_findings({gpu(0, 50, kOneGiB), gpu(1, 9.9, kOneGiB)}, true)),
            (std::vector<std::string>{"gpu_idle_while_others_work"}));
  // One GPU: nothing to compare with.
  EXPECT_TRUE(gpu_imbalance_findings({gpu(0, 0, kOneGiB)}, true).empty());
  EXPECT_TRUE(
      gpu_imbalance_findings({gpu(0, std::nullopt, kOneGiB), gpu(1, 95, kOneGiB)}, true).empty());
}

TEST(GpuImbalance, OneGpusMemoryFarAboveTheOthers) {
  // Every rank's CUDA context on GPU 0 as well as its own.
  const auto f = gpu_imbalance_findings(
      {gpu(0, 90, 36 * kOneGiB), gpu(1, 90, 20 * kOneGiB), gpu(2, 90, 20 * kOneGiB)}, true);
  ASSERT_EQ(ids(f), (std::vector<std::string>{"gpu_memory_imbalance"}));
  EXPECT_EQ(f[0].title, "GPU 0 holds far more memory than the other GPUs");
  EXPECT_NE(f[0].evidence.find("36.0 GiB"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("more than 1.5x and 1.00 GiB above"), std::string::npos)
      << f[0].evidence;
  EXPECT_DOUBLE_EQ(f[0].numbers.at("gpu"), 0);
}

TEST(GpuImbalance, MemoryNeedsBothTheRatioAndTheAmount) {
  // Twice the other but only 512 MiB more: small workloads differ by a context.
  EXPECT_TRUE(
      gpu_imbalance_findings({gpu(0, 90, 1024ull << 20), gpu(1, 90, 512ull << 20)}, true).empty());
  // 2 GiB more but only 1.1x.
  EXPECT_TRUE(
      gpu_imbalance_findings({gpu(0, 90, 22 * kOneGiB), gpu(1, 90, 20 * kOneGiB)}, true).empty());
  EXPECT_EQ(ids(gpu_imbalance_findings({gpu(0, 90, 31 * kOneGiB), gpu(1, 90, 20 * kOneGiB)}, true)),
            (std::vector<std::string>{"gpu_memory_imbalance"}));
}

}  // namespace
}  // namespace dlprobe::run
