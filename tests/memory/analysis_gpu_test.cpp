// Memory analysis on a GPU (ctest -L gpu): prediction against measurement with the CUDA backend,
// NVML's figure for this process beside the allocator's, the planned step on cuDNN, and a limit
// that NVML confirms.
#include <gtest/gtest.h>

#include <cmath>

#include "dlprobe/memory/max_batch.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/session.h"

namespace dlprobe::memory {
namespace {

engine::StepConfig resnet50(std::int64_t batch, engine::Precision precision,
                            engine::MemoryPlan plan = engine::MemoryPlan::dynamic) {
  engine::StepConfig c;
  c.model = {model::Arch::resnet50, 224, 1000, false};
  c.batch = batch;
  c.precision = precision;
  c.layout = precision == engine::Precision::fp32 ? Layout::nchw : Layout::nhwc;
  c.memory_plan = plan;
  return c;
}

std::unique_ptr<Session> open_gpu(AllocatorOptions allocator = {},
                                  ConvEngineChoice algo = ConvEngineChoice::autotune) {
  SessionOptions o;
  o.device = {DeviceKind::cuda, 0};
  o.backend = device::BackendKind::cuda;
  o.allocator = allocator;
  o.conv.algo = algo;
  Result<std::unique_ptr<Session>> s = Session::open(o);
  EXPECT_TRUE(s.has_value()) << s.status().message();
  return s.has_value() ? std::move(s).value() : nullptr;
}

double relative_error(std::int64_t predicted, std::int64_t measured) {
  return std::abs(static_cast<double>(predicted) / static_cast<double>(measured) - 1.0);
}

TEST(MemoryAnalysisGpu, PredictsTheMeasuredPeakFromACalibrationAtAnotherBatch) {
  std::unique_ptr<Session> session = open_gpu();
  ASSERT_TRUE(session);
  for (engine::Precision p : {engine::Precision::fp32, engine::Precision::fp16}) {
    Result<Measurement> cal = session->measure(resnet50(32, p));
    ASSERT_TRUE(cal.has_value()) << cal.status().message();
    ASSERT_TRUE(cal->reconciliation.has_value()) << "NVML does not see this process";
    const Reconciliation& r = *cal->reconciliation;
    EXPECT_GE(r.nvml_process_bytes, r.reserved_bytes);
    EXPECT_GT(r.context_bytes, 0);
    ASSERT_TRUE(cal->calibration.outside_allocator_bytes.has_value());
    const engine::StepConfig big = resnet50(96, p);
    Result<Prediction> pred = predict(big, &cal->calibration);
    ASSERT_TRUE(pred.has_value()) << pred.status().message();
    Result<Measurement> m = session->measure(big);
    ASSERT_TRUE(m.has_value()) << m.status().message();
    EXPECT_LT(relative_error(pred->step.peak.allocated_bytes, m->memory.peak.allocated_bytes), 0.03)
        << engine::precision_name(p) << ": " << pred->step.peak.allocated_bytes << " predicted, "
        << m->memory.peak.allocated_bytes << " measured";
    ASSERT_TRUE(pred->process_bytes().has_value());
    ASSERT_TRUE(m->reconciliation.has_value());
    // The process figure adds the allocator's reserved pool, which the prediction follows less
    // closely than the allocated peak: autotuning's trial workspaces at the new batch (up to 2 GiB
    // each in fp32) pass through the real pool before the followed step and leave it cut
    // differently, and the prediction takes each call's workspace at the calibration batch's
    // size. On the H200 (2026-12-02) the process figure was 0.1-5.4 % from NVML's at batch 64-256
    // (lab/gpu/memory.sh) and 6.4 % here at fp16 batch 96, where the allocated peak was within
    // 0.2 %.
    EXPECT_LT(relative_error(*pred->process_bytes(), m->reconciliation->nvml_process_bytes), 0.08)
        << *pred->process_bytes() << " predicted for the process, NVML "
        << m->reconciliation->nvml_process_bytes;
  }
}

TEST(MemoryAnalysisGpu, PlannedStepTouchesTheAllocatorOnlyForWorkspace) {
  std::unique_ptr<Session> session = open_gpu();
  ASSERT_TRUE(session);
  // Planned first: the allocator's cumulative counts then hold its runs only.
  Result<Measurement> planned =
      session->measure(resnet50(64, engine::Precision::fp16, engine::MemoryPlan::planned));
  Result<Measurement> dynamic = session->measure(resnet50(64, engine::Precision::fp16));
  ASSERT_TRUE(dynamic.has_value()) << dynamic.status().message();
  ASSERT_TRUE(planned.has_value()) << planned.status().message();
  ASSERT_TRUE(planned->memory.arena.has_value());
  EXPECT_EQ(planned->stats[Category::activations].allocation_count, 0);
  EXPECT_LE(planned->memory.reserved_peak_bytes, dynamic->memory.reserved_peak_bytes);
  EXPECT_LE(static_cast<double>(planned->memory.arena->bytes),
            1.02 * static_cast<double>(planned->memory.arena->peak_live_bytes));
}

TEST(MemoryAnalysisGpu, ALimitHoldsAsNvmlSeesIt) {
  AllocatorOptions limited;
  limited.mode = Mode::limit;
  limited.limit_bytes = 6ull << 30;
  // cuDNN's heuristic engines: every trial has new shapes, and autotuning each would take minutes.
  std::unique_ptr<Session> session = open_gpu(limited, ConvEngineChoice::heuristic);
  ASSERT_TRUE(session);
  Result<Measurement> too_big = session->measure(resnet50(256, engine::Precision::fp16));
  ASSERT_FALSE(too_big.has_value());
  EXPECT_EQ(too_big.status().code(), Errc::out_of_memory) << too_big.status().message();
  Result<Measurement> cal = session->measure(resnet50(16, engine::Precision::fp16));
  ASSERT_TRUE(cal.has_value()) << cal.status().message();
  Result<MaxBatchResult> r = find_max_batch(*session, resnet50(1, engine::Precision::fp16),
                                            limited.limit_bytes, &cal->calibration, 1024);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_GT(r->found, 16);
  EXPECT_TRUE(r->next_fails);
  for (const MaxBatchTrial& t : r->trials) {
    if (!t.fits) continue;
    ASSERT_TRUE(t.nvml_process_bytes.has_value());
    EXPECT_LE(static_cast<std::uint64_t>(*t.nvml_process_bytes), limited.limit_bytes)
        << "batch " << t.batch;
  }
}

}  // namespace
}  // namespace dlprobe::memory
