// The dlprobe binary's monitor command, run as a child process against the fake NVML: bad input,
// Ctrl-C, output to stdout and the Prometheus endpoint.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
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
      {"monitor", "-i", "5ms"},
      {"monitor", "-i", "100"},
      {"monitor", "-c", "0"},
      {"monitor", "-c", "x"},
      {"monitor", "--gpu", "3"},
      {"monitor", "--gpu", "0,,1"},
      {"monitor", "--gpu", "0,00"},
      {"monitor", "--duration", "1"},
      {"monitor", "--csv", "-", "--jsonl", "-"},
      {"monitor", "--serve", "nope"},
      {"monitor", "--csv", "/nonexistent/dir/x.csv"},
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

TEST(MonitorCli, ServeHostThatDoesNotResolveIsOneLine) {
  FakeScript script(kH200Script);
  // .invalid never resolves (RFC 6761).
  Process child = spawn({"monitor", "--serve", "no-such-host.invalid:0"});
  EXPECT_EQ(child.wait(), 2);
  const std::string err = child.err();
  EXPECT_EQ(err.rfind("dlprobe: error: --serve: cannot resolve 'no-such-host.invalid': ", 0), 0U)
      << err;
  EXPECT_EQ(count_lines(err), 1) << err;
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

// A bounded run keeps every round for its summary, the ones taken while the deadline is noticed
// too: as many as the rows written (one GPU).
TEST(MonitorCli, ADurationsSummaryHoldsEveryRound) {
  FakeScript script(kH200Script);
  for (const char* duration : {"29ms", "109ms"}) {
    Process child = spawn({"monitor", "-i", "10ms", "--duration", duration, "--csv", "-"});
    ASSERT_EQ(child.wait(), 0) << child.err();
    const std::string out = child.out();
    const std::string err = child.err();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(summary: (\d+) rounds)"))) << err;
    EXPECT_EQ(std::stoi(m[1]), count_lines(out) - 1) << duration << "\n" << out << err;
    EXPECT_EQ(err.find("dropped"), std::string::npos) << duration << "\n" << err;
  }
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

// The port a `monitor --serve 127.0.0.1:0` child announces on stderr; 0 when it does not.
int served_port(Process& child) {
  const std::regex announced(R"(http://127\.0\.0\.1:(\d+)/metrics)");
  if (!child.wait_for_output(announced, Stream::err)) return 0;
  const std::string err = child.err();
  std::smatch m;
  return std::regex_search(err, m, announced) ? std::stoi(m[1]) : 0;
}

// `--gpu 1` of two GPUs: every series, the memory size's too, is GPU 1's alone.
TEST(MonitorCli, ServesOnlyTheGpusAskedFor) {
  FakeScript script(std::string(kH200Script) +
                    "device\nname NVIDIA H100\nmemory_total 1000\nmem_used 500\n");
  Process child = spawn({"monitor", "-i", "10ms", "--gpu", "1", "--serve", "127.0.0.1:0"});
  const int port = served_port(child);
  ASSERT_GT(port, 0) << child.err();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(2);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("dlprobe_gpu_memory_total_bytes{gpu=\"1\""), std::string::npos)
      << res->body;
  EXPECT_EQ(res->body.find("gpu=\"0\""), std::string::npos) << res->body;
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(), 0) << child.err();
}

// A connection to 127.0.0.1:`port`; -1 when it cannot be made.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closes `fd` (end of file or reset) within `timeout`; what it sends first (a
// 400 or 503) is read and dropped (0: only what has already happened).
bool closed_within(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0))) <= 0) {
      if (left.count() <= 0) return false;
      continue;
    }
    char buffer[512];
    if (::recv(fd, buffer, sizeof buffer, 0) <= 0) return true;
  }
}

// A client that begins a request and never ends it: a header line every `every` (slowloris).
class SlowClient {
 public:
  SlowClient(int port, std::chrono::milliseconds every) : fd_(connect_to(port)) {
    if (fd_ < 0) return;
    thread_ = std::thread([this, every] {
      send_text("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n");
      auto next = std::chrono::steady_clock::now() + every;
      while (!stop_) {
        if (std::chrono::steady_clock::now() < next) {
          std::this_thread::sleep_for(10ms);
          continue;
        }
        send_text("X-Slow: 1\r\n");
        next += every;
      }
    });
  }
  ~SlowClient() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  SlowClient(const SlowClient&) = delete;
  SlowClient& operator=(const SlowClient&) = delete;
  int fd() const { return fd_; }

 private:
  void send_text(const std::string& text) const {
    // A send to a connection the server closed fails; that is what the tests look for.
    [[maybe_unused]] const ssize_t n = ::send(fd_, text.data(), text.size(), MSG_NOSIGNAL);
  }
  int fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(MonitorCli, SlowClientsNeitherStarveMetricsNorHoldCtrlC) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "--serve", "127.0.0.1:0"});
  const int port = served_port(child);
  ASSERT_GT(port, 0) << child.err();
  std::vector<std::unique_ptr<SlowClient>> slow;
  for (int i = 0; i < 16; ++i) {
    slow.push_back(std::make_unique<SlowClient>(port, 2s));
    ASSERT_GE(slow.back()->fd(), 0);
  }
  std::this_thread::sleep_for(300ms);  // every slow request under way

  // The bounds below are loose for a loaded machine; without them the answer never came.
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  const auto asked = std::chrono::steady_clock::now();
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 4s);

  const auto interrupted = std::chrono::steady_clock::now();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(10s), 0) << child.err();
  EXPECT_LT(std::chrono::steady_clock::now() - interrupted, 4s);
}

TEST(MonitorCli, SlowRequestIsCutAtItsBound) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "--serve", "127.0.0.1:0"});
  const int port = served_port(child);
  ASSERT_GT(port, 0) << child.err();
  SlowClient slow(port, 500ms);
  ASSERT_GE(slow.fd(), 0);
  // A request's head and body are read within 5 s of its first byte, however steadily it trickles.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(closed_within(slow.fd(), 9s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 4s);
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(5s), 0) << child.err();
}

TEST(MonitorCli, DurationEndsTheRunWhateverClientsDo) {
  FakeScript script(kH200Script);
  const auto start = std::chrono::steady_clock::now();
  Process child = spawn({"monitor", "-i", "10ms", "--duration", "1s", "--serve", "127.0.0.1:0"});
  const int port = served_port(child);
  ASSERT_GT(port, 0) << child.err();
  SlowClient slow(port, 200ms);
  ASSERT_GE(slow.fd(), 0);
  EXPECT_EQ(child.wait(10s), 0) << child.err();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
}

// The first line the server sends on `fd` within `timeout`; empty when none comes.
std::string first_line(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string seen;
  while (seen.find("\r\n") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[256];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return "";
    seen.append(buffer, static_cast<std::size_t>(n));
  }
  return seen.substr(0, seen.find("\r\n"));
}

TEST(MonitorCli, ConnectionsPastTheBoundAreRefused) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "--serve", "127.0.0.1:0"});
  const int port = served_port(child);
  ASSERT_GT(port, 0) << child.err();
  // 32 requests under way fill the bound (a header line a second keeps each within its bounds
  // for 5 s); a connection past it is answered 503 at once.
  std::vector<std::unique_ptr<SlowClient>> busy;
  for (int i = 0; i < 32; ++i) {
    busy.push_back(std::make_unique<SlowClient>(port, 1s));
    ASSERT_GE(busy.back()->fd(), 0);
    std::this_thread::sleep_for(20ms);  // one at a time into the listen backlog
  }
  for (int i = 0; i < 3; ++i) {
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(first_line(fd, 2s), "HTTP/1.1 503 Service Unavailable");
    ::close(fd);
  }
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(5s), 0) << child.err();
}

TEST(MonitorCli, NonLoopbackServeWarns) {
  FakeScript script(kH200Script);
  Process child = spawn({"monitor", "-i", "10ms", "-c", "2", "--serve", "0.0.0.0:0"});
  EXPECT_EQ(child.wait(), 0) << child.err();
  EXPECT_NE(child.err().find("not a loopback address"), std::string::npos) << child.err();
}

}  // namespace
}  // namespace dlprobe
