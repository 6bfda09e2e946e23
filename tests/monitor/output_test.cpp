// monitor's output formats over hand-made rounds: unavailable values are "-", empty or null.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "dlprobe/monitor/output.h"

namespace dlprobe::monitor {
namespace {

Tick sample_tick() {
  Tick t;
  t.index = 0;
  t.timestamp_ns = 2'500'000'000;
  GpuReading& full = t.gpus.emplace_back();
  full.gpu = 0;
  full.sample.timestamp_ns = t.timestamp_ns;
  full.sample.gpu_util_pct = 87;
  full.sample.mem_util_pct = 0;
  full.sample.mem_used_bytes = 3ULL << 30;
  full.sample.power_w = 412.25;
  full.sample.temperature_c = 61;
  full.sample.sm_clock_mhz = 1755;
  full.sample.mem_clock_mhz = 3201;
  full.sample.clock_event_reasons = nvml::kClockEventSwPowerCap;
  full.energy_since_start_j = 123.5;
  full.processes.push_back({4242, 1ULL << 30, 80, 10});
  full.processes.push_back({4343, std::nullopt, std::nullopt, std::nullopt});
  GpuReading& bare = t.gpus.emplace_back();
  bare.gpu = 1;
  bare.sample.timestamp_ns = t.timestamp_ns;
  bare.sample.gpu_util_pct = 5;
  return t;
}

OutputOptions options(bool processes) {
  OutputOptions o;
  o.processes = processes;
  o.start_ns = 500'000'000;
  o.unix_offset_ns = 1'700'000'000'000'000'000;
  return o;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

TEST(MonitorCsv, HeaderAndRows) {
  const auto o = options(false);
  const auto header = fields(lines(csv_header(o))[0]);
  ASSERT_EQ(header.size(), 12U);
  EXPECT_EQ(header[0], "time_s");
  EXPECT_EQ(header[2], "gpu");
  EXPECT_EQ(header[6], "power_w");
  EXPECT_EQ(header[11], "clock_event_reasons");
  const auto rows = lines(csv_rows(sample_tick(), o));
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[0],
            "2.000,1700000002.500,0,87,0,3072.0,412.250,123.500,61,1755,3201,sw_power_cap");
  const auto bare = fields(rows[1]);
  ASSERT_EQ(bare.size(), header.size());
  EXPECT_EQ(bare[3], "5");
  for (std::size_t i = 4; i < bare.size(); ++i) EXPECT_EQ(bare[i], "") << header[i];
}

TEST(MonitorCsv, ProcessRowsLineUpWithTheHeader) {
  const auto o = options(true);
  const auto header = fields(lines(csv_header(o))[0]);
  const auto rows = lines(csv_rows(sample_tick(), o));
  ASSERT_EQ(rows.size(), 4U);  // gpu 0, its two processes, gpu 1
  for (const auto& row : rows) EXPECT_EQ(fields(row).size(), header.size()) << row;
  const auto proc = fields(rows[1]);
  EXPECT_EQ(proc[3], "process");
  EXPECT_EQ(proc[header.size() - 4], "4242");
  EXPECT_EQ(proc[header.size() - 3], "1024.0");
  EXPECT_EQ(proc[header.size() - 2], "80");
  const auto unknown = fields(rows[2]);
  EXPECT_EQ(unknown[header.size() - 4], "4343");
  EXPECT_EQ(unknown[header.size() - 3], "");
}

TEST(MonitorJsonl, ParsesBackWithNulls) {
  const auto rows = lines(jsonl_rows(sample_tick(), options(true)));
  ASSERT_EQ(rows.size(), 2U);
  const auto a = nlohmann::json::parse(rows[0]);
  EXPECT_DOUBLE_EQ(a["time_s"].get<double>(), 2.0);
  EXPECT_EQ(a["gpu"], 0);
  EXPECT_EQ(a["gpu_util_pct"], 87);
  EXPECT_EQ(a["mem_util_pct"], 0);
  EXPECT_EQ(a["mem_used_bytes"], 3ULL << 30);
  EXPECT_DOUBLE_EQ(a["power_w"].get<double>(), 412.25);
  EXPECT_DOUBLE_EQ(a["energy_j"].get<double>(), 123.5);
  EXPECT_EQ(a["clock_event_reasons"], nlohmann::json::array({"sw_power_cap"}));
  ASSERT_EQ(a["processes"].size(), 2U);
  EXPECT_EQ(a["processes"][0]["pid"], 4242);
  EXPECT_EQ(a["processes"][0]["sm_util_pct"], 80);
  EXPECT_TRUE(a["processes"][1]["used_bytes"].is_null());
  const auto b = nlohmann::json::parse(rows[1]);
  EXPECT_EQ(b["gpu"], 1);
  for (const char* key : {"power_w", "energy_j", "temperature_c", "mem_used_bytes",
                          "clock_event_reasons", "sm_clock_mhz"}) {
    EXPECT_TRUE(b[key].is_null()) << key;
  }
}

TEST(MonitorTable, DashesForUnavailable) {
  const auto o = options(true);
  const auto header = lines(table_header(o));
  ASSERT_EQ(header.size(), 2U);
  EXPECT_NE(header[0].find("pwrW"), std::string::npos);
  const auto rows = lines(table_rows(sample_tick(), o));
  ASSERT_EQ(rows.size(), 4U);
  EXPECT_NE(rows[0].find("412.2"), std::string::npos) << rows[0];
  EXPECT_NE(rows[0].find("3072"), std::string::npos);
  EXPECT_NE(rows[0].find("sw_power_cap"), std::string::npos);
  EXPECT_NE(rows[1].find("4242"), std::string::npos);
  std::istringstream bare(rows[3]);
  std::vector<std::string> cells;
  for (std::string cell; bare >> cell;) cells.push_back(cell);
  ASSERT_EQ(cells.size(), 9U) << rows[3];
  EXPECT_EQ(cells[1], "5");
  for (std::size_t i = 3; i < cells.size(); ++i) EXPECT_EQ(cells[i], "-") << rows[3];
}

TEST(MonitorSummary, ListsEveryColumnAndOverhead) {
  const Tick t = sample_tick();
  Overhead o;
  o.ticks = 1;
  o.mean_tick = std::chrono::microseconds(250);
  o.max_tick = std::chrono::microseconds(400);
  o.thread_cpu = std::chrono::milliseconds(10);
  o.wall = std::chrono::seconds(1);
  const std::string text = summary_text(summarize({t}), false, o);
  EXPECT_NE(text.find("gpu_util_pct"), std::string::npos);
  EXPECT_NE(text.find("412.2"), std::string::npos);
  EXPECT_NE(text.find("0.250 ms per round"), std::string::npos) << text;
  EXPECT_NE(text.find("1.00% of one CPU"), std::string::npos) << text;
  EXPECT_EQ(text.find("pcie"), std::string::npos);
  EXPECT_NE(summary_text(summarize({t}), true, o).find("most recent"), std::string::npos);
}

TEST(MonitorPrometheus, SeriesForAvailableValuesOnly) {
  nvml::DeviceInfo info;
  info.index = 0;
  info.name = "NVIDIA \"H200\"";
  info.uuid = "GPU-1";
  info.memory_total_bytes = 1000;
  Overhead o;
  o.ticks = 7;
  const std::string text = prometheus_text(sample_tick(), {info}, o);
  const std::string labels = "gpu=\"0\",uuid=\"GPU-1\",name=\"NVIDIA \\\"H200\\\"\"";
  EXPECT_NE(text.find("dlprobe_gpu_power_watts{" + labels + "} 412.25\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE dlprobe_gpu_energy_joules counter"), std::string::npos);
  EXPECT_NE(text.find("dlprobe_gpu_throttled{" + labels + "} 1\n"), std::string::npos);
  EXPECT_NE(text.find("dlprobe_gpu_memory_total_bytes{" + labels + "} 1000\n"), std::string::npos);
  EXPECT_NE(text.find("dlprobe_process_memory_used_bytes{" + labels + ",pid=\"4242\"} 1073741824"),
            std::string::npos);
  EXPECT_NE(text.find("dlprobe_gpu_utilization_percent{gpu=\"1\"} 5\n"), std::string::npos);
  // GPU 1 has no power reading: no series rather than a 0.
  EXPECT_EQ(text.find("dlprobe_gpu_power_watts{gpu=\"1\"}"), std::string::npos);
  EXPECT_NE(text.find("dlprobe_monitor_samples_total 7\n"), std::string::npos);
  // Before the first round: the families, no GPU series.
  const std::string empty = prometheus_text(std::nullopt, {}, Overhead{});
  EXPECT_NE(empty.find("# TYPE dlprobe_gpu_power_watts gauge"), std::string::npos);
  EXPECT_EQ(empty.find("dlprobe_gpu_power_watts{"), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::monitor
