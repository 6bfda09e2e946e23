// The dlprobe binary's monitor command, run as a child process against the fake NVML: bad input,
// Ctrl-C, output to stdout and the Prometheus endpoint.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/run_dlprobe.h"
#include "fake_script.h"

namespace dlprobe {
namespace {

using namespace std::chrono_literals;
using dlprobe::testing::FakeScript;
using dlprobe::testing::kH200Script;
using dlprobe::testing::Process;
using dlprobe::testing::start_dlprobe;
using dlprobe::testing::Stream;

// dlprobe with `args` and NVML from the fake (or `nvml`).
Process spawn(std::vector<std::string> args, const char* nvml = DLPROBE_FAKE_NVML) {
  return start_dlprobe(std::move(args), {.env = {{"DLPROBE_NVML_LIBRARY", nvml}}});
}

int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n' ? 1 : 0;
  return n;
}

TEST(MonitorCli, BadInputIsOneLineAndExitTwo) {
  FakeScript script(kH200Script);
  const std::vector<std::vector<std::string>> cases = {
      {"monitor", "-i", "5ms"},       {"monitor", "-i", "100"},
      {"monitor", "-c", "0"},         {"monitor", "-c", "x"},
      {"monitor", "--gpu", "3"},      {"monitor", "--gpu", "0,,1"},
      {"monitor", "--duration", "1"}, {"monitor", "--csv", "-", "--jsonl", "-"},
      {"monitor", "--serve", "nope"}, {"monitor", "--csv", "/nonexistent/dir/x.csv"},
  };
  for (const auto& args : cases) {
    Process child = spawn(args);
    EXPECT_EQ(child.wait(), 2) << args[1] << " " << args[2];
    const std::string err = child.err();
    EXPECT_EQ(err.rfind("dlprobe: error: ", 0), 0U) << err;
    EXPECT_EQ(count_lines(err), 1) << err;
    EXPECT_EQ(child.out(), "") << args[1] << " " << args[2];
  }
}

TEST(MonitorCli, MissingNvmlIsAClearError) {
  Process child = spawn({"monitor", "-c", "1"}, "/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(child.wait(), 2);
  EXPECT_NE(child.err().find("NVIDIA driver"), std::string::npos) << child.err();
  EXPECT_EQ(count_lines(child.err()), 1);
}

TEST(MonitorCli, CountEndsWithSummary) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "-c", "3", "--processes"});
  ASSERT_EQ(child.wait(), 0) << child.err();
  const std::string out = child.out();
  EXPECT_NE(out.find("sw_power_cap,hw_thermal_slowdown"), std::string::npos) << out;
  EXPECT_NE(out.find("summary: 3 rounds"), std::string::npos) << out;
  EXPECT_NE(out.find("4242"), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(gpu_util_pct +10\.0 +50\.0 +90\.0)"))) << out;
}

TEST(MonitorCli, JsonlOnStdoutHidesTheTable) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "-c", "2", "--jsonl", "-"});
  ASSERT_EQ(child.wait(), 0) << child.err();
  std::istringstream in(child.out());
  int rows = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    const auto row = nlohmann::json::parse(line);
    EXPECT_EQ(row["gpu"], 0);
  }
  EXPECT_EQ(rows, 2);
  EXPECT_NE(child.err().find("summary: 2 rounds"), std::string::npos);
}

TEST(MonitorCli, CtrlCEndsCleanlyWithSummary) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms"});
  ASSERT_TRUE(child.wait_for_output(std::regex("hw_thermal_slowdown"), Stream::out)) << child.err();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(), 0) << child.err();
  const std::string out = child.out();
  EXPECT_NE(out.find("summary: "), std::string::npos) << out;
  EXPECT_NE(out.find("sampler overhead"), std::string::npos);
  EXPECT_EQ(child.err(), "");
}

TEST(MonitorCli, DurationEndsTheRun) {
  FakeScript script(kH200Script);
  const auto start = std::chrono::steady_clock::now();
  Process child = spawn({"monitor", "-i", "10ms", "--duration", "200ms", "--csv", "-"});
  ASSERT_EQ(child.wait(), 0) << child.err();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  const std::string out = child.out();
  EXPECT_EQ(out.rfind("time_s,unix_s,gpu,", 0), 0U) << out;
  EXPECT_GE(count_lines(out), 5);
}

TEST(MonitorCli, ServesPrometheusMetrics) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "--processes", "--serve", "127.0.0.1:0"});
  std::smatch m;
  ASSERT_TRUE(
      child.wait_for_output(std::regex(R"(http://127\.0\.0\.1:(\d+)/metrics)"), Stream::err))
      << child.err();
  const std::string err = child.err();
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(127\.0\.0\.1:(\d+)/metrics)")));
  const int port = std::stoi(m[1]);

  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(2);
  std::string body;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  // The series appear once the third scripted round is in (power 200 W, no throttling).
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    ASSERT_EQ(res->status, 200);
    body = res->body;
    if (body.find("dlprobe_gpu_power_watts{gpu=\"0\",uuid=\"GPU-11111111-2222-3333-4444-"
                  "555555555555\",name=\"NVIDIA H200\"} 200\n") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(body.find("dlprobe_gpu_power_watts{gpu=\"0\""), std::string::npos) << body;
  EXPECT_NE(body.find("} 200\n"), std::string::npos) << body;
  EXPECT_NE(body.find("dlprobe_gpu_throttled{gpu=\"0\""), std::string::npos);
  EXPECT_NE(body.find("dlprobe_gpu_energy_joules{gpu=\"0\""), std::string::npos);
  EXPECT_NE(body.find("dlprobe_gpu_memory_total_bytes{gpu=\"0\""), std::string::npos);
  EXPECT_NE(body.find("dlprobe_process_memory_used_bytes{gpu=\"0\""), std::string::npos);
  EXPECT_NE(body.find("pid=\"4242\"} 1073741824"), std::string::npos) << body;
  EXPECT_NE(body.find("dlprobe_monitor_samples_total "), std::string::npos);

  auto root = client.Get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 200);
  // Read-only: nothing but GET is served.
  auto post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);
  EXPECT_EQ(client.Get("/other")->status, 404);

  child.signal(SIGINT);
  EXPECT_EQ(child.wait(), 0) << child.err();
  EXPECT_NE(child.out().find("summary: "), std::string::npos);
}

TEST(MonitorCli, NonLoopbackServeWarns) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "-c", "2", "--serve", "0.0.0.0:0"});
  EXPECT_EQ(child.wait(), 0) << child.err();
  EXPECT_NE(child.err().find("not a loopback address"), std::string::npos) << child.err();
}

}  // namespace
}  // namespace dlprobe
