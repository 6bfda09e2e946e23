// Every op case on every backend row of this binary in every precision the row runs, against the
// reference functions in fp64: one test per (backend, op, precision), e.g.
// engine/BackendOps.MatchTheFp64Reference/onednn_conv2d_forward_bf16.
#include <gtest/gtest.h>

#include "backend_ops.h"

namespace dlprobe::testing {
namespace {

class BackendOps : public ::testing::TestWithParam<OpTest> {};

// Puts the backend back into strict fp32 however the test ends: the backend is shared.
class MathModeFor {
 public:
  MathModeFor(Backend& b, MathMode m) : backend_(b) { backend_.set_math_mode(m); }
  ~MathModeFor() { backend_.set_math_mode(MathMode::strict_fp32); }
  MathModeFor(const MathModeFor&) = delete;
  MathModeFor& operator=(const MathModeFor&) = delete;

 private:
  Backend& backend_;
};

TEST_P(BackendOps, MatchTheFp64Reference) {
  const OpTest& t = GetParam();
  OpenedBackend* b = shared_backend(*t.row);
  ASSERT_NE(b, nullptr);
  // Casts and fills are conversions every backend runs in every dtype.
  const bool converts =
      t.op->precisions == Precisions::storage || t.op->precisions == Precisions::halves;
  if (!converts && t.row->unavailable) {
    if (const auto why = t.row->unavailable(*b->backend, t.precision)) GTEST_SKIP() << *why;
  }
  const MathModeFor mode(*b->backend, t.precision.math);
  for (const Variant& v : t.op->variants(t.precision)) {
    SCOPED_TRACE(v.label);
    const Result<Values> want = v.reference(v.tensors);
    ASSERT_TRUE(want.has_value()) << want.status().message();
    const Result<Values> got = run_variant(*b, v);
    ASSERT_TRUE(got.has_value()) << got.status().message();
    const ::testing::AssertionResult ran =
        t.row->after_op ? t.row->after_op(*b->backend, t.op->name, t.precision)
                        : ::testing::AssertionSuccess();
    EXPECT_TRUE(ran);
    EXPECT_TRUE(compare(v, *got, *want)) << ran.message();
    if (t.row->returns_scratch) {
      EXPECT_EQ(b->allocator->stats().all.live_count, 0) << "a slot kept scratch memory";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(engine, BackendOps, ::testing::ValuesIn(op_tests()),
                         [](const ::testing::TestParamInfo<OpTest>& tp) {
                           return op_test_name(tp.param);
                         });

// Each row says which optional ops it offers, and the table runs them by that: the backend must
// agree.
class BackendRows : public ::testing::TestWithParam<const BackendRow*> {};

TEST_P(BackendRows, OfferWhatTheirRowSays) {
  const BackendRow& row = *GetParam();
  OpenedBackend* b = shared_backend(row);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->backend->fuses_batch_norm_relu(), row.offers.fused_batch_norm_relu);
  EXPECT_EQ(b->backend->fuses_relu_backward_add(), row.offers.fused_relu_backward_add);
  EXPECT_EQ(b->backend->recomputes_max_pool_input(), row.offers.recomputed_max_pool);
  // ResNet-50's stem at batch 2, in each floating dtype; in NCHW no row fuses it.
  for (DType dtype : {DType::fp32, DType::fp16, DType::bf16}) {
    const TensorDesc stem = TensorDesc::make({2, 64, 112, 112}, dtype, Layout::nhwc).value();
    EXPECT_EQ(b->backend->fuses_max_pool_batch_norm_backward(stem, {}),
              row.offers.fused_max_pool_backward)
        << dtype_name(dtype);
    EXPECT_FALSE(b->backend->fuses_max_pool_batch_norm_backward(stem.with_layout(Layout::nchw), {}))
        << dtype_name(dtype);
  }
}

std::vector<const BackendRow*> rows() {
  std::vector<const BackendRow*> out;
  for (const BackendRow& r : backend_rows()) out.push_back(&r);
  return out;
}

INSTANTIATE_TEST_SUITE_P(engine, BackendRows, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<const BackendRow*>& tp) {
                           return std::string(tp.param->name);
                         });

}  // namespace
}  // namespace dlprobe::testing
