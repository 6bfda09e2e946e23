// The bootstraps' generator is MT19937-64 number for number: a seed recorded in a results file
// gives the same interval as it did with std::mt19937_64.
#include "dlprobe/stats/mersenne.h"

#include <gtest/gtest.h>

#include <random>

namespace dlprobe::stats {
namespace {

TEST(Mt19937_64, TheStandardSequenceAcrossManyRefills) {
  for (const std::uint64_t seed : {0ULL, 1ULL, 5489ULL, 0x646c70726f6265ULL, ~0ULL}) {
    std::mt19937_64 expected(seed);
    Mt19937_64 ours(seed);
    for (int i = 0; i < 10'000; ++i) ASSERT_EQ(ours(), expected()) << "seed " << seed << " #" << i;
  }
}

TEST(Mt19937_64, TheStandardsCheckValue) {
  // [rand.predef]: the 10000th consecutive invocation of a default-constructed mt19937_64
  // (seed 5489) produces 9981545732273789042.
  Mt19937_64 g(5489);
  for (int i = 1; i < 10'000; ++i) g();
  EXPECT_EQ(g(), 9981545732273789042ULL);
}

}  // namespace
}  // namespace dlprobe::stats
