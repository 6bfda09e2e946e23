// The table's comparison can fail: every checked output of every op case (in its first variant),
// taken from a real run on the reference backend (which passes) and then negated, zeroed, or with
// one element moved twice as far as its tolerance allows, must fail the comparison the table makes
// of it; and tolerance() gives the figures the table documents.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "backend_ops.h"
#include "test_util.h"

namespace dlprobe::testing {
namespace {

struct Tamper {
  const char* name;
  std::function<void(HostTensor& actual, const HostTensor& reference, Precision, const Check&)>
      apply;
};

const Tamper kTampers[] = {
    {"negated",
     [](HostTensor& a, const HostTensor&, Precision, const Check&) {
       for (std::int64_t i = 0; i < a.numel(); ++i) a.set(i, -a.get(i));
     }},
    {"zeroed", [](HostTensor& a, const HostTensor&, Precision, const Check&) { a.fill(0.0); }},
    // The first finite element, moved by twice what the tolerance allows it and by a step no
    // rounding to its dtype undoes.
    {"one element off",
     [](HostTensor& a, const HostTensor& reference, Precision p, const Check& c) {
       const HostTensor ref = reference.to_dtype(a.dtype()).value();
       const Tolerance t = tolerance(a.dtype(), p, c);
       for_each_index(a.shape(), [&, done = false](std::array<std::int64_t, 4> i) mutable {
         const std::int64_t at = offset_of(a.desc(), i);
         const double v = a.get(at);
         if (done || !std::isfinite(v)) return;
         const double r = value_at(ref, i);
         a.set(at, v + 2 * (t.tol + t.eps * std::abs(r)) + std::max(1.0, std::abs(v)) / 64);
         done = true;
       });
     }},
};

class WrongResults : public ::testing::TestWithParam<OpTest> {};

TEST_P(WrongResults, FailTheComparison) {
  const OpTest& t = GetParam();
  OpenedBackend* b = shared_backend(*t.row);
  ASSERT_NE(b, nullptr);
  // Every output of an op is there in its first variant; the others differ in shape and values.
  const std::vector<Variant> variants = t.op->variants(t.precision);
  ASSERT_FALSE(variants.empty());
  const Variant& v = variants.front();
  SCOPED_TRACE(v.label);
  const Result<Values> want = v.reference(v.tensors);
  ASSERT_TRUE(want.has_value()) << want.status().message();
  const Result<Values> got = run_variant(*b, v);
  ASSERT_TRUE(got.has_value()) << got.status().message();
  ASSERT_TRUE(compare(v, *got, *want));
  for (const auto& [key, check] : v.checks) {
    const HostTensor& reference = want->at(key);
    for (const Tamper& tamper : kTampers) {
      // Where the reference itself, so tampered, still passes (an output that is zero within its
      // tolerance, negated or zeroed), there is nothing to catch.
      HostTensor visible = reference;
      tamper.apply(visible, reference, t.precision, check);
      if (matches(visible, reference, t.precision, check)) continue;
      HostTensor bad = got->at(key);
      tamper.apply(bad, reference, t.precision, check);
      EXPECT_FALSE(matches(bad, reference, t.precision, check)) << key << " " << tamper.name;
    }
  }
}

std::vector<OpTest> reference_tests() {
  std::vector<OpTest> out;
  for (const OpTest& t : op_tests()) {
    if (t.row->name == "reference") out.push_back(t);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(engine, WrongResults, ::testing::ValuesIn(reference_tests()),
                         [](const ::testing::TestParamInfo<OpTest>& tp) {
                           return op_test_name(tp.param);
                         });

TEST(Tolerance, ByDtypeAndPrecision) {
  const auto near = [](Tolerance a, Tolerance b) {
    return std::abs(a.tol - b.tol) < 1e-15 && std::abs(a.eps - b.eps) < 1e-15;
  };
  // tol + per-term error * sqrt(terms), times the scale; eps by dtype.
  EXPECT_TRUE(near(tolerance(DType::fp32, kFp32, {}), {2e-5, 1e-5}));
  EXPECT_TRUE(near(tolerance(DType::fp32, kFp32, {.terms = 100, .scale = 2}), {2.2e-4, 1e-5}));
  EXPECT_TRUE(near(tolerance(DType::fp16, kFp16, {}), {1.01e-3, 2e-3}));
  EXPECT_TRUE(near(tolerance(DType::bf16, kBf16, {.terms = 4}), {8.02e-3, 1.6e-2}));
  EXPECT_TRUE(near(tolerance(DType::fp32, kTf32, {.terms = 16}), {1.4e-2, 5e-3}));
  EXPECT_TRUE(near(tolerance(DType::bf16, kBf16, {.exact = true}), {0.0, 0.0}));
}

TEST(Matches, RoundsTheReferenceToTheDtypeAndNamesTheWorstElement) {
  // 1 + 2^-11 lies halfway between two fp16 values and rounds to 1 (ties to even) first, so the
  // reference matches an exact 1.
  HostTensor ref(desc({3}));
  ref.fill(1.0 + 1.0 / 1024 / 2);
  HostTensor ones(desc({3}, DType::fp16));
  ones.fill(1.0);
  EXPECT_TRUE(matches(ones, ref, kFp16, {.exact = true}));
  HostTensor off = ones;
  off.set(2, 1.5);
  const ::testing::AssertionResult r = matches(off, ref, kFp16);
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("1 of 3 fp16 elements differ"), std::string::npos)
      << r.message();
  EXPECT_NE(std::string(r.message()).find("at (2): 1.5 vs reference 1"), std::string::npos)
      << r.message();
  // NaN meets only NaN, an infinity only the same one.
  HostTensor nan = ref;
  nan.set(0, std::numeric_limits<double>::quiet_NaN());
  EXPECT_FALSE(matches(ones.to_dtype(DType::fp64).value(), nan, kFp32));
  EXPECT_TRUE(matches(nan, nan, kFp32, {.exact = true}));
  HostTensor inf = ref;
  inf.set(1, std::numeric_limits<double>::infinity());
  HostTensor minus_inf = inf;
  minus_inf.set(1, -std::numeric_limits<double>::infinity());
  EXPECT_FALSE(matches(minus_inf, inf, kFp32));
}

}  // namespace
}  // namespace dlprobe::testing
