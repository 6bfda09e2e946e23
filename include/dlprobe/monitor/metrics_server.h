// `dlprobe monitor --serve`: the latest round as Prometheus text on http://HOST:PORT/metrics,
// served from a thread of its own while the sampler runs. Built on cpp-httplib; a build without it
// (DLPROBE_WITH_HTTP=OFF) refuses --serve with Errc::unsupported.
//
// Clients cannot hold the endpoint or the process: every connection has its own thread, up to a
// bound (those past it get 503 and are closed); a request is read within a bound on each read and
// on the whole, and an idle keep-alive connection is closed; destroying the server ends every
// connection at once, whatever its client is doing.
//
// A request must name this server in its Host header (421 otherwise): a web page whose DNS name
// an attacker points at this machine (DNS rebinding) sends its own name there, so it cannot read
// the metrics through the user's browser.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/monitor/sampler.h"

namespace dlprobe::monitor {

struct Endpoint {
  std::string host;  // without the brackets of "[::1]:9400"
  int port = 0;      // 0: a free one
};

// "HOST:PORT" as --serve takes it; Errc::unsupported in a build that cannot serve.
Result<Endpoint> parse_endpoint(std::string_view text);

// The numeric addresses ("127.0.0.1", "::1") `host` resolves to for a listening TCP socket, in
// getaddrinfo's order; Errc::invalid_argument naming the host when it resolves to none.
Result<std::vector<std::string>> resolve_host(const std::string& host);
using HostResolver = std::function<Result<std::vector<std::string>>(const std::string& host)>;

struct ServeLimits {
  std::chrono::milliseconds read_timeout{2000};   // one read of a request
  std::chrono::milliseconds request_read{5000};   // a request's head and body, from its first byte
  std::chrono::milliseconds idle{5000};           // a keep-alive connection between requests
  std::chrono::milliseconds write_timeout{5000};  // one write of a response
  std::size_t max_connections = 32;               // open at once
};

class MetricsServer {
 public:
  // Resolves the host with `resolve` (an error when it names no address), warns when any of its
  // addresses is not a loopback one (other machines can read the metrics), binds the first of
  // them that can be bound (Errc::io_error when none can) and serves. The GPUs' names and UUIDs
  // from `nvml` label the series; `gpus` (NVML indices; empty: every GPU) are those served.
  static Result<std::unique_ptr<MetricsServer>> start(const Endpoint& at, const nvml::Library& nvml,
                                                      const ServeLimits& limits = {},
                                                      const HostResolver& resolve = resolve_host,
                                                      const std::vector<unsigned>& gpus = {});
  ~MetricsServer();  // ends every connection, stops serving and joins the threads
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // A server that binds nothing, for tests and fuzzing of its request handling: answer() hands it
  // a connection's bytes. Its Host check is start()'s for `at`, with at.port the port bound.
  static Result<std::unique_ptr<MetricsServer>> offline(const Endpoint& at,
                                                        std::vector<nvml::DeviceInfo> devices,
                                                        const HostResolver& resolve = resolve_host);
  // What the server writes back on a connection whose client sent `request` (one request, or
  // several kept alive) and then closed its side: the same HTTP parsing, Host check and routes as
  // a socket's connection, through memory. Empty in a build without HTTP.
  std::string answer(std::string_view request);

  int port() const;  // the one bound, also when 0 was asked for
  // The sampler whose latest round /metrics shows, until serve(nullptr); before it ends, the
  // metrics have no samples.
  void serve(const Sampler* sampler);

  struct State;

 private:
  explicit MetricsServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace dlprobe::monitor
