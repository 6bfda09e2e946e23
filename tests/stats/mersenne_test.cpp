// The bootstraps' generator is MT19937-64 number for number, and their remainders are the %
// operator's: a seed recorded in a results file gives the same interval as it did with
// std::mt19937_64 and %.
#include "dlprobe/stats/mersenne.h"

#include <gtest/gtest.h>

#include <initializer_list>
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

TEST(Remainder, TheSameAsTheOperator) {
  std::mt19937_64 random(7);
  for (const std::uint64_t d :
       {1ULL, 2ULL, 3ULL, 7ULL, 200ULL, 999ULL, 1000ULL, 1ULL << 32, (1ULL << 63) + 1, ~0ULL}) {
    const Remainder modulo(d);
    for (const std::uint64_t r : std::initializer_list<std::uint64_t>{
             0, 1, d - 1, d, d + 1, ~std::uint64_t{0}, ~std::uint64_t{0} - 1, (0 - d) % d}) {
      ASSERT_EQ(modulo.of(r), r % d) << r << " % " << d;
    }
    for (int i = 0; i < 100'000; ++i) {
      const std::uint64_t r = random();
      ASSERT_EQ(modulo.of(r), r % d) << r << " % " << d;
    }
  }
}

}  // namespace
}  // namespace dlprobe::stats
