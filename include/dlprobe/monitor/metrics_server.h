// `dlprobe monitor --serve`: the latest round as Prometheus text on http://HOST:PORT/metrics,
// served from a thread of its own while the sampler runs. Built on cpp-httplib; a build without it
// (DLPROBE_WITH_HTTP=OFF) refuses --serve with Errc::unsupported.
#pragma once

#include <memory>
#include <string>
#include <string_view>

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

class MetricsServer {
 public:
  // Binds (Errc::io_error when it cannot), warns when the host is not a loopback address (other
  // machines can read the metrics) and serves. The GPUs' names and UUIDs from `nvml` label the
  // series.
  static Result<std::unique_ptr<MetricsServer>> start(const Endpoint& at,
                                                      const nvml::Library& nvml);
  ~MetricsServer();  // stops serving and joins the thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

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
