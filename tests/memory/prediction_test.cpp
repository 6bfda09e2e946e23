// Prediction against measurement: exact on the reference backend (no workspace), within a few
// percent on oneDNN from a calibration at another batch; simulations under limits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "analysis_test_util.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/session.h"

namespace dlprobe::memory {
namespace {

using engine::MemoryPlan;
using engine::Precision;
using testing::small_config;

std::unique_ptr<Session> open_session(device::BackendKind backend,
                                      AllocatorOptions allocator = {}) {
  SessionOptions o;
  o.backend = backend;
  o.allocator = allocator;
  Result<std::unique_ptr<Session>> s = Session::open(o);
  EXPECT_TRUE(s.has_value()) << s.status().message();
  return s.has_value() ? std::move(s).value() : nullptr;
}

TEST(Prediction, EqualsTheMeasurementOnTheReferenceBackend) {
  std::unique_ptr<Session> session = open_session(device::BackendKind::reference);
  ASSERT_TRUE(session);
  // The sanitizer build runs the reference loops several times slower: fp32 only there.
  std::vector<Precision> precisions = {Precision::fp32};
  if (!testing::kSanitized) precisions.push_back(Precision::bf16);
  for (MemoryPlan plan : {MemoryPlan::dynamic, MemoryPlan::planned}) {
    for (Precision p : precisions) {
      const engine::StepConfig c = small_config(4, plan, p);
      SCOPED_TRACE(fmt::format("{} {}", engine::memory_plan_name(plan), engine::precision_name(p)));
      Result<Measurement> m = session->measure(c);
      ASSERT_TRUE(m.has_value()) << m.status().message();
      Result<Prediction> pred = predict(c, &m->calibration);
      ASSERT_TRUE(pred.has_value()) << pred.status().message();
      EXPECT_EQ(pred->workspace_bytes, 0);
      EXPECT_EQ(pred->step.peak.allocated_bytes, m->memory.peak.allocated_bytes);
      EXPECT_EQ(pred->step.peak.by_category, m->memory.peak.by_category);
      EXPECT_EQ(pred->step.peak.requested_bytes, m->memory.peak.requested_bytes);
      EXPECT_EQ(pred->step.reserved_peak_bytes, m->memory.reserved_peak_bytes);
      EXPECT_EQ(pred->step.peak_call, m->memory.peak_call);
      EXPECT_EQ(pred->step.timeline.size(), m->memory.timeline.size());
      EXPECT_FALSE(pred->process_bytes().has_value());  // no NVML figure on the CPU
      EXPECT_FALSE(m->reconciliation.has_value());
      // The session frees everything between runs.
      EXPECT_EQ(session->allocator().stats().all.allocated_bytes, 0);
      EXPECT_EQ(session->allocator().stats().reserved_bytes, 0);
    }
  }
}

TEST(Prediction, CarriesAMeasuredWorkspaceToAnotherBatch) {
  if (!device::backend_built(device::BackendKind::onednn)) GTEST_SKIP() << "built without oneDNN";
  std::unique_ptr<Session> session = open_session(device::BackendKind::onednn);
  ASSERT_TRUE(session);
  Result<Measurement> small = session->measure(small_config(2));
  ASSERT_TRUE(small.has_value()) << small.status().message();
  EXPECT_GT(small->calibration.workspace_bytes, 0);  // oneDNN's scratchpads and reorders
  const engine::StepConfig big = small_config(8);
  Result<Prediction> pred = predict(big, &small->calibration);
  ASSERT_TRUE(pred.has_value()) << pred.status().message();
  EXPECT_EQ(pred->workspace_model, "per call");
  Result<Measurement> measured = session->measure(big);
  ASSERT_TRUE(measured.has_value()) << measured.status().message();
  const double error = std::abs(static_cast<double>(pred->step.peak.allocated_bytes) /
                                    static_cast<double>(measured->memory.peak.allocated_bytes) -
                                1.0);
  EXPECT_LT(error, 0.03) << pred->step.peak.allocated_bytes << " predicted, "
                         << measured->memory.peak.allocated_bytes << " measured";
  // Without the calibration the workspace is missing from the prediction.
  Result<Prediction> bare = predict(big, nullptr);
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->step.peak[Category::workspace], 0);
  EXPECT_LT(bare->step.peak.allocated_bytes, pred->step.peak.allocated_bytes);
}

TEST(Prediction, RefusesACalibrationOfAnotherModelOrPrecision) {
  Calibration c;
  c.model = "resnet18-w16";
  c.precision = "fp16";
  const Result<Prediction> p = predict(small_config(), &c);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.status().code(), Errc::invalid_argument);
  EXPECT_NE(p.status().message().find("resnet18-w16 fp16"), std::string::npos);
}

TEST(Prediction, TakesEachCallsWorkspaceWhereTheCallListMatches) {
  // Planned: no alloc/free entries, so the profile's call count is the plan's.
  const engine::StepConfig c = small_config(2, MemoryPlan::planned);
  Result<Prediction> bare = predict(c, nullptr);
  ASSERT_TRUE(bare.has_value());
  Calibration cal;
  cal.model = model::model_name(c.model);
  cal.precision = "fp32";
  cal.workspace_bytes = 96 << 20;
  cal.workspace_held_bytes = 32 << 20;
  cal.calls = bare->step.workspace_by_call.size();
  // 64 MiB beyond the held 32 MiB during the call where the step peaks without them.
  const std::size_t at = bare->step.peak_call;
  ASSERT_GT(at, 0u);
  cal.workspace_by_call = {{at, 64 << 20}};
  Result<Prediction> p = predict(c, &cal);
  ASSERT_TRUE(p.has_value()) << p.status().message();
  EXPECT_EQ(p->workspace_model, "per call");
  EXPECT_EQ(p->step.workspace_peak_bytes, 96 << 20);
  EXPECT_EQ(p->step.workspace_by_call[at], 96 << 20);
  EXPECT_EQ(p->step.workspace_by_call[at - 1], 32 << 20);
  EXPECT_EQ(p->step.peak_call, at);
  EXPECT_EQ(p->step.peak[Category::workspace], 96 << 20);
  EXPECT_EQ(p->step.peak[Category::activations], bare->step.peak[Category::activations]);
  // The dynamic plan of the same step counts its calls the same way.
  Result<Prediction> dynamic = predict(small_config(2), &cal);
  ASSERT_TRUE(dynamic.has_value());
  EXPECT_EQ(dynamic->workspace_model, "per call");
  EXPECT_EQ(dynamic->step.workspace_peak_bytes, 96 << 20);
  // A profile of another call list cannot be placed: its peak is held instead.
  cal.calls += 1;
  Result<Prediction> held = predict(c, &cal);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->workspace_model, "held");
  EXPECT_EQ(held->step.peak[Category::workspace], 96 << 20);
}

TEST(Prediction, CountsWhatTheProcessHoldsOutsideTheAllocator) {
  Calibration c;
  c.model = model::model_name(small_config().model);
  c.precision = "fp32";
  c.workspace_bytes = 64 << 20;
  c.workspace_held_bytes = 64 << 20;
  c.outside_allocator_bytes = 500 << 20;
  Result<Prediction> with = predict(small_config(), &c);
  Result<Prediction> without = predict(small_config(), nullptr);
  ASSERT_TRUE(with.has_value() && without.has_value());
  EXPECT_EQ(with->step.peak[Category::workspace], 64 << 20);
  EXPECT_EQ(with->step.peak.allocated_bytes, without->step.peak.allocated_bytes + (64 << 20));
  ASSERT_TRUE(with->process_bytes().has_value());
  EXPECT_EQ(*with->process_bytes(), with->step.reserved_peak_bytes + (500 << 20));
}

TEST(Simulation, RunsOutOfMemoryUnderALimitAsTheDeviceWould) {
  SimulationOptions o;
  o.step = small_config(64);
  Result<StepMemory> free_run = simulate_step(o);
  ASSERT_TRUE(free_run.has_value()) << free_run.status().message();
  o.allocator.mode = Mode::limit;
  o.allocator.limit_bytes = static_cast<std::uint64_t>(free_run->reserved_peak_bytes) / 2;
  Result<StepMemory> limited = simulate_step(o);
  ASSERT_FALSE(limited.has_value());
  EXPECT_EQ(limited.status().code(), Errc::out_of_memory);
  EXPECT_NE(limited.status().message().find("cannot allocate"), std::string::npos);
  // A fraction is of the simulated device.
  SimulationOptions pre;
  pre.step = small_config();
  pre.allocator.mode = Mode::preallocate;
  pre.allocator.preallocate_fraction = 0.5;
  pre.device_bytes = 1ull << 30;
  Result<StepMemory> prealloc = simulate_step(pre);
  ASSERT_TRUE(prealloc.has_value()) << prealloc.status().message();
  EXPECT_EQ(prealloc->reserved_peak_bytes, 512 << 20);
}

}  // namespace
}  // namespace dlprobe::memory
