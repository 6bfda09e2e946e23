// Shared by the CPU backend tests: a backend over a host-memory allocator, inputs rounded to the
// dtype under test, and dtype-aware tolerances for comparing with the reference backend in fp64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/engine/cpu_backend.h"
#include "test_util.h"

namespace dlprobe::testing {

class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto allocator = memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>());
    ASSERT_TRUE(allocator.has_value()) << allocator.status().message();
    allocator_ = std::move(allocator).value();
    auto backend = make_cpu_backend(*allocator_);
    ASSERT_TRUE(backend.has_value()) << backend.status().message();
    backend_ = std::move(backend).value();
  }
  // Before the allocator goes: every scratch buffer must have been given back.
  void TearDown() override {
    if (allocator_) {
      EXPECT_EQ(allocator_->stats().all.live_count, 0) << "a slot kept scratch memory";
    }
    backend_.reset();
  }

  // Whether this CPU runs bf16 in oneDNN: asked of the backend itself, through a tiny ReLU.
  bool bf16_supported() {
    HostTensor x = HostTensor::zeros(desc({1, 1, 1, 2}, DType::bf16));
    HostTensor y(x.desc());
    return backend_->relu_forward(x.view(), y.view()).is_ok();
  }

  std::unique_ptr<memory::CachingAllocator> allocator_;
  std::unique_ptr<Backend> backend_;
};

// Random values in [lo, hi) rounded to `dtype` (the backend's input), and the same values in fp64
// (the reference's input), so the comparison measures only the backend's arithmetic.
struct Pair {
  HostTensor low;
  HostTensor f64;
};
inline Pair pair(const Shape& s, std::uint64_t seed, DType dtype, Layout l = Layout::nchw,
                 double lo = -1.0, double hi = 1.0) {
  HostTensor low = rand(s, seed, DType::fp64, l, lo, hi).to_dtype(dtype).value();
  HostTensor f64 = low.to_dtype(DType::fp64).value();
  return {std::move(low), std::move(f64)};
}

inline HostTensor to64(const HostTensor& t) {
  return t.to_dtype(DType::fp64).value();
}
inline HostTensor to_dtype(const HostTensor& t, DType d) {
  return t.to_dtype(d).value();
}
// An output tensor for the backend to fill: NaN until written (HostTensor's default).
inline HostTensor out(const TensorDesc& d) {
  return HostTensor(d);
}

// Tolerance of an output that sums `terms` products of O(1) values: fp32 rounds each step at
// 2^-24, so sqrt(terms) * 1e-6 leaves room for blocked summation orders and stays far below any
// wrong term. bf16 outputs round once at 2^-9 after fp32 accumulation.
struct Tol {
  double rtol;
  double atol;
};
inline Tol tol(DType dtype, double terms = 1) {
  if (dtype == DType::bf16) return {1e-2, 1e-2 * std::sqrt(terms)};
  return {1e-5, 1e-6 * std::sqrt(terms) + 1e-6};
}

inline ::testing::AssertionResult close(const HostTensor& actual, const HostTensor& expected,
                                        Tol t) {
  return all_close(to64(actual), expected, t.rtol, t.atol);
}

}  // namespace dlprobe::testing
