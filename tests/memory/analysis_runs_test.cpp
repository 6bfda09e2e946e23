// A memory analysis over a grid of configurations on the reference backend: which steps it
// measures, what comes out of each configuration and in which order, the results record of each,
// and calibrations read back from a results file.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "analysis_test_util.h"
#include "dlprobe/memory/analysis_json.h"
#include "dlprobe/memory/analysis_runs.h"
#include "dlprobe/results/writer.h"

namespace dlprobe::memory {
namespace {

using testing::small_config;

class Recorder final : public AnalysisObserver {
 public:
  void measuring(const engine::StepConfig& step, const GpuMemoryOption& gpu_memory,
                 bool calibrating) override {
    measured.push_back({step.batch, gpu_memory.text, calibrating});
  }
  Status finished(const Outcome& outcome) override {
    outcomes.push_back(outcome);
    return Status::ok();
  }
  void predicted(const PredictedMaxBatch& max_batch) override { largest.push_back(max_batch); }

  struct Measured {
    std::int64_t batch;
    std::string gpu_memory;
    bool calibrating;
    bool operator==(const Measured&) const = default;
  };
  std::vector<Measured> measured;
  std::vector<Outcome> outcomes;
  std::vector<PredictedMaxBatch> largest;
};

AnalysisOptions grid(std::vector<std::int64_t> batches, std::vector<std::string> modes) {
  AnalysisOptions o;
  o.base = small_config();
  o.batches = std::move(batches);
  o.precisions = {engine::Precision::fp32};
  for (const std::string& m : modes) o.gpu_memory.push_back(parse_gpu_memory(m).value());
  return o;
}

// A limit a little above what batch 5 needs, so the largest batch under it is at least 5.
std::uint64_t limit_above_batch_5() {
  SimulationOptions at5;
  at5.step = small_config(5);
  Result<StepMemory> five = simulate_step(at5);
  EXPECT_TRUE(five.has_value()) << five.status().message();
  return static_cast<std::uint64_t>(five.has_value() ? five->reserved_peak_bytes : 0) + (1u << 20);
}

TEST(AnalysisRuns, MeasuresEachConfigurationBesideWhatItsCalibrationPredicts) {
  AnalysisOptions o = grid({4, 2}, {"grow", "planned"});
  o.session.emplace();
  Recorder r;
  const Status s = run_analysis(o, r);
  ASSERT_TRUE(s.is_ok()) << s.message();
  // The smallest batch first, for its calibration; then the others, the calibration run reused.
  const std::vector<Recorder::Measured> want = {
      {2, "grow", true}, {4, "grow", false}, {2, "planned", true}, {4, "planned", false}};
  EXPECT_EQ(r.measured, want);
  ASSERT_EQ(r.outcomes.size(), 4u);
  for (std::size_t i = 0; i < r.outcomes.size(); ++i) {
    const Outcome& out = r.outcomes[i];
    SCOPED_TRACE(i);
    ASSERT_TRUE(out.failure.is_ok()) << out.failure.message();
    EXPECT_EQ(out.step.batch, i % 2 == 0 ? 4 : 2);
    EXPECT_EQ(out.gpu_memory.text, i < 2 ? "grow" : "planned");
    EXPECT_EQ(out.step.memory_plan,
              i < 2 ? engine::MemoryPlan::dynamic : engine::MemoryPlan::planned);
    EXPECT_EQ(out.device, "cpu");
    ASSERT_TRUE(out.measured && out.predicted && out.calibration);
    EXPECT_EQ(out.measured->step.batch, out.step.batch);
    EXPECT_EQ(out.calibration->batch, 2);
    EXPECT_EQ(out.calibration_run, out.step.batch == 2);
    EXPECT_TRUE(out.misfit.empty());
    // The reference backend takes no workspace: the prediction is the measurement.
    EXPECT_EQ(out.predicted->step.peak.allocated_bytes, out.measured->memory.peak.allocated_bytes);

    const std::optional<results::Configuration> c = results_record(out);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->status, results::RunStatus::ok);
    EXPECT_EQ(c->settings.batch, out.step.batch);
    EXPECT_EQ(c->settings.device, "cpu");
    EXPECT_EQ(c->settings.gpu_memory, out.gpu_memory.text);
    // As the flags and bench's results spell it.
    EXPECT_EQ(c->settings.layout, out.step.layout == Layout::nhwc ? "nhwc" : "nchw");
    ASSERT_TRUE(c->memory.has_value());
    EXPECT_EQ(c->memory->source, "allocator");
    EXPECT_TRUE(c->memory->allocator_stats.is_object());
    const nlohmann::json& a = c->memory->analysis;
    EXPECT_EQ(a["measured"]["peak"]["allocated_bytes"], out.measured->memory.peak.allocated_bytes);
    EXPECT_EQ(a["calibration"]["batch"], out.step.batch);
    EXPECT_EQ(a["prediction_calibration"]["batch"], 2);
    EXPECT_EQ(a["memory_plan"], i < 2 ? "dynamic" : "planned");
    EXPECT_TRUE(a["max_batch"].is_null());
  }
}

// Layout and memory plan left open: each precision in the fastest the engine knows for the
// device (device::fastest_settings), a GPU's when predicting, the CPU's when measured there.
TEST(AnalysisRuns, OpenChoicesAreTheFastestForTheDevice) {
  AnalysisOptions o = grid({2}, {});
  o.precisions = {engine::Precision::fp32, engine::Precision::fp16};
  Recorder predicted;
  ASSERT_TRUE(run_analysis(o, predicted).is_ok());
  ASSERT_EQ(predicted.outcomes.size(), 2u);
  for (const Outcome& out : predicted.outcomes) {
    EXPECT_EQ(out.gpu_memory.text, "planned");
    EXPECT_EQ(out.step.memory_plan, engine::MemoryPlan::planned);
    EXPECT_EQ(out.step.layout,
              out.step.precision == engine::Precision::fp32 ? Layout::nchw : Layout::nhwc);
  }

  o.precisions = {engine::Precision::fp32};
  o.session.emplace();
  Recorder measured;
  ASSERT_TRUE(run_analysis(o, measured).is_ok());
  ASSERT_EQ(measured.outcomes.size(), 1u);
  EXPECT_EQ(measured.outcomes[0].gpu_memory.text, "grow");
  EXPECT_EQ(measured.outcomes[0].step.layout, Layout::nhwc);

  // What is named is what runs.
  o.layout = Layout::nchw;
  o.gpu_memory = {parse_gpu_memory("planned").value()};
  Recorder named;
  ASSERT_TRUE(run_analysis(o, named).is_ok());
  ASSERT_EQ(named.outcomes.size(), 1u);
  EXPECT_EQ(named.outcomes[0].gpu_memory.text, "planned");
  EXPECT_EQ(named.outcomes[0].step.layout, Layout::nchw);
}

TEST(AnalysisRuns, AGivenCalibrationPredictsInPlaceOfTheMeasuredOne) {
  AnalysisOptions o = grid({2}, {"grow"});
  o.session.emplace();
  o.calibration_batch = 4;
  Calibration other_precision;
  other_precision.model = model::model_name(small_config().model);
  other_precision.precision = "fp16";
  Calibration given = other_precision;
  given.precision = "fp32";
  given.device = "elsewhere";
  given.batch = 7;
  o.calibrations = {other_precision, given};
  Recorder r;
  ASSERT_TRUE(run_analysis(o, r).is_ok());
  const std::vector<Recorder::Measured> want = {{4, "grow", true}, {2, "grow", false}};
  EXPECT_EQ(r.measured, want);
  ASSERT_EQ(r.outcomes.size(), 1u);
  ASSERT_TRUE(r.outcomes[0].calibration.has_value());
  EXPECT_EQ(r.outcomes[0].calibration->device, "elsewhere");
  EXPECT_FALSE(r.outcomes[0].calibration_run);
  // What this run measured is still recorded as its own calibration.
  EXPECT_EQ(r.outcomes[0].measured->calibration.batch, 2);
  EXPECT_EQ(find_calibration(o.calibrations, small_config()), &o.calibrations[1]);
  EXPECT_EQ(find_calibration(o.calibrations,
                             small_config(2, engine::MemoryPlan::dynamic, engine::Precision::bf16)),
            nullptr);
}

TEST(AnalysisRuns, PredictsWithoutADeviceAndRecordsWhatDoesNotFit) {
  AnalysisOptions o = grid({2}, {"grow", "limit:1MiB"});
  o.device_bytes = limit_above_batch_5();
  Recorder r;
  const Status s = run_analysis(o, r);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(r.measured.empty());
  ASSERT_EQ(r.outcomes.size(), 2u);
  const Outcome& fits = r.outcomes[0];
  ASSERT_TRUE(fits.failure.is_ok()) << fits.failure.message();
  EXPECT_FALSE(fits.measured.has_value());
  ASSERT_TRUE(fits.predicted.has_value());
  EXPECT_FALSE(fits.predicted->calibrated);
  EXPECT_FALSE(fits.calibration.has_value());
  std::optional<results::Configuration> c = results_record(fits);
  ASSERT_TRUE(c.has_value() && c->memory.has_value());
  EXPECT_EQ(c->settings.device, "predicted");
  EXPECT_EQ(c->memory->source, "prediction");
  EXPECT_TRUE(c->memory->allocator_stats.is_null());
  EXPECT_TRUE(c->memory->analysis["measured"].is_null());
  EXPECT_EQ(c->memory->analysis["predicted"]["peak"]["allocated_bytes"],
            fits.predicted->step.peak.allocated_bytes);
  // The weights alone do not fit a 1 MiB limit: a result, not an error of the analysis.
  const Outcome& does_not = r.outcomes[1];
  EXPECT_EQ(does_not.failure.code(), Errc::out_of_memory);
  c = results_record(does_not);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status, results::RunStatus::oom);
  EXPECT_EQ(c->error, does_not.failure.message());
  EXPECT_FALSE(c->memory.has_value());
  // With the device's memory given, the largest batch that fits it, for each memory mode (the
  // search runs the allocator in limit mode, whatever the mode's own).
  ASSERT_EQ(r.largest.size(), 2u);
  for (const PredictedMaxBatch& m : r.largest) {
    EXPECT_EQ(m.limit_bytes, *o.device_bytes);
    EXPECT_EQ(m.largest, predict_max_batch(small_config(1), *o.device_bytes, nullptr).value());
    EXPECT_GE(m.largest, 5);
  }
}

// The max-batch search on the reference backend under limit_above_batch_5(), calibrated at
// `calibration_batch`: it measures that batch first, then hands over its one configuration.
Outcome search_from(std::int64_t calibration_batch, AnalysisOptions& o) {
  o = grid({}, {"grow"});
  o.max_batch_limit = limit_above_batch_5();
  o.session.emplace();
  o.calibration_batch = calibration_batch;
  Recorder r;
  const Status s = run_analysis(o, r);
  EXPECT_TRUE(s.is_ok()) << s.message();
  // The calibration first (halved while it does not fit), each said as it starts.
  EXPECT_FALSE(r.measured.empty());
  if (!r.measured.empty()) {
    EXPECT_EQ(r.measured.front(), (Recorder::Measured{calibration_batch, "grow", true}));
  }
  for (const Recorder::Measured& m : r.measured) EXPECT_TRUE(m.calibrating);
  EXPECT_EQ(r.outcomes.size(), 1u);
  return r.outcomes.empty() ? Outcome{} : r.outcomes[0];
}

TEST(AnalysisRuns, FindsTheLargestBatchUnderALimitAndRecordsItsMeasurement) {
  AnalysisOptions o;
  const Outcome out = search_from(2, o);
  ASSERT_TRUE(out.failure.is_ok()) << out.failure.message();
  ASSERT_TRUE(out.max_batch.has_value());
  EXPECT_GE(out.max_batch->found, 5);
  EXPECT_TRUE(out.max_batch->next_fails);
  const std::optional<results::Configuration> c = results_record(out);
  ASSERT_TRUE(c.has_value() && c->memory.has_value());
  EXPECT_EQ(c->settings.batch, out.max_batch->found);
  EXPECT_EQ(c->memory->source, "allocator");
  EXPECT_EQ(c->memory->analysis["max_batch"]["found"], out.max_batch->found);
  EXPECT_EQ(c->memory->analysis["measured"]["peak"]["allocated_bytes"],
            out.max_batch->at_found->memory.peak.allocated_bytes);

  // Without a device, the prediction alone.
  o.session.reset();
  Recorder predicted;
  ASSERT_TRUE(run_analysis(o, predicted).is_ok());
  EXPECT_TRUE(predicted.outcomes.empty());
  ASSERT_EQ(predicted.largest.size(), 1u);
  EXPECT_EQ(predicted.largest[0].largest, out.max_batch->predicted);
}

// A calibration batch over the limit is halved until one fits (64 to 4 here), not dropped to batch
// 1, which ResNet-18 cannot train at on 32x32 images (batch norm needs more than one value per
// channel): the search then finds what it finds from a calibration that fits.
TEST(AnalysisRuns, ACalibrationBatchOverTheLimitIsHalvedUntilOneFits) {
  AnalysisOptions from2;
  const Outcome want = search_from(2, from2);
  AnalysisOptions o;
  const Outcome out = search_from(64, o);
  ASSERT_TRUE(out.failure.is_ok()) << out.failure.message();
  ASSERT_TRUE(out.max_batch.has_value() && want.max_batch.has_value());
  EXPECT_GE(out.max_batch->found, 5);
  EXPECT_EQ(out.max_batch->found, want.max_batch->found);
  EXPECT_TRUE(out.max_batch->next_fails);
  const std::optional<results::Configuration> c = results_record(out);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status, results::RunStatus::ok);
  EXPECT_EQ(c->settings.batch, out.max_batch->found);
}

TEST(AnalysisRuns, ASearchUnderWhichNothingRanHasNoRecordAndAGridNeedsABatch) {
  Outcome out;
  out.step = small_config(1);
  out.max_batch = MaxBatchResult{};
  EXPECT_FALSE(results_record(out).has_value());
  Recorder r;
  EXPECT_EQ(run_analysis(grid({}, {"grow"}), r).code(), Errc::invalid_argument);
  EXPECT_TRUE(r.outcomes.empty());
}

TEST(AnalysisRuns, CalibrationsReadBackFromTheResultsFile) {
  AnalysisOptions o = grid({2}, {"grow"});
  o.session.emplace();
  Recorder measured;
  ASSERT_TRUE(run_analysis(o, measured).is_ok());
  o.session.reset();
  Recorder predicted;
  ASSERT_TRUE(run_analysis(o, predicted).is_ok());
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("dlprobe_runs_{}.json", getpid()))
          .string();
  results::Context context;
  context.date = "2025-01-01T00:00:00Z";
  auto writer = results::ResultsWriter::create(path, context);
  ASSERT_TRUE(writer.has_value()) << writer.status().message();
  ASSERT_TRUE(writer->add(*results_record(predicted.outcomes[0])).is_ok());
  Result<std::vector<Calibration>> none = read_calibrations(path);
  ASSERT_TRUE(none.has_value()) << none.status().message();
  EXPECT_TRUE(none->empty());
  ASSERT_TRUE(writer->add(*results_record(measured.outcomes[0])).is_ok());
  Result<std::vector<Calibration>> one = read_calibrations(path);
  ASSERT_TRUE(one.has_value()) << one.status().message();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].batch, 2);
  EXPECT_EQ((*one)[0].device, "cpu (reference)");
  std::filesystem::remove(path);
  EXPECT_FALSE(read_calibrations(path).has_value());
}

}  // namespace
}  // namespace dlprobe::memory
