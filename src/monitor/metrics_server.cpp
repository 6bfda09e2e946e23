#include "dlprobe/monitor/metrics_server.h"

#include <fmt/format.h>

#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/monitor/output.h"

#ifdef DLPROBE_WITH_HTTP
#include <httplib.h>

#include <mutex>
#include <thread>
#include <vector>
#endif

namespace dlprobe::monitor {

#ifdef DLPROBE_WITH_HTTP

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

struct MetricsServer::State {
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::vector<nvml::DeviceInfo> devices;
  std::mutex mutex;  // over `serving`, which the server thread reads
  const Sampler* serving = nullptr;
};

Result<Endpoint> parse_endpoint(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return invalid_argument(
        fmt::format("--serve: '{}' is not HOST:PORT (e.g. 127.0.0.1:9400)", text));
  }
  Endpoint e;
  e.host = std::string(text.substr(0, colon));
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') {
    e.host = e.host.substr(1, e.host.size() - 2);
  }
  DLPROBE_ASSIGN_OR_RETURN(auto port, parse_int(text.substr(colon + 1), "--serve port", 0, 65535));
  e.port = static_cast<int>(port);
  return e;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const Endpoint& at,
                                                            const nvml::Library& nvml) {
  if (!is_loopback(at.host)) {
    log_warn("--serve {}: not a loopback address, so other machines can read the metrics", at.host);
  }
  auto state = std::make_unique<State>();
  if (auto count = nvml.device_count()) {
    for (unsigned i = 0; i < *count; ++i) {
      if (auto info = nvml.device_info(i)) state->devices.push_back(std::move(info).value());
    }
  }
  int port = at.port;
  const bool bound = port == 0 ? (port = state->server.bind_to_any_port(at.host)) > 0
                               : state->server.bind_to_port(at.host, port);
  if (!bound) {
    return error(Errc::io_error, fmt::format("--serve: cannot listen on {}:{}", at.host, port));
  }
  state->port = port;
  State& s = *state;
  s.server.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lock(s.mutex);
    std::optional<Tick> latest;
    Overhead overhead;
    if (s.serving != nullptr) {
      latest = s.serving->latest();
      overhead = s.serving->overhead();
    }
    res.set_content(prometheus_text(latest, s.devices, overhead),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  s.server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("dlprobe monitor: metrics at /metrics\n", "text/plain");
  });
  s.thread = std::thread([&s] { s.server.listen_after_bind(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(state)));
}

MetricsServer::~MetricsServer() {
  state_->server.stop();
  if (state_->thread.joinable()) state_->thread.join();
}

void MetricsServer::serve(const Sampler* sampler) {
  std::lock_guard lock(state_->mutex);
  state_->serving = sampler;
}

#else

struct MetricsServer::State {
  int port = 0;
};

namespace {

Status no_http() {
  return error(Errc::unsupported,
               "--serve: this dlprobe was built without HTTP support (DLPROBE_WITH_HTTP=OFF)");
}

}  // namespace

Result<Endpoint> parse_endpoint(std::string_view) {
  return no_http();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const Endpoint&, const nvml::Library&) {
  return no_http();
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::serve(const Sampler*) {}

#endif

MetricsServer::MetricsServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

int MetricsServer::port() const {
  return state_->port;
}

}  // namespace dlprobe::monitor
