// The Prometheus endpoint in process: which Host headers it serves, and the loopback warning
// decided from the addresses the host resolves to (a fake resolver stands in for DNS).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlprobe/monitor/metrics_server.h"
#include "fake_script.h"

namespace dlprobe::monitor {
namespace {

using dlprobe::testing::FakeScript;
using dlprobe::testing::kH200Script;

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto lib = nvml::Library::open(DLPROBE_FAKE_NVML);
    ASSERT_TRUE(lib.has_value()) << lib.status().message();
    nvml_ = *lib;
  }

  // The server on `at`, and what it logged while starting.
  std::unique_ptr<MetricsServer> start(const Endpoint& at, std::string* log = nullptr,
                                       const HostResolver& resolve = resolve_host) {
    ::testing::internal::CaptureStderr();
    auto server = MetricsServer::start(at, *nvml_, {}, resolve);
    const std::string err = ::testing::internal::GetCapturedStderr();
    if (log != nullptr) *log = err;
    EXPECT_TRUE(server.has_value()) << server.status().message();
    return server.has_value() ? std::move(server).value() : nullptr;
  }

  FakeScript script_{kH200Script};
  std::shared_ptr<nvml::Library> nvml_;
};

// A connection to `address` (IPv4 or IPv6 literal) at `port`; -1 when it cannot be made.
int connect_to(const std::string& address, int port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
      ::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof *v4;
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
    if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) != 1) return -1;
    v6->sin6_family = AF_INET6;
    family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof *v6;
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `head` (the request's header lines after the request line) to the server and returns the
// status line of its answer; empty when none comes within 5 s.
std::string status_of(const std::string& address, int port, const std::string& head) {
  const int fd = connect_to(address, port);
  if (fd < 0) return "no connection";
  const std::string request = "GET /metrics HTTP/1.1\r\n" + head + "Connection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "send failed";
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::string seen;
  while (seen.find("\r\n") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buffer[512];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    seen.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return seen.substr(0, seen.find("\r\n"));
}

constexpr const char* kOk = "HTTP/1.1 200 OK";
constexpr const char* kMisdirected = "HTTP/1.1 421 Misdirected Request";

std::string host(const std::string& value) {
  return "Host: " + value + "\r\n";
}

TEST_F(MetricsServerTest, LoopbackServesOnlyHostsNamingIt) {
  auto server = start({"127.0.0.1", 0});
  ASSERT_TRUE(server);
  const int port = server->port();
  const std::string p = std::to_string(port);
  const std::string other = std::to_string(port == 65535 ? 1 : port + 1);

  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1")), kOk);  // the port is optional
  EXPECT_EQ(status_of("127.0.0.1", port, host("localhost:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("LocalHost:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.1.2.3:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("[::1]:" + p)), kOk);

  // A name that is not this server's, as a rebound DNS name would be.
  EXPECT_EQ(status_of("127.0.0.1", port, host("attacker.example:" + p)), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1.nip.io:" + p)), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("10.0.0.1:" + p)), kMisdirected);
  // The right host at another port.
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1:" + other)), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("localhost:" + other)), kMisdirected);
  // No Host, an empty one, two of them, malformed ones.
  EXPECT_EQ(status_of("127.0.0.1", port, ""), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("")), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1:" + p) + host("attacker.example")),
            kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("::1:" + p)), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("[::1:" + p)), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1:9x")), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1:" + p + "0")), kMisdirected);
  // A NUL (or another control character) inside the name: what follows it must not be cut off.
  EXPECT_EQ(status_of("127.0.0.1", port, host(std::string("127.0.0.1\0evil", 14))), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host(std::string("localhost\0:", 11) + p)), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("local\x01host:" + p)), kMisdirected);
}

// Whether ::1 can be bound here (some containers have no IPv6).
bool has_ipv6_loopback() {
  const int probe = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool bound =
      probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (probe >= 0) ::close(probe);
  return bound;
}

TEST_F(MetricsServerTest, Ipv6LiteralHosts) {
  if (!has_ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback here";

  auto server = start({"::1", 0});
  ASSERT_TRUE(server);
  const int port = server->port();
  const std::string p = std::to_string(port);
  EXPECT_EQ(status_of("::1", port, host("[::1]:" + p)), kOk);
  EXPECT_EQ(status_of("::1", port, host("[0:0::1]:" + p)), kOk);
  EXPECT_EQ(status_of("::1", port, host("[::1]")), kOk);
  EXPECT_EQ(status_of("::1", port, host("localhost:" + p)), kOk);
  EXPECT_EQ(status_of("::1", port, host("[::1]:" + std::to_string(port == 1 ? 2 : port - 1))),
            kMisdirected);
  EXPECT_EQ(status_of("::1", port, host("[2001:db8::1]:" + p)), kMisdirected);
  EXPECT_EQ(status_of("::1", port, host("::1")), kMisdirected);
}

TEST_F(MetricsServerTest, GivenPortIsTheOneCompared) {
  // A port of our own choosing: bind to 0 for a free one, release it and ask for it by number.
  const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof addr;
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const int port = ntohs(addr.sin_port);
  ::close(probe);

  auto server = start({"localhost", port});
  ASSERT_TRUE(server);
  ASSERT_EQ(server->port(), port);
  const std::string p = std::to_string(port);
  EXPECT_EQ(status_of("127.0.0.1", port, host("localhost:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("localhost.:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("127.0.0.1:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", port, host("localhost:0")), kMisdirected);
  EXPECT_EQ(status_of("127.0.0.1", port, host("attacker.example:" + p)), kMisdirected);
}

// A resolver with the answers of `table`; names outside it do not resolve.
HostResolver fake_resolver(std::map<std::string, std::vector<std::string>> table) {
  return [table = std::move(table)](const std::string& name) -> Result<std::vector<std::string>> {
    const auto it = table.find(name);
    if (it == table.end()) return invalid_argument("--serve: cannot resolve '" + name + "'");
    return it->second;
  };
}

TEST_F(MetricsServerTest, WarnsWhenAnyResolvedAddressIsNotLoopback) {
  const auto resolve = fake_resolver({
      {"127.0.0.1.example", {"198.51.100.7", "127.0.0.1"}},  // loopback by its text only
      {"loop.example", {"127.0.0.1", "::1"}},
  });
  std::string log;
  auto named = start({"127.0.0.1.example", 0}, &log, resolve);
  ASSERT_TRUE(named);
  EXPECT_NE(log.find("--serve 127.0.0.1.example: not a loopback address"), std::string::npos)
      << log;
  // 198.51.100.7 is not this machine's: the next address is bound. Not loopback-only, so the
  // loopback names are not this server's; the name given and the addresses bound are.
  const std::string p = std::to_string(named->port());
  EXPECT_EQ(status_of("127.0.0.1", named->port(), host("127.0.0.1.example:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", named->port(), host("127.0.0.1:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", named->port(), host("localhost:" + p)), kMisdirected);
  named.reset();

  auto loop = start({"loop.example", 0}, &log, resolve);
  ASSERT_TRUE(loop);
  EXPECT_EQ(log, "");
  const std::string q = std::to_string(loop->port());
  EXPECT_EQ(status_of("127.0.0.1", loop->port(), host("loop.example:" + q)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", loop->port(), host("localhost:" + q)), kOk);
}

TEST_F(MetricsServerTest, UnresolvedHostIsAnError) {
  auto server = MetricsServer::start({"nowhere.example", 0}, *nvml_, {}, fake_resolver({}));
  ASSERT_FALSE(server.has_value());
  EXPECT_EQ(server.status().code(), Errc::invalid_argument);
  EXPECT_EQ(server.status().message(), "--serve: cannot resolve 'nowhere.example'");
}

TEST_F(MetricsServerTest, LoopbackDecidedFromResolvedAddresses) {
  std::string log;
  for (const std::string name : {"localhost", "127.0.0.1", "::1"}) {
    if (name == "::1" && !has_ipv6_loopback()) continue;
    auto server = start({name, 0}, &log);
    ASSERT_TRUE(server) << name;
    EXPECT_EQ(log, "") << name;
  }
  auto any = start({"0.0.0.0", 0}, &log);
  ASSERT_TRUE(any);
  EXPECT_NE(log.find("--serve 0.0.0.0: not a loopback address"), std::string::npos) << log;
  // Every address of the machine is bound: address literals name it (they cannot be rebound),
  // names other than the one given do not.
  const std::string p = std::to_string(any->port());
  EXPECT_EQ(status_of("127.0.0.1", any->port(), host("0.0.0.0:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", any->port(), host("127.0.0.1:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", any->port(), host("192.0.2.1:" + p)), kOk);
  EXPECT_EQ(status_of("127.0.0.1", any->port(), host("attacker.example:" + p)), kMisdirected);
}

// The request handling without a socket, as the metrics_http fuzz target drives it: the same
// parsing, Host check and routes, requests kept alive answered in turn.
TEST(MetricsServerOffline, AnswersAConnectionsBytes) {
  auto server = MetricsServer::offline({"127.0.0.1", 9400}, {},
                                       fake_resolver({{"127.0.0.1", {"127.0.0.1"}}}));
  ASSERT_TRUE(server.has_value()) << server.status().message();
  const std::string answer = (*server)->answer(
      "GET /metrics HTTP/1.1\r\nHost: localhost:9400\r\n\r\n"
      "GET /metrics HTTP/1.1\r\nHost: attacker.example:9400\r\n\r\n"
      "GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  const auto ok = answer.find(std::string(kOk) + "\r\n");
  const auto misdirected = answer.find(std::string(kMisdirected) + "\r\n");
  const auto not_found = answer.find("HTTP/1.1 404 Not Found\r\n");
  EXPECT_EQ(ok, 0U) << answer;
  EXPECT_NE(answer.find("# TYPE dlprobe_"), std::string::npos) << answer;
  EXPECT_NE(misdirected, std::string::npos) << answer;
  EXPECT_GT(misdirected, ok);
  EXPECT_NE(not_found, std::string::npos) << answer;
  EXPECT_GT(not_found, misdirected);
  EXPECT_EQ((*server)->answer(""), "");
}

TEST(ResolveHost, NameThatDoesNotResolveIsOneLine) {
  // .invalid never resolves (RFC 6761); without a network the lookup fails as fast.
  const auto resolved = resolve_host("no-such-host.invalid");
  ASSERT_FALSE(resolved.has_value());
  EXPECT_EQ(resolved.status().code(), Errc::invalid_argument);
  const std::string message = resolved.status().message();
  EXPECT_EQ(message.rfind("--serve: cannot resolve 'no-such-host.invalid': ", 0), 0U) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::monitor
