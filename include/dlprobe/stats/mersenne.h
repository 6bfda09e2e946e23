// The bootstraps' draws: MT19937-64 (std::mt19937_64's generator, its output the same number for
// number) at a quarter of the cost, and the remainder of a draw by the block count without a
// division instruction. The bootstraps draw millions of numbers each, and the trend of a history
// whose every configuration is flagged draws hundreds of millions.
#pragma once

#include <array>
#include <cstdint>

namespace dlprobe::stats {

// Written by hand because libstdc++'s twist chooses the matrix term with a branch on a random bit,
// which the processor mispredicts half the time; here it is a mask, and the tempering runs over
// the whole state at once, so that both loops vectorize. The seeding and the recurrence are the
// standard's ([rand.eng.mers], the parameters of [rand.predef]).
class Mt19937_64 {
 public:
  using result_type = std::uint64_t;

  explicit Mt19937_64(std::uint64_t seed) {
    state_[0] = seed;
    for (std::size_t i = 1; i < kN; ++i) {
      state_[i] = 6364136223846793005ULL * (state_[i - 1] ^ (state_[i - 1] >> 62)) + i;
    }
  }

  std::uint64_t operator()() {
    if (next_ == kN) refill();
    return out_[next_++];
  }

 private:
  static constexpr std::size_t kN = 312;
  static constexpr std::size_t kM = 156;

  static std::uint64_t twist(std::uint64_t x, std::uint64_t next, std::uint64_t far) {
    const std::uint64_t y = (x & 0xFFFFFFFF80000000ULL) | (next & 0x7FFFFFFFULL);
    return far ^ (y >> 1) ^ ((0 - (y & 1)) & 0xB5026F5AA96619E9ULL);
  }

  void refill() {
    std::size_t k = 0;
    for (; k < kN - kM; ++k) state_[k] = twist(state_[k], state_[k + 1], state_[k + kM]);
    for (; k < kN - 1; ++k) state_[k] = twist(state_[k], state_[k + 1], state_[k + kM - kN]);
    state_[kN - 1] = twist(state_[kN - 1], state_[0], state_[kM - 1]);
    for (std::size_t i = 0; i < kN; ++i) {
      std::uint64_t z = state_[i];
      z ^= (z >> 29) & 0x5555555555555555ULL;
      z ^= (z << 17) & 0x71D67FFFEDA60000ULL;
      z ^= (z << 37) & 0xFFF7EEE000000000ULL;
      z ^= z >> 43;
      out_[i] = z;
    }
    next_ = 0;
  }

  std::array<std::uint64_t, kN> state_{};
  std::array<std::uint64_t, kN> out_{};
  std::size_t next_ = kN;
};

// r % d for a d fixed over many r, the same value as the % operator, without its 64-bit
// division (tens of cycles, one per bootstrap draw): Lemire, Kaser and Kurz, "Faster remainder by
// direct computation" (2019), whose 128-bit constant makes it exact for every 64-bit r and d.
class Remainder {
 public:
  explicit Remainder(std::uint64_t d) : d_(d), m_(~U128{0} / d + 1) {}
  std::uint64_t of(std::uint64_t r) const {
    const U128 low = m_ * r;  // the fraction r / d, modulo 1, in 128 bits
    const U128 bottom = ((low & ~std::uint64_t{0}) * d_) >> 64;
    const U128 top = (low >> 64) * d_;
    return static_cast<std::uint64_t>((bottom + top) >> 64);
  }

 private:
  __extension__ typedef unsigned __int128 U128;
  std::uint64_t d_;
  U128 m_;
};

}  // namespace dlprobe::stats
