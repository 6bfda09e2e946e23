// memory.analysis in the results file: its layout, calibrations read back, the results schema's
// additions round-tripping (and older files still reading), and the report's timeline chart.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <utility>

#include "analysis_test_util.h"
#include "dlprobe/memory/analysis_json.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/report/html.h"
#include "dlprobe/results/results.h"

namespace dlprobe::memory {
namespace {

using nlohmann::json;
using testing::small_config;

Prediction small_prediction(engine::MemoryPlan plan = engine::MemoryPlan::dynamic) {
  Result<Prediction> p = predict(small_config(2, plan), nullptr);
  EXPECT_TRUE(p.has_value()) << p.status().message();
  return p.value_or(Prediction{});
}

TEST(AnalysisJson, HoldsThePeakTheTimelineAndTheirParts) {
  const Prediction p = small_prediction();
  AnalysisRecord record;
  record.gpu_memory = "grow";
  record.memory_plan = "dynamic";
  record.predicted = &p;
  const json j = to_json(record);
  EXPECT_TRUE(j["measured"].is_null());
  EXPECT_TRUE(j["max_batch"].is_null());
  const json& pred = j["predicted"];
  EXPECT_EQ(pred["peak"]["allocated_bytes"], p.step.peak.allocated_bytes);
  EXPECT_EQ(pred["peak"]["by_category"]["activations"], p.step.peak[Category::activations]);
  EXPECT_EQ(pred["peak"]["waste_bytes"], p.step.peak.waste_bytes());
  EXPECT_EQ(pred["peak_layer"], p.step.peak_layer);
  EXPECT_EQ(pred["peak_phase"], "backward");
  EXPECT_TRUE(pred["process_bytes"].is_null());
  const json& tl = pred["timeline"];
  ASSERT_EQ(tl["layer"].size(), p.step.timeline.size());
  for (Category c : kAllCategories) {
    EXPECT_EQ(tl["by_category"][std::string(category_name(c))].size(), p.step.timeline.size());
  }
  EXPECT_TRUE(pred["arena"].is_null());
  EXPECT_TRUE(to_json(small_prediction(engine::MemoryPlan::planned).step)["arena"].is_object());
}

TEST(AnalysisJson, HoldsWhatThePlannedArenaHoldsAtThePeakAndAtItsFullest) {
  const Prediction p = small_prediction(engine::MemoryPlan::planned);
  ASSERT_TRUE(p.step.arena_at_peak && p.step.arena_fullest);
  const json arena = to_json(p.step)["arena"];
  for (const auto& [key, a] :
       {std::pair{"at_peak", *p.step.arena_at_peak}, std::pair{"fullest", *p.step.arena_fullest}}) {
    const json& j = arena[key];
    EXPECT_EQ(j["call"], a.call) << key;
    EXPECT_EQ(j["call_name"], a.call_name) << key;
    EXPECT_EQ(j["phase"], std::string(phase_name(a.phase))) << key;
    EXPECT_EQ(j["live_by_category"]["activations"], a[Category::activations]) << key;
    EXPECT_EQ(j["live_by_category"]["temporaries"], a[Category::temporaries]) << key;
    EXPECT_EQ(j["live_gradient_bytes"], a.gradient_bytes) << key;
    EXPECT_EQ(j["free_bytes"], a.free_bytes) << key;
    EXPECT_EQ(j["largest_free_bytes"], a.largest_free_bytes) << key;
    EXPECT_EQ(j["allocated_bytes"], a.allocated_bytes) << key;
    std::int64_t live = 0;
    for (const auto& [category, bytes] : j["live_by_category"].items())
      live += bytes.get<std::int64_t>();
    EXPECT_EQ(j["live_bytes"], live) << key;
    EXPECT_EQ(j["block_bytes"], live + a.free_bytes) << key;
  }
  EXPECT_EQ(arena["at_peak"]["call"], p.step.peak_call);
  EXPECT_EQ(arena["fullest"]["live_bytes"], p.step.arena->peak_live_bytes);
}

TEST(AnalysisJson, CalibrationsReadBack) {
  Calibration c;
  c.device = "cuda:0 (NVIDIA H200)";
  c.model = "resnet50";
  c.precision = "fp16";
  c.batch = 64;
  c.workspace_bytes = 123456;
  c.workspace_held_bytes = 23456;
  c.calls = 900;
  c.workspace_by_call = {{10, 100000}, {500, 7}};
  c.outside_allocator_bytes = 789;
  Result<Calibration> back = calibration_from_json(to_json(c), "x");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->device, c.device);
  EXPECT_EQ(back->precision, "fp16");
  EXPECT_EQ(back->batch, 64);
  EXPECT_EQ(back->workspace_bytes, 123456);
  EXPECT_EQ(back->workspace_held_bytes, 23456);
  EXPECT_EQ(back->calls, 900u);
  EXPECT_EQ(back->workspace_by_call, c.workspace_by_call);
  EXPECT_EQ(back->outside_allocator_bytes, 789);
  c.outside_allocator_bytes.reset();
  EXPECT_FALSE(calibration_from_json(to_json(c), "x")->outside_allocator_bytes.has_value());
  json broken = to_json(c);
  broken.erase("workspace_bytes");
  const auto missing = calibration_from_json(broken, "file: configurations[0]");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("configurations[0]: missing field \"workspace_bytes\""),
            std::string::npos)
      << missing.status().message();
  broken = to_json(c);
  broken["batch"] = "64";
  EXPECT_FALSE(calibration_from_json(broken, "x").has_value());
  broken = to_json(c);
  broken["workspace_by_call"] = json::array({json::array({1})});
  EXPECT_FALSE(calibration_from_json(broken, "x").has_value());
  // Figures no device holds, or below zero, would overflow the predictions' sums: refused, each
  // naming its field; so is a per-call list that names a call twice or past the step.
  const std::pair<const char*, json> out_of_range[] = {
      {"x.outside_allocator_bytes: 9223372036854775807 is out of range",
       {{"outside_allocator_bytes", INT64_MAX}}},
      {"x.outside_allocator_bytes: -1000000000000 is out of range (-1073741824 to",
       {{"outside_allocator_bytes", -1'000'000'000'000}}},
      {"x.workspace_bytes: -1 is out of range", {{"workspace_bytes", -1}}},
      {"x.workspace_held_bytes: 1125899906842625 is out of range",
       {{"workspace_held_bytes", (std::int64_t{1} << 50) + 1}}},
      {"x.workspace_held_bytes: 123457 is above workspace_bytes (123456), the most held",
       {{"workspace_held_bytes", 123457}}},
      {"x.batch: 0 is not a batch size", {{"batch", 0}}},
      {"x.calls: 0 is out of range", {{"calls", 0}}},
      {"x.workspace_by_call: call 900 is past the step's last",
       {{"workspace_by_call", json::array({json::array({900u, 1})})}}},
      {"x.workspace_by_call: call 10 is listed twice",
       {{"workspace_by_call", json::array({json::array({10u, 1}), json::array({10u, 2})})}}},
      {"x.workspace_by_call: -1000000 is out of range",
       {{"workspace_by_call", json::array({json::array({0u, -1'000'000})})}}},
  };
  for (const auto& [message, change] : out_of_range) {
    json edited = to_json(c);
    edited.update(change);
    const auto refused = calibration_from_json(edited, "x");
    ASSERT_FALSE(refused.has_value()) << message;
    EXPECT_EQ(refused.status().message().rfind(message, 0), 0u) << refused.status().message();
  }
  // NVML's figure may come out a little below the allocator's.
  json below = to_json(c);
  below["outside_allocator_bytes"] = -4096;
  EXPECT_TRUE(calibration_from_json(below, "x").has_value());
}

results::Document document_with(const json& analysis) {
  results::Document d;
  d.context.date = "2025-01-01T00:00:00Z";
  results::Configuration c;
  c.settings.model = "resnet18";
  c.settings.batch = 2;
  c.settings.precision = "fp32";
  c.settings.mode = "train";
  c.settings.layout = "nchw";
  c.settings.device = "cpu";
  c.settings.optimizer = "sgd";
  c.settings.gpu_memory = "planned";
  results::Memory m;
  m.source = "prediction";
  m.allocator_stats = nullptr;
  m.analysis = analysis;
  c.memory = m;
  d.configurations.push_back(c);
  return d;
}

TEST(ResultsSchema, KeepsTheAnalysisAndTheMemoryModeAndReadsOlderFiles) {
  const Prediction p = small_prediction();
  AnalysisRecord record;
  record.predicted = &p;
  const results::Document d = document_with(to_json(record));
  Result<results::Document> back = results::parse(results::serialize(d));
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->configurations[0].settings, d.configurations[0].settings);
  EXPECT_EQ(back->configurations[0].memory->analysis, d.configurations[0].memory->analysis);
  EXPECT_NE(
      results::describe(results::Kind::native, back->configurations[0].settings).find("planned"),
      std::string::npos);
  // A file from before the two fields: both read as absent.
  json old = results::to_json(d);
  old["configurations"][0]["settings"].erase("gpu_memory");
  old["configurations"][0]["memory"].erase("analysis");
  Result<results::Document> older = results::from_json(old);
  ASSERT_TRUE(older.has_value()) << older.status().message();
  EXPECT_EQ(older->configurations[0].settings.gpu_memory, "");
  EXPECT_TRUE(older->configurations[0].memory->analysis.is_null());
  old["configurations"][0]["memory"]["analysis"] = 3;
  EXPECT_FALSE(results::from_json(old).has_value());
}

TEST(ReportTimeline, DrawsOneChartPerAnalysedConfiguration) {
  const Prediction p = small_prediction(engine::MemoryPlan::planned);
  AnalysisRecord record;
  record.predicted = &p;
  const std::vector<results::NamedDocument> docs = {{"a.json", document_with(to_json(record))}};
  const std::string html = report::render_html(docs);
  EXPECT_NE(html.find("id=\"chart-memory-timeline-0\""), std::string::npos);
  EXPECT_NE(html.find("predicted peak"), std::string::npos);
  EXPECT_NE(html.find(p.step.peak_layer), std::string::npos);
  EXPECT_EQ(html.find("chart-memory-timeline-1"), std::string::npos);
  // A malformed analysis (the reader does not check its inside) draws nothing and breaks nothing.
  json bad = to_json(record);
  bad["predicted"]["timeline"]["layer"] = json::array({"conv1"});
  const std::vector<results::NamedDocument> broken = {{"b.json", document_with(bad)}};
  EXPECT_EQ(report::render_html(broken).find("chart-memory-timeline"), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::memory
