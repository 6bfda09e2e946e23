// The HTTP side of `dlprobe monitor --serve` (monitor::MetricsServer): a connection's bytes go
// through cpp-httplib's request parsing, the Host check and the routes, from memory
// (MetricsServer::answer), with no socket. The first byte picks the --serve host (loopback, a
// name resolving to two loopback addresses, the wildcard, another machine's address); the rest is
// what the client sends. Every answer is HTTP responses, and the metrics appear in none whose
// status is not a success (2xx).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/monitor/metrics_server.h"

namespace {

using dlprobe::monitor::MetricsServer;

struct Served {
  const char* host;
  std::vector<std::string> addresses;  // what the host resolves to (no DNS while fuzzing)
};

std::vector<std::unique_ptr<MetricsServer>> make_servers() {
  const std::vector<Served> hosts = {{"127.0.0.1", {"127.0.0.1"}},
                                     {"localhost", {"127.0.0.1", "::1"}},
                                     {"0.0.0.0", {"0.0.0.0"}},
                                     {"gpu-node.example", {"10.1.2.3"}}};
  dlprobe::nvml::DeviceInfo gpu;
  gpu.name = "NVIDIA H200";
  gpu.uuid = "GPU-00000000-1111-2222-3333-444444444444";
  std::vector<std::unique_ptr<MetricsServer>> out;
  for (const Served& s : hosts) {
    auto server = MetricsServer::offline(
        {s.host, 9400}, {gpu},
        [&s](const std::string&) -> dlprobe::Result<std::vector<std::string>> {
          return s.addresses;
        });
    if (!server) std::abort();
    out.push_back(std::move(server).value());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto servers = make_servers();
  if (size == 0) return 0;
  const std::string_view request(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string answer = servers[data[0] % servers.size()]->answer(request);
  if (answer.empty()) return 0;
  static constexpr std::string_view kStatus = "HTTP/1.1 ";
  if (!answer.starts_with(kStatus)) std::abort();
  // Each response, from its status line to the next one (a body holds no status line).
  for (std::size_t at = 0; at != std::string::npos;) {
    const std::size_t next = answer.find(kStatus, at + kStatus.size());
    const std::string_view response = std::string_view(answer).substr(at, next - at);
    // 200, or 206 for a Range of the metrics.
    const bool ok = response.substr(kStatus.size(), 1) == "2";
    if (!ok && response.find("dlprobe_gpu_") != std::string_view::npos) std::abort();
    at = next;
  }
  return 0;
}
