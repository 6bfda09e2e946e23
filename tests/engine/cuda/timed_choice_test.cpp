// Which timed configuration the tuning keeps (timed_choice.h): the fastest, or the fastest
// without workspace within kWorkspaceFreeTolerance of it; and how much workspace it may take.
#include "timed_choice.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace dlprobe::cuda {
namespace {

std::optional<std::size_t> choose(const std::vector<TimedConfig>& timed) {
  return choose_timed_config(timed);
}

TEST(TimedChoice, NoneForNothingTimed) {
  EXPECT_FALSE(choose({}).has_value());
}

TEST(TimedChoice, TheFastestWhereNothingTies) {
  EXPECT_EQ(choose({{0.30F, 0}, {0.10F, 0}, {0.20F, 0}}), 1U);
  EXPECT_EQ(choose({{0.30F, 0}, {0.10F, 4096}, {0.20F, 0}}), 1U) << "the free one is 2x slower";
  EXPECT_EQ(choose({{0.10F, 272}, {0.12F, 272}}), 0U) << "no configuration without workspace";
}

TEST(TimedChoice, TheFirstOfEquals) {
  EXPECT_EQ(choose({{0.05F, 272}, {0.05F, 272}}), 0U);
  EXPECT_EQ(choose({{0.05F, 0}, {0.05F, 0}}), 0U);
}

// The layer1 data gradient at fp16 batch 64 as three tunings timed it on an H100: 0.0504 ms with
// 272 bytes, 0.0498 and 0.0513 without (others between and around them are made up).
TEST(TimedChoice, WithoutWorkspaceWithinTheTolerance) {
  EXPECT_EQ(choose({{0.0504F, 272}, {0.0513F, 0}}), 1U);
  EXPECT_EQ(choose({{0.0513F, 0}, {0.0504F, 272}}), 0U);
  EXPECT_EQ(choose({{0.0504F, 272}, {0.0520F, 0}, {0.0510F, 0}}), 2U)
      << "the fastest of those without workspace";
  EXPECT_EQ(choose({{0.0498F, 0}, {0.0504F, 272}}), 0U) << "the fastest is free already";
}

TEST(TimedChoice, TimesThatAreNotFiniteAreNeverKept) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(choose({{nan, 0}, {0.2F, 272}}), 1U);
  EXPECT_EQ(choose({{0.100F, 272}, {nan, 0}, {0.102F, 0}}), 2U);
  EXPECT_EQ(choose({{0.100F, 272}, {inf, 0}}), 0U);
  EXPECT_FALSE(choose({{nan, 0}, {inf, 272}}).has_value());
}

TEST(TimedChoice, TheToleranceIsRelative) {
  const float fastest = 1.0F;
  const auto just_within = static_cast<float>(fastest * (1.0 + kWorkspaceFreeTolerance) - 1e-4);
  const auto just_over = static_cast<float>(fastest * (1.0 + kWorkspaceFreeTolerance) + 1e-4);
  EXPECT_EQ(choose({{fastest, 1 << 20}, {just_within, 0}}), 1U);
  EXPECT_EQ(choose({{fastest, 1 << 20}, {just_over, 0}}), 0U);
  EXPECT_EQ(choose({{100 * fastest, 1 << 20}, {100 * just_within, 0}}), 1U);
  EXPECT_EQ(choose({{100 * fastest, 1 << 20}, {100 * just_over, 0}}), 0U);
}

constexpr std::int64_t kCap = std::int64_t{256} << 20;
constexpr std::int64_t kFp32Cap = std::int64_t{2} << 30;

TEST(TimedWorkspaceCap, Fp32TensorsWhoseFastEnginesNeedMoreTakeTheLargerCap) {
  EXPECT_EQ(timed_workspace_cap({.fp32_tensors = true, .tf32 = true}, kCap, kFp32Cap), kFp32Cap);
  EXPECT_EQ(timed_workspace_cap({.fp32_tensors = true, .transforms = true}, kCap, kFp32Cap),
            kFp32Cap);
  EXPECT_EQ(
      timed_workspace_cap({.fp32_tensors = true, .tf32 = true, .transforms = true}, kCap, kFp32Cap),
      kFp32Cap);
}

TEST(TimedWorkspaceCap, OthersKeepTheCap) {
  EXPECT_EQ(timed_workspace_cap({.fp32_tensors = true}, kCap, kFp32Cap), kCap)
      << "strict fp32, direct sums only";
  EXPECT_EQ(timed_workspace_cap({}, kCap, kFp32Cap), kCap) << "fp16 or bf16";
  EXPECT_EQ(timed_workspace_cap({.transforms = true}, kCap, kFp32Cap), kCap)
      << "fp16 or bf16 with transform engines";
  EXPECT_EQ(timed_workspace_cap({.tf32 = true}, kCap, kFp32Cap), kCap)
      << "fp16 or bf16 under a TF32 math mode";
  EXPECT_EQ(timed_workspace_cap({.tf32 = true, .transforms = true}, kCap, kFp32Cap), kCap)
      << "fp16 or bf16 under a TF32 math mode";
}

TEST(TimedWorkspaceCap, NeverBelowTheCap) {
  EXPECT_EQ(timed_workspace_cap({.fp32_tensors = true, .tf32 = true}, kFp32Cap, kCap), kFp32Cap);
}

}  // namespace
}  // namespace dlprobe::cuda
