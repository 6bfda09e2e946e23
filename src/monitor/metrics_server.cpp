#include "dlprobe/monitor/metrics_server.h"

#include <fmt/format.h>

#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/monitor/output.h"

#include <netdb.h>
#include <sys/socket.h>

#include <array>
#include <cstring>

#ifdef DLPROBE_WITH_HTTP
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>
#endif

namespace dlprobe::monitor {

Result<std::vector<std::string>> resolve_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return invalid_argument(
        fmt::format("--serve: cannot resolve '{}': {}", host,
                    rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc)));
  }
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    std::array<char, NI_MAXHOST> text{};
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text.data(), text.size(), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      addresses.emplace_back(text.data());
    }
  }
  ::freeaddrinfo(found);
  if (addresses.empty()) {
    return invalid_argument(fmt::format("--serve: '{}' resolves to no address", host));
  }
  return addresses;
}

#ifdef DLPROBE_WITH_HTTP

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// `text` as inet_ntop writes the address it spells ("0::1" -> "::1"); nullopt when it is no IPv4
// dotted quad or IPv6 literal (a name).
std::optional<std::string> canonical_address(const std::string& text) {
  std::array<unsigned char, sizeof(in6_addr)> bytes{};
  std::array<char, INET6_ADDRSTRLEN> out{};
  for (const int family : {AF_INET, AF_INET6}) {
    if (::inet_pton(family, text.c_str(), bytes.data()) == 1 &&
        ::inet_ntop(family, bytes.data(), out.data(), out.size()) != nullptr) {
      return std::string(out.data());
    }
  }
  return std::nullopt;
}

// 127.0.0.0/8, ::1 and IPv4-mapped 127.0.0.0/8 (an address in canonical form).
bool is_loopback_address(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address.rfind("::ffff:127.", 0) == 0;
}

bool is_wildcard_address(const std::string& address) {
  return address == "0.0.0.0" || address == "::";
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (out.size() > 1 && out.back() == '.') out.pop_back();  // "localhost." names localhost too
  return out;
}

// Whom a Host header names: "name", "name:port", "[v6]" or "[v6]:port" (port -1 when absent);
// nullopt when it is none of them.
struct HostHeader {
  std::string host;
  int port = -1;
};

std::optional<HostHeader> parse_host_header(std::string_view value) {
  HostHeader h;
  std::string_view rest;
  if (!value.empty() && value.front() == '[') {
    const auto close = value.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    h.host = std::string(value.substr(1, close - 1));
    rest = value.substr(close + 1);
  } else {
    const auto colon = value.find(':');
    h.host = std::string(value.substr(0, colon));
    if (colon != std::string_view::npos) rest = value.substr(colon);
  }
  if (h.host.empty()) return std::nullopt;
  // No control character (NUL, CR, LF, DEL ...) belongs in a host name.
  for (const char c : h.host) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) return std::nullopt;
  }
  if (rest.empty() || rest == ":") return h;
  if (rest.front() != ':' || rest.size() > 6) return std::nullopt;
  int port = 0;
  for (const char c : rest.substr(1)) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + (c - '0');
  }
  if (port > 65535) return std::nullopt;
  h.port = port;
  return h;
}

// Which Host headers name this server.
struct HostRule {
  std::string name;                    // as --serve gave it, lowercased
  std::vector<std::string> addresses;  // what it resolved to, canonical
  bool loopback_only = false;          // every address a loopback one
  bool wildcard = false;               // 0.0.0.0 or ::, every address of the machine
  int port = 0;                        // the one bound

  bool accepts(const HostHeader& h) const {
    if (h.port >= 0 && h.port != port) return false;
    const std::string host = lowercase(h.host);
    if (host == name) return true;
    const auto address = canonical_address(host);
    if (!address) return loopback_only && host == "localhost";
    if (std::find(addresses.begin(), addresses.end(), *address) != addresses.end()) return true;
    if (loopback_only) return is_loopback_address(*address);
    // An address literal cannot be rebound: a page whose origin is one was served from that
    // address, so when every address of the machine is bound, any literal names this server.
    return wildcard;
  }
};

// Set on the accepting thread while it turns away a connection past the bound (ConnectionThreads).
thread_local bool t_over_bound = false;

// A thread per connection, at most `bound` at once: httplib's pool of 8 workers queues every
// further connection behind the busy ones, so a few slow clients kept /metrics from any answer.
// The task httplib enqueues only says "process this socket", and it must run for the socket to be
// closed: past the bound it runs at once on the accepting thread, marked, and refuses.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(std::size_t bound) : bound_(bound) {}
  ~ConnectionThreads() override { shutdown(); }
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  void enqueue(std::function<void()> fn) override {
    std::unique_lock lock(mutex_);
    reap();
    if (workers_.size() < bound_) {
      Worker& w = workers_.emplace_back();
      try {
        w.thread = std::thread([this, &w, fn] {
          fn();
          std::lock_guard done(mutex_);
          w.done = true;
        });
        return;
      } catch (const std::system_error&) {
        workers_.pop_back();  // no thread to be had: refused like one past the bound
      }
    }
    lock.unlock();
    t_over_bound = true;
    fn();
    t_over_bound = false;
  }

  // httplib calls it once the accepting loop has ended; the server woke every connection first.
  void shutdown() override {
    std::list<Worker> all;
    {
      std::lock_guard lock(mutex_);
      all.swap(workers_);  // list nodes keep their addresses, which the threads hold
    }
    for (Worker& w : all) {
      if (w.thread.joinable()) w.thread.join();
    }
  }

 private:
  struct Worker {
    std::thread thread;
    bool done = false;  // under mutex_
  };

  // Joins the threads whose connection has ended (mutex_ held).
  void reap() {
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->done) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::size_t bound_;
  std::mutex mutex_;
  std::list<Worker> workers_;
};

// One connection's socket as httplib reads and writes requests through it. cpp-httplib 0.11.4
// bounds each read but not a request: a client sending a header line every 2 s held its worker
// for good. Here every wait also ends at the request's deadline and at the server's wake-up.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int sock, int wake, const ServeLimits& limits)
      : sock_(sock), wake_(wake), limits_(limits) {}

  // Waits for the first byte of the next request (up to the idle bound) and starts its clock;
  // false when the client closed or went quiet, a read failed, or the server is stopping.
  bool next_request() {
    if (failed_) return false;
    if (offset_ == size_ && !wait(POLLIN, limits_.idle)) return false;
    deadline_ = Clock::now() + limits_.request_read;
    return true;
  }

  bool is_readable() const override { return offset_ < size_ || wait(POLLIN, read_wait()); }
  bool is_writable() const override { return wait(POLLOUT, limits_.write_timeout); }

  ssize_t read(char* ptr, size_t size) override {
    if (offset_ == size_) {
      const ssize_t n = wait(POLLIN, read_wait())
                            ? ::recv(sock_, buffer_.data(), buffer_.size(), MSG_DONTWAIT)
                            : -1;
      if (n <= 0) {
        failed_ = true;
        return n;
      }
      offset_ = 0;
      size_ = static_cast<std::size_t>(n);
    }
    const std::size_t n = std::min(size, size_ - offset_);
    std::memcpy(ptr, buffer_.data() + offset_, n);
    offset_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      if (!wait(POLLOUT, limits_.write_timeout)) return -1;
      const ssize_t n = ::send(sock_, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // One read's wait: what is left of the request's bound, at most the bound on a read.
  milliseconds read_wait() const {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now());
    return std::clamp(left, milliseconds(0), limits_.read_timeout);
  }

  // True when the socket is ready for `events` within `timeout`; false on the timeout, or as soon
  // as the server's wake-up is readable.
  bool wait(short events, milliseconds timeout) const {
    const auto end = Clock::now() + timeout;
    for (;;) {
      std::array<pollfd, 2> fds{{{sock_, events, 0}, {wake_, POLLIN, 0}}};
      const auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now());
      const int n = ::poll(fds.data(), fds.size(),
                           static_cast<int>(std::max<milliseconds::rep>(left.count(), 0)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || fds[1].revents != 0) return false;
      return (fds[0].revents & (events | POLLHUP | POLLERR)) != 0;
    }
  }

  void address(bool peer, std::string& ip, int& port) const {
    sockaddr_storage storage{};
    socklen_t length = sizeof storage;
    auto* addr = reinterpret_cast<sockaddr*>(&storage);
    if ((peer ? ::getpeername(sock_, addr, &length) : ::getsockname(sock_, addr, &length)) != 0) {
      return;
    }
    std::array<char, NI_MAXHOST> host{};
    std::array<char, NI_MAXSERV> service{};
    if (::getnameinfo(addr, length, host.data(), host.size(), service.data(), service.size(),
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host.data();
      port = std::atoi(service.data());
    }
  }

  int sock_;
  int wake_;
  const ServeLimits& limits_;
  Clock::time_point deadline_{};
  std::array<char, 4096> buffer_{};
  std::size_t offset_ = 0;
  std::size_t size_ = 0;
  bool failed_ = false;  // a read timed out or failed: the connection is done
};

// A connection through memory: reads `in`, then the end of the stream as when the client has
// closed its side; keeps what the server writes.
class MemoryStream final : public httplib::Stream {
 public:
  explicit MemoryStream(std::string_view in) : in_(in) {}

  bool next_request() const { return offset_ < in_.size(); }
  std::string written() && { return std::move(out_); }

  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const std::size_t n = std::min(size, in_.size() - offset_);
    std::memcpy(ptr, in_.data() + offset_, n);
    offset_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  std::string_view in_;
  std::size_t offset_ = 0;
  std::string out_;
};

// httplib's parsing and routing (process_request) with the connection handling replaced: a
// thread per connection up to a bound, DeadlineStream's bounds on reading, and shut(), which ends
// every connection at once (Server::stop() only closes the listening socket, then waits for the
// workers, which wait for their clients).
class BoundedServer final : public httplib::Server {
 public:
  explicit BoundedServer(const ServeLimits& limits)
      : limits_(limits), wake_(::eventfd(0, EFD_CLOEXEC)) {
    new_task_queue = [this] { return new ConnectionThreads(limits_.max_connections); };
    // /metrics takes no body; a large one is refused unread.
    set_payload_max_length(64 * 1024);
  }
  ~BoundedServer() override {
    if (wake_ >= 0) ::close(wake_);
  }
  BoundedServer(const BoundedServer&) = delete;
  BoundedServer& operator=(const BoundedServer&) = delete;

  bool valid() const { return wake_ >= 0; }

  // Wakes every connection's wait, now and later, and ends the accepting loop, also when it has
  // not begun yet (Server::stop() does nothing then, and listen would go on for good).
  void shut() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_, &one, sizeof one);
    const socket_t listening = svr_sock_.exchange(INVALID_SOCKET);
    if (listening != INVALID_SOCKET) {
      ::shutdown(listening, SHUT_RDWR);
      ::close(listening);
    }
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    bool ok = false;
    if (t_over_bound) {
      static constexpr std::string_view kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      ok = ::send(sock, kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
           static_cast<ssize_t>(kBusy.size());
    } else {
      DeadlineStream stream(sock, wake_, limits_);
      ok = serve_connection(stream);
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  // The requests of one connection, each answered, while the client sends more and keeps the
  // connection alive; `stream` says when the next one begins (next_request()).
  template <class ConnectionStream>
  bool serve_connection(ConnectionStream& stream) {
    bool ok = false;
    for (std::size_t left = keep_alive_max_count_; left > 0 && stream.next_request(); --left) {
      bool closed = false;
      ok = process_request(stream, left == 1, closed, nullptr);
      if (!ok || closed) break;
    }
    return ok;
  }

 public:
  // What serve_connection writes back for the bytes `request`, read from memory.
  std::string answer(std::string_view request) {
    MemoryStream stream(request);
    serve_connection(stream);
    return std::move(stream).written();
  }

 private:
  ServeLimits limits_;
  int wake_;  // an eventfd, readable once shut() has run
};

}  // namespace

struct MetricsServer::State {
  explicit State(const ServeLimits& limits) : server(limits) {}
  BoundedServer server;
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

namespace {

// The Host headers that name a server on `at`, from what its host resolves to (an error when it
// resolves to none); warns when other machines can reach it. The port is the caller's to set.
Result<HostRule> host_rule(const Endpoint& at, const HostResolver& resolve) {
  DLPROBE_ASSIGN_OR_RETURN(auto resolved, resolve(at.host));
  HostRule rule;
  rule.name = lowercase(at.host);
  rule.loopback_only = true;
  for (const std::string& text : resolved) {
    const std::string address = canonical_address(text).value_or(text);
    rule.loopback_only = rule.loopback_only && is_loopback_address(address);
    rule.wildcard = rule.wildcard || is_wildcard_address(address);
    rule.addresses.push_back(address);
  }
  if (!rule.loopback_only) {
    log_warn("--serve {}: not a loopback address, so other machines can read the metrics", at.host);
  }
  return rule;
}

// The Host check and the routes, as every connection of `s` answers them.
void route(MetricsServer::State& s, HostRule rule);

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const Endpoint& at,
                                                            const nvml::Library& nvml,
                                                            const ServeLimits& limits,
                                                            const HostResolver& resolve,
                                                            const std::vector<unsigned>& gpus) {
  DLPROBE_ASSIGN_OR_RETURN(auto rule, host_rule(at, resolve));
  auto state = std::make_unique<State>(limits);
  if (!state->server.valid()) {
    return error(Errc::io_error,
                 fmt::format("--serve: cannot create an eventfd: {}", std::strerror(errno)));
  }
  if (auto count = nvml.device_count()) {
    for (unsigned i = 0; i < *count; ++i) {
      if (!gpus.empty() && std::find(gpus.begin(), gpus.end(), i) == gpus.end()) continue;
      if (auto info = nvml.device_info(i)) state->devices.push_back(std::move(info).value());
    }
  }
  // The addresses in the order getaddrinfo gave them, the first that binds served, as httplib
  // would bind the name; the warning above and the bind thus come from one resolution.
  int port = 0;
  for (const std::string& address : rule.addresses) {
    port = at.port;
    const bool bound = port == 0 ? (port = state->server.bind_to_any_port(address)) > 0
                                 : state->server.bind_to_port(address, port);
    if (bound) break;
    port = 0;
  }
  if (port == 0) {
    return error(Errc::io_error, fmt::format("--serve: cannot listen on {}:{}", at.host, at.port));
  }
  rule.port = port;
  state->port = port;
  State& s = *state;
  route(s, std::move(rule));
  s.thread = std::thread([&s] { s.server.listen_after_bind(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(state)));
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::offline(const Endpoint& at,
                                                              std::vector<nvml::DeviceInfo> devices,
                                                              const HostResolver& resolve) {
  DLPROBE_ASSIGN_OR_RETURN(auto rule, host_rule(at, resolve));
  auto state = std::make_unique<State>(ServeLimits{});
  if (!state->server.valid()) {
    return error(Errc::io_error,
                 fmt::format("--serve: cannot create an eventfd: {}", std::strerror(errno)));
  }
  state->devices = std::move(devices);
  rule.port = at.port;
  state->port = at.port;
  route(*state, std::move(rule));
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(state)));
}

std::string MetricsServer::answer(std::string_view request) {
  return state_->server.answer(request);
}

namespace {

void route(MetricsServer::State& s, HostRule rule) {
  s.server.set_pre_routing_handler([rule = std::move(rule)](const httplib::Request& req,
                                                            httplib::Response& res) {
    // The header's whole value from the map: get_header_value() hands it over as a C string,
    // which would end a value like "127.0.0.1\0evil" at its NUL.
    const auto found = req.headers.find("Host");
    const auto host = req.get_header_value_count("Host") == 1 && found != req.headers.end()
                          ? parse_host_header(found->second)
                          : std::nullopt;
    if (host && rule.accepts(*host)) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 421;
    res.set_content("dlprobe monitor: the Host header does not name this server\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
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
}

}  // namespace

MetricsServer::~MetricsServer() {
  state_->server.shut();
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

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const Endpoint&, const nvml::Library&,
                                                            const ServeLimits&, const HostResolver&,
                                                            const std::vector<unsigned>&) {
  return no_http();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::offline(const Endpoint&,
                                                              std::vector<nvml::DeviceInfo>,
                                                              const HostResolver&) {
  return no_http();
}

std::string MetricsServer::answer(std::string_view) {
  return {};
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::serve(const Sampler*) {}

#endif

MetricsServer::MetricsServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

int MetricsServer::port() const {
  return state_->port;
}

}  // namespace dlprobe::monitor
