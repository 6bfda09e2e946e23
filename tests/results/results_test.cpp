#include "dlprobe/results/results.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "dlprobe/core/files.h"
#include "dlprobe/core/json_text.h"
#include "dlprobe/results/writer.h"

namespace dlprobe::results {
namespace {

using nlohmann::json;

Configuration native_config(std::int64_t batch, std::string precision) {
  Configuration c;
  c.kind = Kind::native;
  c.settings.model = "resnet50";
  c.settings.batch = batch;
  c.settings.precision = std::move(precision);
  c.settings.mode = "train";
  c.settings.layout = "nhwc";
  c.settings.device = "cuda:0";
  c.settings.optimizer = "sgd";
  c.samples.step_seconds = {0.101, 0.099, 0.1, 0.102};
  c.samples.step_items.assign(4, static_cast<double>(batch));
  c.samples.warmup_steps = 5;
  auto summary = stats::summarize(c.samples.step_seconds, c.samples.step_items);
  EXPECT_TRUE(summary.has_value());
  c.statistics = *summary;
  Memory m;
  m.source = "allocator";
  m.allocator_stats = {{"peak.allocated_bytes", 123456789}, {"peak.owner", "layer3.2.conv2"}};
  m.nvml_process_peak_bytes = 2000000000;
  c.memory = m;
  Telemetry t;
  t.gpu = 0;
  t.samples = 40;
  t.window_s = 4.0;
  t.gpu_util_pct = Range{40, 95, 99, 100};
  t.power_w = Range{40, 550.5, 640.25, 700};
  t.energy_j = 2561.0;
  t.energy_source = "counter";
  t.throttle_reasons = {"sw_power_cap"};
  t.timeline = {{0.0, 98.0, 600.0, 1980.0, 30000.0, 55.0},
                {0.1, 99.0, std::nullopt, 1975.0, {}, {}}};
  c.telemetry.push_back(t);
  c.compute = Compute{12.3e9, 310.5, 700.0, "bf16", 310.5 / 700.0};
  c.findings.push_back({Severity::warning, "power_cap", "power limited", "sw_power_cap seen", ""});
  return c;
}

Document sample_document() {
  Document d;
  d.context.dlprobe_version = "0.1.0";
  d.context.git_hash = "abc123";
  d.context.command_line = {"dlprobe", "bench", "--batch", "64,128"};
  d.context.date = "2025-03-01T12:34:56Z";
  d.context.hostname = "test-host";
  d.context.os = "Linux 6.1";
  d.context.cpu = "Test CPU";
  d.context.cpu_threads = 64;
  d.context.driver_version = "580.65.06";
  d.context.cuda_driver_version = "13.0";
  d.context.libraries = {{"cuDNN", "9.19.0", "/usr/lib/libcudnn.so.9"}, {"NCCL", "", ""}};
  d.context.gpus = {{0, "Test GPU", "GPU-1", "00000000:19:00.0", "9.0", 150ull << 30, 132}};
  DeviceState state;
  state.gpu = 0;
  state.sm_clock_mhz = 1980;
  state.temperature_c = 35;
  state.power_limit_w = 700;
  state.other_processes = {{4242, 1ull << 30}, {4343, std::nullopt}};
  d.context.device_state = {state};
  d.configurations.push_back(native_config(64, "bf16"));
  Configuration oom;
  oom.kind = Kind::native;
  oom.settings = native_config(1024, "fp32").settings;
  oom.status = RunStatus::oom;
  oom.error = "out of memory: asked for 2.00 GiB";
  d.configurations.push_back(oom);
  Configuration ext;
  ext.kind = Kind::external;
  ext.settings.command = "python train.py --bs {batch}";
  ext.settings.sweep = {{"batch", "32"}, {"precision", "bf16"}};
  ext.samples.step_seconds = {0.05, 0.06, 0.055};
  ext.samples.step_items = {32, 32, 16};  // a short last batch: written per step
  ext.statistics = *stats::summarize(ext.samples.step_seconds, ext.samples.step_items);
  Memory fm;
  fm.source = "framework";
  fm.framework_peak_allocated_bytes = 5000000;
  fm.framework_peak_reserved_bytes = 8000000;
  ext.memory = fm;
  d.configurations.push_back(ext);
  d.findings.push_back({Severity::info, "note", "a note", "", "do nothing"});
  return d;
}

TEST(Results, RoundTripKeepsEverything) {
  const Document d = sample_document();
  const std::string text = serialize(d);
  auto back = parse(text, "x.json");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  // Serialising what was read gives the same text: nothing was lost or changed.
  EXPECT_EQ(serialize(*back), text);
  EXPECT_EQ(back->configurations.size(), 3u);
  EXPECT_EQ(back->configurations[1].status, RunStatus::oom);
  EXPECT_EQ(back->configurations[2].samples.step_items, (std::vector<double>{32, 32, 16}));
  EXPECT_EQ(back->configurations[0].samples.step_items, std::vector<double>(4, 64.0));
  EXPECT_EQ(back->configurations[0].statistics->bootstrap_seed,
            d.configurations[0].statistics->bootstrap_seed);
  EXPECT_FALSE(back->configurations[0].telemetry[0].timeline[1].power_w.has_value());
  EXPECT_EQ(back->context.device_state[0].other_processes.size(), 2u);
}

TEST(Results, ConstantItemsAreWrittenOnce) {
  const json j = to_json(sample_document());
  EXPECT_TRUE(j["configurations"][0]["samples"]["step_items"].is_number());
  EXPECT_TRUE(j["configurations"][2]["samples"]["step_items"].is_array());
  EXPECT_EQ(j["schema"], "dlprobe.results/1");
  // Unknown values are null, not absent.
  EXPECT_TRUE(j["context"].contains("host_memory_bytes"));
  EXPECT_TRUE(j["context"]["host_memory_bytes"].is_null());
}

TEST(Results, DescribeAndAccessors) {
  const Document d = sample_document();
  const auto& native = d.configurations[0];
  const auto& ext = d.configurations[2];
  EXPECT_EQ(describe(native.kind, native.settings), "resnet50 bs=64 bf16 train nhwc cuda:0 sgd");
  EXPECT_EQ(describe(ext.kind, ext.settings),
            "python train.py --bs {batch} (batch=32, precision=bf16)");
  EXPECT_EQ(batch_of(ext.kind, ext.settings), 32);
  EXPECT_EQ(precision_of(ext.kind, ext.settings), "bf16");
  Settings no_batch;
  no_batch.sweep = {{"batch", "32x"}};
  EXPECT_FALSE(batch_of(Kind::external, no_batch).has_value());
}

std::string error_of(std::string_view text) {
  auto r = parse(text, "f.json");
  EXPECT_FALSE(r.has_value());
  return r.has_value() ? "" : r.status().message();
}

TEST(Results, RefusesWhatIsNotResults) {
  EXPECT_EQ(error_of(""), "f.json: empty file, not dlprobe results");
  EXPECT_EQ(error_of("[1,2]"),
            "f.json: not a dlprobe results file (the top level is array, not an object)");
  EXPECT_EQ(error_of(R"({"a": 1})"), "f.json: not a dlprobe results file (no \"schema\" field)");
  EXPECT_EQ(error_of(R"({"schema": "dlprobe.doctor/1"})"),
            "f.json: not a dlprobe results file (schema is \"dlprobe.doctor/1\", expected "
            "\"dlprobe.results/1\")");
  EXPECT_EQ(error_of(R"({"schema": "dlprobe.results/2"})"),
            "f.json: results schema \"dlprobe.results/2\" is not supported; this dlprobe reads "
            "\"dlprobe.results/1\"");
}

TEST(Results, RefusesTruncatedFile) {
  const std::string text = serialize(sample_document());
  const std::string message = error_of(std::string_view(text).substr(0, text.size() / 2));
  EXPECT_NE(message.find("f.json: truncated JSON (the file ends early)"), std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_NE(error_of("{\"schema\": ]").find("f.json: invalid JSON at byte"), std::string::npos);
}

TEST(Results, NamesTheMissingOrWrongField) {
  json j = to_json(sample_document());
  j["configurations"][1]["settings"].erase("batch");
  EXPECT_EQ(error_of(j.dump()), "f.json: configurations[1].settings: missing field \"batch\"");

  j = to_json(sample_document());
  j["configurations"][0]["status"] = "exploded";
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].status: \"exploded\" is not one of ok, oom, failed, "
            "interrupted, timeout");

  j = to_json(sample_document());
  j["context"]["gpus"][0]["sm_count"] = "many";
  EXPECT_EQ(error_of(j.dump()),
            "f.json: context.gpus[0].sm_count: expected an integer, found string");

  j = to_json(sample_document());
  j["configurations"][0]["samples"]["step_seconds"][2] = nullptr;
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.step_seconds[2]: expected a number, found null");

  j = to_json(sample_document());
  j["configurations"][2]["samples"]["step_items"] = {1, 2};
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[2].samples.step_items: 2 entries for 3 steps");

  j = to_json(sample_document());
  j.erase("configurations");
  EXPECT_EQ(error_of(j.dump()), "f.json: top level: missing field \"configurations\"");

  j = to_json(sample_document());
  j["context"]["device_state"][0]["other_processes"][0]["pid"] = -1;
  EXPECT_EQ(error_of(j.dump()),
            "f.json: context.device_state[0].other_processes[0].pid: -1 is negative");
}

TEST(Results, FieldsAddedWithinVersionOne) {
  Document d = sample_document();
  Settings& s = d.configurations[0].settings;
  s.image_size = 64;
  s.classes = 10;
  s.backend = "reference";
  d.configurations[0].samples.window_steps = {1, 3};
  auto back = parse(serialize(d));
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->configurations[0].settings, s);
  EXPECT_EQ(back->configurations[0].samples.window_steps, (std::vector<std::int64_t>{1, 3}));
  // A file from before them reads with the defaults.
  json j = to_json(d);
  for (const char* key : {"image_size", "classes", "backend"}) {
    j["configurations"][0]["settings"].erase(key);
  }
  j["configurations"][0]["samples"].erase("window_steps");
  auto old = parse(j.dump());
  ASSERT_TRUE(old.has_value()) << old.status().message();
  EXPECT_EQ(old->configurations[0].settings.image_size, 0);
  EXPECT_EQ(old->configurations[0].settings.backend, "");
  EXPECT_TRUE(old->configurations[0].samples.window_steps.empty());
  // Present, they are checked.
  j = to_json(d);
  j["configurations"][0]["settings"]["image_size"] = "big";
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].settings.image_size: expected an integer, found string");
  j = to_json(d);
  j["configurations"][0]["samples"]["window_steps"] = {1, 2};
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.window_steps: windows of 3 steps in all for 4 "
            "steps");
  j["configurations"][0]["samples"]["window_steps"] = {0, 4};
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.window_steps: a window of 0 steps");
  // Other processes' CPU time: one figure a window, none negative.
  j = to_json(d);
  j["configurations"][0]["samples"]["window_other_cpu_seconds"] = {0.5};
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.window_other_cpu_seconds: 1 entries for 2 windows");
  j["configurations"][0]["samples"]["window_other_cpu_seconds"] = {0.5, -1.0};
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.window_other_cpu_seconds: -1 is not a CPU time");
  // Step times and counts as compare reads them: each above 0.
  j = to_json(d);
  j["configurations"][0]["samples"]["step_seconds"][2] = 0.0;
  EXPECT_EQ(error_of(j.dump()), "f.json: configurations[0].samples.step_seconds: step 2 took 0 s");
  j = to_json(d);
  j["configurations"][0]["samples"]["step_items"] = -2;
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.step_items: step 0 counted -2 items");
  j["configurations"][0]["samples"]["step_items"] = 0;
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.step_items: step 0 counted 0 items");
  // No size or count in the settings is negative.
  for (const char* key : {"batch", "image_size", "classes", "width", "streams", "stream_lag"}) {
    j = to_json(d);
    j["configurations"][0]["settings"][key] = -5;
    EXPECT_EQ(error_of(j.dump()),
              std::string("f.json: configurations[0].settings.") + key + ": -5 is out of range");
  }
  // The summary is the samples': one that disagrees with them (edited) is refused.
  j = to_json(d);
  j["configurations"][0]["statistics"]["throughput"] = 1e6;
  EXPECT_NE(error_of(j.dump()).find("f.json: configurations[0].statistics: "), std::string::npos)
      << error_of(j.dump());
  j = to_json(d);
  j["configurations"][0]["statistics"]["steps"] = 1000;
  EXPECT_NE(error_of(j.dump()).find("1000 steps, 256 items in 0.402 s, 636.8159203980099 items/s, "
                                    "where the samples hold 4 steps"),
            std::string::npos)
      << error_of(j.dump());
  // The summary's figures are never negative, and its interval is in order.
  j = to_json(d);
  j["configurations"][0]["statistics"]["throughput"] = -5;
  EXPECT_EQ(error_of(j.dump()), "f.json: configurations[0].statistics.throughput: -5 is negative");
  j = to_json(d);
  j["configurations"][0]["statistics"]["throughput_ci_high"] = 0.5;
  j["configurations"][0]["statistics"]["throughput_ci_low"] = 1.5;
  EXPECT_EQ(
      error_of(j.dump()),
      "f.json: configurations[0].statistics.throughput_ci_high: 0.5 is below the low end 1.5");
  j = to_json(d);
  j["configurations"][0]["samples"].erase("window_other_cpu_seconds");
  j["configurations"][0]["samples"].erase("host_cpus");
  old = parse(j.dump());
  ASSERT_TRUE(old.has_value()) << old.status().message();
  EXPECT_FALSE(other_cpu_share(old->configurations[0].samples).has_value());
}

TEST(Results, TheContainerIsWrittenOnlyWhenKnown) {
  Document d = sample_document();
  // Without one the document is written as before the key was added, to the byte.
  EXPECT_FALSE(to_json(d)["context"].contains("container"));
  d.context.container = Container{"docker", "train:7", ""};
  auto back = parse(serialize(d));
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->context.container, d.context.container);
  json j = to_json(d);
  j["context"]["container"] = nullptr;
  auto none = parse(j.dump());
  ASSERT_TRUE(none.has_value()) << none.status().message();
  EXPECT_EQ(none->context.container, std::nullopt);
  j["context"]["container"] = {{"runtime", "docker"}, {"image", 7}, {"digest", ""}};
  EXPECT_EQ(error_of(j.dump()), "f.json: context.container.image: expected a string, found number");
}

TEST(Results, TheProfileIsWrittenOnlyWhenProfiled) {
  Document d = sample_document();
  // Without one the document is written as before the key was added, to the byte.
  EXPECT_FALSE(to_json(d)["configurations"][0].contains("profile"));
  d.configurations[0].profile = std::vector<CallTime>{{"stem.conv", "conv_forward", 1.5}};
  auto back = parse(serialize(d));
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->configurations[0].profile, d.configurations[0].profile);
  json j = to_json(d);
  j["configurations"][0]["profile"][0]["ms"] = -0.5;
  EXPECT_EQ(error_of(j.dump()), "f.json: configurations[0].profile[0].ms: -0.5 ms");
  j = to_json(d);
  j["configurations"][0]["profile"][0]["name"] = "";
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].profile[0]: a call needs a name and a kind");
  j["configurations"][0]["profile"] = {{{"name", "fc"}, {"kind", "linear_forward"}}};
  EXPECT_EQ(error_of(j.dump()), "f.json: configurations[0].profile[0]: missing field \"ms\"");
}

TEST(Results, TheArenaIsWrittenOnlyForPlannedSteps) {
  Document d = sample_document();
  Memory m;
  m.source = "allocator";
  m.allocator_stats = {{"peak.allocated_bytes", 4096}};
  d.configurations[0].memory = m;
  // Without one the memory object is written as before the key was added.
  EXPECT_FALSE(to_json(d)["configurations"][0]["memory"].contains("arena"));
  d.configurations[0].memory->arena = {{"call_name", "loss.backward"}, {"free_bytes", 512}};
  auto back = parse(serialize(d));
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->configurations[0].memory, d.configurations[0].memory);
  json j = to_json(d);
  j["configurations"][0]["memory"]["arena"] = 7;
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].memory.arena: expected an object or null, found number");
}

TEST(Results, OtherCpuShareIsOfTheMachinesTimeOverTheWindows) {
  Samples s;
  s.step_seconds = {0.5, 0.5, 0.5, 0.5};
  s.step_items = {1, 1, 1, 1};
  s.window_steps = {2, 2};
  EXPECT_FALSE(other_cpu_share(s).has_value());
  s.window_other_cpu_seconds = {0.5, 1.5};  // 2 CPU-seconds in 2 s on 4 CPUs
  s.host_cpus = 4;
  ASSERT_TRUE(other_cpu_share(s).has_value());
  EXPECT_DOUBLE_EQ(*other_cpu_share(s), 0.25);
}

TEST(Results, WarmupRunsAndTheirSpreadRoundTrip) {
  Document d = sample_document();
  Configuration& c = d.configurations[0];
  c.samples.run_steps = {2, 2};
  c.samples.warmup = {{"steady", 12, 1.9, true, 1, std::vector<double>(12, 0.158)},
                      {"steady", 10, 1.5, false, 0, std::vector<double>(10, 0.15)}};
  auto spread = stats::run_spread(run_throughputs(c.samples));
  ASSERT_TRUE(spread.has_value());
  c.run_spread = *spread;
  c.runs_in = RunsIn::engines;
  auto back = parse(serialize(d), "f.json");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(*back, d);
  // Files from before them read as one run, no warm-up record and no spread.
  json j = to_json(d);
  EXPECT_EQ(j["configurations"][0]["runs_in"], "engines");
  j["configurations"][0]["samples"].erase("run_steps");
  j["configurations"][0]["samples"].erase("warmup");
  j["configurations"][0].erase("run_spread");
  j["configurations"][0].erase("runs_in");
  auto old = parse(j.dump());
  ASSERT_TRUE(old.has_value()) << old.status().message();
  EXPECT_TRUE(old->configurations[0].samples.run_steps.empty());
  EXPECT_TRUE(old->configurations[0].samples.warmup.empty());
  EXPECT_FALSE(old->configurations[0].run_spread.has_value());
  EXPECT_FALSE(old->configurations[0].runs_in.has_value());
  j = to_json(d);
  j["configurations"][0]["runs_in"] = "threads";
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].runs_in: \"threads\" is not one of engines, "
            "processes");
  j = to_json(d);
  j["configurations"][0]["samples"]["run_steps"] = {1, 1};
  EXPECT_EQ(error_of(j.dump()),
            "f.json: configurations[0].samples.run_steps: runs of 2 steps in all for 4 steps");
}

TEST(Results, HugeGroupCountsAreRefusedNotSummed) {
  // Two window counts near the int64 limit: summing them overflowed (UBSan stopped the reader).
  Document d = sample_document();
  json j = to_json(d);
  const auto huge = std::numeric_limits<std::int64_t>::max();
  j["configurations"][0]["samples"]["window_steps"] = {huge, huge};
  EXPECT_EQ(
      error_of(j.dump()),
      fmt::format("f.json: configurations[0].samples.window_steps: a window of {} steps", huge));
}

TEST(Results, WindowThroughputsAndSeriesLabels) {
  Samples s;
  s.step_seconds = {0.1, 0.1, 0.2, 0.2};
  s.step_items = {10, 10, 10, 10};
  ASSERT_EQ(window_throughputs(s).size(), 1u);
  EXPECT_DOUBLE_EQ(window_throughputs(s)[0], 40.0 / 0.6);
  s.window_steps = {2, 2};
  EXPECT_EQ(window_throughputs(s), (std::vector<double>{100.0, 50.0}));
  s.window_steps = {2, 1};  // does not add up
  EXPECT_TRUE(window_throughputs(s).empty());
  EXPECT_TRUE(window_throughputs({}).empty());

  Settings n;
  n.model = "resnet18";
  n.batch = 8;
  n.precision = "fp32";
  n.mode = "train";
  n.layout = "nchw";
  n.device = "cpu";
  n.optimizer = "sgd";
  n.image_size = 64;
  n.backend = "reference";
  EXPECT_EQ(describe(Kind::native, n), "resnet18@64 bs=8 fp32 train nchw cpu/reference sgd");
  EXPECT_EQ(series_label(Kind::native, n), "resnet18@64 fp32 train nchw cpu/reference sgd");
  n.image_size = 224;
  n.backend = "onednn";  // the CPU's own backend is not named
  EXPECT_EQ(describe(Kind::native, n), "resnet18 bs=8 fp32 train nchw cpu sgd");
  n.device = "cuda:0";
  n.backend = "cuda";
  n.streams = 2;
  EXPECT_EQ(describe(Kind::native, n), "resnet18 bs=8 fp32 train nchw cuda:0 sgd streams=2");
  n.stream_lag = 16;
  EXPECT_EQ(describe(Kind::native, n),
            "resnet18 bs=8 fp32 train nchw cuda:0 sgd streams=2 stream-lag=16");
  n.streams = 0;
  n.stream_lag = 0;
  n.recompute = "block-outputs";
  EXPECT_EQ(describe(Kind::native, n),
            "resnet18 bs=8 fp32 train nchw cuda:0 sgd recompute=block-outputs");
  // Another class count is another workload: its label says so, and the history keeps it apart.
  n.recompute.clear();
  n.classes = 1000;
  EXPECT_EQ(describe(Kind::native, n), "resnet18 bs=8 fp32 train nchw cuda:0 sgd");
  n.classes = 100000;
  EXPECT_EQ(describe(Kind::native, n), "resnet18 bs=8 fp32 train nchw cuda:0 sgd classes=100000");
  EXPECT_EQ(series_label(Kind::native, n), "resnet18 fp32 train nchw cuda:0 sgd classes=100000");
  Settings e;
  e.command = "python t.py";
  e.sweep = {{"batch", "8"}, {"precision", "bf16"}};
  EXPECT_EQ(series_label(Kind::external, e), "python t.py precision=bf16");
}

// A key a file lacks reads as what it means: a file from before `width` and one with width 64
// name one configuration; another width, or another class count, does not.
TEST(Results, SameSettingsFillsInWhatAnAbsentKeyMeans) {
  Settings old;
  old.model = "resnet18";
  old.batch = 2;
  old.precision = "fp32";
  Settings now = old;
  now.width = 64;
  now.image_size = 224;
  now.classes = 1000;
  now.gpu_memory = "grow";
  now.input = "synthetic";
  now.streams = 1;
  EXPECT_FALSE(old == now);
  EXPECT_TRUE(same_settings(Kind::native, old, now));
  now.width = 16;
  EXPECT_FALSE(same_settings(Kind::native, old, now));
  now.width = 64;
  now.classes = 10;
  EXPECT_FALSE(same_settings(Kind::native, old, now));
  // An older memory result's "NHWC" is bench's "nhwc".
  now.classes = 1000;
  old.layout = "NHWC";
  now.layout = "nhwc";
  EXPECT_TRUE(same_settings(Kind::native, old, now));
  now.layout = "nchw";
  EXPECT_FALSE(same_settings(Kind::native, old, now));
  // An external run's keys are its command and sweep alone.
  Settings a;
  a.command = "python t.py";
  Settings b = a;
  b.sweep = {{"batch", "8"}};
  EXPECT_FALSE(same_settings(Kind::external, a, b));
  EXPECT_TRUE(same_settings(Kind::external, a, a));
}

TEST(Results, IgnoresUnknownKeys) {
  json j = to_json(sample_document());
  j["configurations"][0]["added_in_a_later_minor_version"] = 1;
  EXPECT_TRUE(parse(j.dump()).has_value());
}

// Every member of every struct set to something other than its default (and every optional one
// present), so that a member the schema loses on the way out or in comes back different.
Configuration full_native_configuration() {
  Configuration c;
  c.kind = Kind::native;
  c.settings = native_config(64, "bf16").settings;
  c.settings.gpu_memory = "planned";
  c.settings.image_size = 64;
  c.settings.classes = 10;
  c.settings.backend = "reference";
  c.settings.streams = 2;
  c.settings.stream_lag = 16;
  c.settings.recompute = "block-outputs";
  c.status = RunStatus::interrupted;
  c.error = "interrupted after 4 steps";
  stats::Summary s;
  s.steps = 4;
  s.total_items = 224;
  s.total_seconds = 0.41;
  s.throughput = s.total_items / s.total_seconds;  // the samples' below
  s.throughput_ci = {530.5, 560.25};
  s.ci_level = 0.95;
  s.bootstrap_resamples = 2000;
  s.bootstrap_seed = 7;
  s.mean_s = 0.1025;
  s.median_s = 0.1015;
  s.p90_s = 0.104;
  s.p99_s = 0.105;
  s.min_s = 0.099;
  s.max_s = 0.106;
  s.mad_s = 0.001;
  s.cv = 0.02;
  s.outliers = 1;
  c.statistics = s;
  c.samples.step_seconds = {0.101, 0.099, 0.104, 0.106};
  c.samples.step_items = {64, 64, 64, 32};
  c.samples.warmup_steps = 5;
  c.samples.window_steps = {2, 2};
  c.samples.run_steps = {1, 3};
  c.samples.warmup = {{"steady", 3, 0.5, true, 1, {0.3, 0.1, 0.1}}};
  c.run_spread = stats::RunSpread{2, 500.5, 490.5, 510.5, {373.5, 627.5}, 0.95};
  c.runs_in = RunsIn::processes;
  c.samples.window_other_cpu_seconds = {0.25, 0.5};
  c.samples.host_cpus = 2;
  Memory m;
  m.source = "allocator";
  m.allocator_stats = {{"peak.allocated_bytes", 123456789}};
  m.framework_peak_allocated_bytes = 5000000;
  m.framework_peak_reserved_bytes = 8000000;
  m.nvml_process_peak_bytes = 2000000000;
  m.analysis = {{"verdict", "fits"}};
  m.arena = {{"call", 44}, {"free_bytes", 385024}};
  c.memory = m;
  Telemetry t;
  t.gpu = 1;
  t.samples = 40;
  t.window_s = 4.5;
  t.gpu_util_pct = Range{40, 95, 99, 100};
  t.mem_util_pct = Range{40, 30, 35, 41};
  t.power_w = Range{40, 550.5, 640.25, 700};
  t.sm_clock_mhz = Range{40, 1900, 1980, 1985};
  t.mem_clock_mhz = Range{40, 2619, 2619, 2620};
  t.temperature_c = Range{40, 50, 55, 61};
  t.mem_used_mib = Range{40, 20000, 30000, 30001};
  t.energy_j = 2561.5;
  t.energy_source = "counter";
  t.throttle_reasons = {"sw_power_cap"};
  t.timeline = {{0.25, 98.5, 600.5, 1980.5, 30000.5, 55.5}};
  c.telemetry = {t};
  c.compute = Compute{12.3e9, 310.5, 700.5, "bf16", 0.44};
  c.findings = {{Severity::warning, "power_cap", "power limited", "sw_power_cap seen", "raise it"}};
  c.profile = std::vector<CallTime>{{"layer1.0.conv1", "conv_forward_fused", 0.25},
                                    {"fc", "linear_forward", 0.5}};
  return c;
}

Document full_document() {
  Document d;
  d.context = {"0.1.0",
               "abc123",
               {"dlprobe", "bench"},
               "2025-03-01T12:34:56Z",
               "test-host",
               "Linux 6.1",
               "Test CPU",
               64,
               512ull << 30,
               "580.65.06",
               "13.0",
               "13.0",
               {{"cuDNN", "9.19.0", "/usr/lib/libcudnn.so.9"}},
               {{1, "Test GPU", "GPU-1", "00000000:19:00.0", "9.0", 150ull << 30, 132}},
               {{1, 1980.5, 2619.5, 35.5, 90.5, 700.5, {"sw_power_cap"}, {{4242, 1ull << 30}}}},
               Container{"podman", "nvcr.io/nvidia/pytorch:24.05-py3", "sha256:5e1f0c2d"}};
  d.configurations.push_back(full_native_configuration());
  Configuration ext = full_native_configuration();
  ext.kind = Kind::external;
  ext.settings = {};  // the native block is not written for an external run
  ext.settings.command = "python train.py --bs {batch}";
  ext.settings.sweep = {{"batch", "32"}};
  d.configurations.push_back(ext);
  d.findings = {{Severity::error, "note", "a note", "the numbers", "do something"}};
  return d;
}

class ResultsRoundTrip : public ::testing::Test {
 protected:
  void SetUp() override {
    auto read = parse(serialize(full));
    ASSERT_TRUE(read.has_value()) << read.status().message();
    back = *read;
  }
  const Document full = full_document();
  Document back;
};

TEST_F(ResultsRoundTrip, Library) {
  EXPECT_EQ(back.context.libraries, full.context.libraries);
}
TEST_F(ResultsRoundTrip, Gpu) {
  EXPECT_EQ(back.context.gpus, full.context.gpus);
}
TEST_F(ResultsRoundTrip, GpuProcess) {
  EXPECT_EQ(back.context.device_state[0].other_processes,
            full.context.device_state[0].other_processes);
}
TEST_F(ResultsRoundTrip, DeviceState) {
  EXPECT_EQ(back.context.device_state, full.context.device_state);
}
TEST_F(ResultsRoundTrip, Context) {
  EXPECT_EQ(back.context, full.context);
}
TEST_F(ResultsRoundTrip, NativeSettings) {
  EXPECT_EQ(back.configurations[0].settings, full.configurations[0].settings);
}
TEST_F(ResultsRoundTrip, ExternalSettings) {
  EXPECT_EQ(back.configurations[1].settings, full.configurations[1].settings);
}
TEST_F(ResultsRoundTrip, Summary) {
  EXPECT_EQ(back.configurations[0].statistics, full.configurations[0].statistics);
}
TEST_F(ResultsRoundTrip, Samples) {
  EXPECT_EQ(back.configurations[0].samples, full.configurations[0].samples);
}
TEST_F(ResultsRoundTrip, Memory) {
  EXPECT_EQ(back.configurations[0].memory, full.configurations[0].memory);
}
TEST_F(ResultsRoundTrip, Range) {
  EXPECT_EQ(back.configurations[0].telemetry[0].power_w,
            full.configurations[0].telemetry[0].power_w);
}
TEST_F(ResultsRoundTrip, TelemetrySample) {
  EXPECT_EQ(back.configurations[0].telemetry[0].timeline,
            full.configurations[0].telemetry[0].timeline);
}
TEST_F(ResultsRoundTrip, Telemetry) {
  EXPECT_EQ(back.configurations[0].telemetry, full.configurations[0].telemetry);
}
TEST_F(ResultsRoundTrip, Compute) {
  EXPECT_EQ(back.configurations[0].compute, full.configurations[0].compute);
}
TEST_F(ResultsRoundTrip, Finding) {
  EXPECT_EQ(back.configurations[0].findings, full.configurations[0].findings);
}
TEST_F(ResultsRoundTrip, Configuration) {
  EXPECT_EQ(back.configurations, full.configurations);
}
TEST_F(ResultsRoundTrip, Profile) {
  EXPECT_EQ(back.configurations[0].profile, full.configurations[0].profile);
}
TEST_F(ResultsRoundTrip, Document) {
  EXPECT_EQ(back, full);
}

// Changes each value of the written document in turn. Reading it must either refuse the file or
// give a document that writes the changed value: a key written but not read would come back as it
// was.
TEST(Results, EveryWrittenValueIsRead) {
  const json written = to_json(full_document());
  const json leaves = written.flatten();
  for (const auto& [pointer, value] : leaves.items()) {
    if (pointer == "/schema") continue;
    ASSERT_FALSE(value.is_null()) << pointer << " is unset in full_document()";
    json changed = value.is_string()            ? json(value.get<std::string>() + "~")
                   : value.is_number_unsigned() ? json(value.get<std::uint64_t>() + 1)
                   : value.is_number_integer()  ? json(value.get<std::int64_t>() + 1)
                   : value.is_number()          ? json(value.get<double>() * 2 + 1)
                                                : json(!value.get<bool>());
    json j = written;
    j[json::json_pointer(pointer)] = changed;
    const auto read = from_json(j);
    if (!read.has_value()) continue;
    EXPECT_EQ(to_json(*read)[json::json_pointer(pointer)], changed) << pointer;
  }
}

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() /
             ("dlprobe_results_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// The document written with `raw` (JSON text nlohmann would not write itself) at `where`.
std::string with_raw_value(json j, const std::string& where, const std::string& raw) {
  const std::string mark = "\"raw value goes here\"";
  j[json::json_pointer(where)] = "raw value goes here";
  std::string text = j.dump();
  text.replace(text.find(mark), mark.size(), raw);
  return text;
}

TEST(Results, NumbersOutOfRangeNameTheirPath) {
  EXPECT_EQ(error_of("1e400"), "f.json: top level: number out of range");
  const json j = to_json(sample_document());
  EXPECT_EQ(error_of(with_raw_value(j, "/configurations/0/samples/step_seconds/3", "1e999")),
            "f.json: configurations[0].samples.step_seconds[3]: number out of range");
  EXPECT_EQ(error_of(with_raw_value(j, "/context/gpus/0/memory_total_bytes", "-1e400")),
            "f.json: context.gpus[0].memory_total_bytes: number out of range");
  // Free-form objects and keys this version does not know are read through too.
  EXPECT_EQ(error_of(with_raw_value(j, "/configurations/0/memory/allocator_stats/x",
                                    std::string(100'001, '7'))),
            "f.json: configurations[0].memory.allocator_stats.x: number out of range");
  EXPECT_EQ(error_of(with_raw_value(j, "/unknown", "[1, [2, 1e999]]")),
            "f.json: unknown[1][1]: number out of range");
  // A tiny number is merely rounded: it is finite (and 0, which a step time may not be).
  EXPECT_TRUE(
      parse(with_raw_value(j, "/configurations/0/samples/window_other_cpu_seconds/0", "1e-400")));
  EXPECT_EQ(error_of(with_raw_value(j, "/configurations/0/samples/step_seconds/3", "1e-400")),
            "f.json: configurations[0].samples.step_seconds: step 3 took 0 s");
}

TEST(Results, IntegersThatDoNotFitTheirFieldAreRefused) {
  const json j = to_json(sample_document());
  // Past 2^64 the parser keeps a whole number as a double.
  EXPECT_EQ(error_of(with_raw_value(j, "/configurations/0/settings/batch", "18446744073709551616")),
            "f.json: configurations[0].settings.batch: number out of range");
  EXPECT_EQ(error_of(with_raw_value(j, "/context/gpus/0/sm_count", "1e30")),
            "f.json: context.gpus[0].sm_count: number out of range");
  EXPECT_EQ(error_of(with_raw_value(j, "/context/gpus/0/sm_count", "3000000000")),
            "f.json: context.gpus[0].sm_count: 3000000000 is out of range");
  EXPECT_EQ(error_of(with_raw_value(j, "/context/gpus/0/sm_count", "2.5")),
            "f.json: context.gpus[0].sm_count: expected an integer, found number");
}

// A key given twice in one object is refused, naming it: which value the writer meant is unknown.
TEST(Results, AKeyGivenTwiceIsRefused) {
  std::string text = results::serialize(sample_document());
  const std::string first = "\"schema\": ";
  const std::size_t at = text.find(first);
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"schema\": \"dlprobe.results/1\", ");
  EXPECT_EQ(error_of(text), "f.json: schema: the key is given twice in its object");
  json j = to_json(sample_document());
  std::string nested = j.dump();
  const std::size_t model = nested.find("\"model\":");
  ASSERT_NE(model, std::string::npos);
  nested.insert(model, "\"model\": \"resnet18\", ");
  EXPECT_EQ(error_of(nested),
            "f.json: configurations[0].settings.model: the key is given twice in its object");
}

TEST(Results, NonFiniteValuesAreRefused) {
  for (const double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    json j = to_json(sample_document());
    j["configurations"][0]["samples"]["step_seconds"][1] = bad;
    const auto r = from_json(j);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.status().message(),
              "configurations[0].samples.step_seconds[1]: not a finite number");
  }
}

// `levels` arrays, one inside the other, as memory.analysis.deep.
std::string nested_in_analysis(std::size_t levels) {
  json j = to_json(sample_document());
  return with_raw_value(j, "/configurations/0/memory/analysis",
                        "{\"deep\": " + std::string(levels, '[') + std::string(levels, ']') + "}");
}

TEST(Results, NestingIsBoundedWhileParsing) {
  // The document, its configurations, the configuration, memory and the analysis hold the arrays.
  constexpr std::size_t kAbove = 5;
  EXPECT_TRUE(parse(nested_in_analysis(kMaxJsonDepth - kAbove), "f.json").has_value());
  const std::string message = error_of(nested_in_analysis(kMaxJsonDepth - kAbove + 1));
  EXPECT_EQ(message.find("f.json: configurations[0].memory.analysis.deep[0][0]"), 0u) << message;
  EXPECT_NE(message.find(fmt::format("nested deeper than {} levels", kMaxJsonDepth)),
            std::string::npos)
      << message;
  // Far deeper than any stack would hold had the value been built and copied.
  EXPECT_EQ(error_of(nested_in_analysis(100'000)), message);
}

TEST(Results, FileSizeIsBounded) {
  const auto path = temp_dir() / "huge.json";
  { std::ofstream create(path); }
  // Sparse: the size is there without the bytes.
  std::filesystem::resize_file(path, kMaxFileBytes + 1);
  auto r = read_file(path);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(), fmt::format("{}: larger than {} bytes, the most accepted",
                                              path.string(), kMaxFileBytes));
  std::filesystem::remove_all(path.parent_path());
  // A file that never ends is read up to the limit only.
  auto endless = read_whole_file("/dev/zero", 1 << 20);
  ASSERT_FALSE(endless.has_value());
  EXPECT_EQ(endless.status().message(),
            fmt::format("/dev/zero: larger than {} bytes, the most accepted", 1 << 20));
}

TEST(Results, ReadFileErrorsNameTheFile) {
  auto r = read_file("/nonexistent/dir/r.json");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::not_found);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/r.json: cannot open"), std::string::npos);
}

TEST(ResultsWriter, FileIsCompleteAfterEveryConfiguration) {
  const auto path = temp_dir() / "writer.json";
  auto writer = ResultsWriter::create(path, sample_document().context);
  ASSERT_TRUE(writer.has_value()) << writer.status().message();
  auto empty = read_file(path);
  ASSERT_TRUE(empty.has_value()) << empty.status().message();
  EXPECT_TRUE(empty->configurations.empty());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(writer->add(native_config(32 << i, "bf16")).is_ok());
    auto now = read_file(path);
    ASSERT_TRUE(now.has_value()) << now.status().message();
    EXPECT_EQ(now->configurations.size(), static_cast<std::size_t>(i + 1));
  }
  ASSERT_TRUE(writer->add_finding({Severity::error, "x", "y", "", ""}).is_ok());
  EXPECT_EQ(read_file(path)->findings.size(), 1u);
  // No temporary left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path.parent_path())) {
    ++files;
  }
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(path.parent_path());
}

// A reader polling the file while the writer rewrites it must never see a partial document.
TEST(ResultsWriter, ConcurrentReaderNeverSeesPartialFile) {
  const auto path = temp_dir() / "race.json";
  auto writer = ResultsWriter::create(path, sample_document().context);
  ASSERT_TRUE(writer.has_value());
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::atomic<int> reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      auto r = read_file(path);
      if (!r.has_value()) ++bad;
      ++reads;
    }
  });
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(writer->add(native_config(64, "fp16")).is_ok());
  done = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  std::filesystem::remove_all(path.parent_path());
}

TEST(ResultsWriter, BadPathFailsAtCreate) {
  auto writer = ResultsWriter::create("/nonexistent/dir/r.json", {});
  ASSERT_FALSE(writer.has_value());
  EXPECT_EQ(writer.status().code(), Errc::io_error);
}

TEST(Results, Iso8601Now) {
  const std::string now = iso8601_utc_now();
  ASSERT_EQ(now.size(), 20u);
  EXPECT_EQ(now[4], '-');
  EXPECT_EQ(now[10], 'T');
  EXPECT_EQ(now.back(), 'Z');
}

}  // namespace
}  // namespace dlprobe::results
