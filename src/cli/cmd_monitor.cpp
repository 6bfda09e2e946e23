// `dlprobe monitor`: a live per-GPU table like `nvidia-smi dmon`, optionally CSV / JSON lines and a
// Prometheus endpoint, ending (count, duration or Ctrl-C) with min / median / max per column.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "commands.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/monitor/output.h"
#include "dlprobe/monitor/sampler.h"

#ifdef DLPROBE_WITH_HTTP
#include <httplib.h>
#endif

namespace dlprobe::cli {

namespace {

using namespace std::chrono_literals;

volatile std::sig_atomic_t g_interrupted = 0;

void on_signal(int) {
  g_interrupted = 1;
}

struct MonitorFlags {
  std::string interval = "100ms";
  std::string count;
  std::string duration;
  std::string gpus;
  bool processes = false;
  bool pcie = false;
  std::string csv;
  std::string jsonl;
  std::string serve;
};

// Where rows go: a file, or stdout for "-".
class Output {
 public:
  Status open(const std::string& path, std::string_view flag) {
    if (path.empty()) return Status::ok();
    if (path == "-") {
      stdout_ = true;
      return Status::ok();
    }
    file_.open(path, std::ios::out | std::ios::trunc);
    if (!file_) return error(Errc::io_error, fmt::format("{}: cannot write '{}'", flag, path));
    path_ = path;
    return Status::ok();
  }
  bool active() const { return stdout_ || file_.is_open(); }
  bool to_stdout() const { return stdout_; }
  void write(const std::string& text) {
    if (stdout_) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    } else if (file_.is_open()) {
      file_ << text;
      file_.flush();
    }
  }
  Status close(std::string_view flag) {
    if (!file_.is_open()) return Status::ok();
    file_.close();
    if (!file_) return error(Errc::io_error, fmt::format("{}: writing '{}' failed", flag, path_));
    return Status::ok();
  }

 private:
  bool stdout_ = false;
  std::ofstream file_;
  std::string path_;
};

struct Endpoint {
  std::string host;
  int port = 0;
};

#ifdef DLPROBE_WITH_HTTP
Result<Endpoint> parse_endpoint(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return invalid_argument(
        fmt::format("--serve: '{}' is not HOST:PORT (e.g. 127.0.0.1:9400)", text));
  }
  Endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') {
    e.host = e.host.substr(1, e.host.size() - 2);
  }
  DLPROBE_ASSIGN_OR_RETURN(auto port, parse_int(text.substr(colon + 1), "--serve port", 0, 65535));
  e.port = static_cast<int>(port);
  return e;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}
#endif

struct Plan {
  monitor::SamplerOptions sampler;
  std::optional<std::chrono::nanoseconds> duration;
  std::optional<Endpoint> serve;
};

Result<Plan> plan_from(const MonitorFlags& f) {
  Plan plan;
  DLPROBE_ASSIGN_OR_RETURN(plan.sampler.interval, parse_duration(f.interval, "--interval"));
  if (plan.sampler.interval < monitor::kMinInterval) {
    return invalid_argument(
        fmt::format("--interval: '{}' is below the minimum of 10ms", f.interval));
  }
  if (!f.count.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto count, parse_int(f.count, "--count", 1, 1'000'000'000));
    plan.sampler.max_ticks = static_cast<std::uint64_t>(count);
  }
  if (!f.duration.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto d, parse_duration(f.duration, "--duration"));
    if (d <= 0ns) return invalid_argument("--duration: must be longer than 0");
    plan.duration = d;
  }
  if (!f.gpus.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto list, parse_list(f.gpus, "--gpu"));
    for (const auto& item : list) {
      DLPROBE_ASSIGN_OR_RETURN(auto gpu, parse_int(item, "--gpu", 0, 1023));
      plan.sampler.gpus.push_back(static_cast<unsigned>(gpu));
    }
  }
  if (f.csv == "-" && f.jsonl == "-") {
    return invalid_argument("--csv and --jsonl cannot both write to stdout ('-')");
  }
  if (!f.serve.empty()) {
#ifdef DLPROBE_WITH_HTTP
    DLPROBE_ASSIGN_OR_RETURN(plan.serve, parse_endpoint(f.serve));
#else
    return error(Errc::unsupported,
                 "--serve: this dlprobe was built without HTTP support (DLPROBE_WITH_HTTP=OFF)");
#endif
  }
  plan.sampler.processes = f.processes;
  plan.sampler.pcie_throughput = f.pcie;
  // Keep every round of a bounded run for the summary; an open-ended one keeps the most recent.
  constexpr std::uint64_t kMaxRing = 200'000;
  std::uint64_t rounds = plan.sampler.max_ticks;
  if (plan.duration) {
    const auto by_time = static_cast<std::uint64_t>(*plan.duration / plan.sampler.interval) + 2;
    rounds = rounds == 0 ? by_time : std::min(rounds, by_time);
  }
  if (rounds != 0)
    plan.sampler.ring_capacity = static_cast<std::size_t>(std::min(rounds, kMaxRing));
  return plan;
}

std::int64_t unix_offset_ns() {
  const auto system = std::chrono::system_clock::now().time_since_epoch();
  const auto steady = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(system - steady).count();
}

int run_monitor(const MonitorFlags& flags) {
  auto plan_or = plan_from(flags);
  if (!plan_or) return report_error(plan_or.status());
  Plan plan = std::move(plan_or).value();

  auto nvml = nvml::Library::open();
  if (!nvml) return report_error(nvml.status());
  // Names and UUIDs label the Prometheus series; nothing else needs them.
  std::vector<nvml::DeviceInfo> devices;
  if (plan.serve) {
    if (auto count = (*nvml)->device_count()) {
      for (unsigned i = 0; i < *count; ++i) {
        if (auto info = (*nvml)->device_info(i)) devices.push_back(std::move(info).value());
      }
    }
  }

  Output csv;
  Output jsonl;
  if (Status s = csv.open(flags.csv, "--csv"); !s) return report_error(s);
  if (Status s = jsonl.open(flags.jsonl, "--jsonl"); !s) return report_error(s);
  // Machine-readable rows on stdout leave no room for the table; the summary goes to stderr then.
  const bool stdout_taken = csv.to_stdout() || jsonl.to_stdout();
  std::FILE* summary_stream = stdout_taken ? stderr : stdout;

  monitor::OutputOptions out_options;
  out_options.processes = plan.sampler.processes;
  out_options.pcie = plan.sampler.pcie_throughput;
  out_options.unix_offset_ns = unix_offset_ns();
  out_options.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();

#ifdef DLPROBE_WITH_HTTP
  httplib::Server server;
  std::thread server_thread;
  monitor::Sampler* serving = nullptr;
  std::mutex serving_mutex;
  if (plan.serve) {
    if (!is_loopback(plan.serve->host)) {
      log_warn("--serve {}: not a loopback address, so other machines can read the metrics",
               plan.serve->host);
    }
    int port = plan.serve->port;
    const bool bound = port == 0 ? (port = server.bind_to_any_port(plan.serve->host)) > 0
                                 : server.bind_to_port(plan.serve->host, port);
    if (!bound) {
      return report_error(error(
          Errc::io_error, fmt::format("--serve: cannot listen on {}:{}", plan.serve->host, port)));
    }
    auto metrics = [&](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lock(serving_mutex);
      std::optional<monitor::Tick> latest;
      monitor::Overhead overhead;
      if (serving != nullptr) {
        latest = serving->latest();
        overhead = serving->overhead();
      }
      res.set_content(monitor::prometheus_text(latest, devices, overhead),
                      "text/plain; version=0.0.4; charset=utf-8");
    };
    server.Get("/metrics", metrics);
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("dlprobe monitor: metrics at /metrics\n", "text/plain");
    });
    std::fprintf(stderr, "dlprobe monitor: serving metrics on http://%s:%d/metrics\n",
                 plan.serve->host.c_str(), port);
    server_thread = std::thread([&] { server.listen_after_bind(); });
  }
#endif

  // Headers come with the first round, so a run that fails to start prints none.
  plan.sampler.sink = [&](const monitor::Tick& tick) {
    if (tick.index == 0) {
      if (!stdout_taken) std::fputs(monitor::table_header(out_options).c_str(), stdout);
      if (csv.active()) csv.write(monitor::csv_header(out_options));
    }
    if (!stdout_taken) {
      std::fputs(monitor::table_rows(tick, out_options).c_str(), stdout);
      std::fflush(stdout);
    }
    if (csv.active()) csv.write(monitor::csv_rows(tick, out_options));
    if (jsonl.active()) jsonl.write(monitor::jsonl_rows(tick, out_options));
  };

  g_interrupted = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  // Restart interrupted writes: the sampler thread may be printing a row when Ctrl-C arrives.
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {};
  struct sigaction old_term {};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);

  auto sampler_or = monitor::Sampler::start(*nvml, plan.sampler);
  Status status;
  if (sampler_or) {
    monitor::Sampler& sampler = **sampler_or;
#ifdef DLPROBE_WITH_HTTP
    {
      std::lock_guard lock(serving_mutex);
      serving = &sampler;
    }
#endif
    const auto deadline = plan.duration
                              ? std::optional(std::chrono::steady_clock::now() + *plan.duration)
                              : std::nullopt;
    // Polls: a signal handler may only set a flag, and 20 ms is far below anyone's reaction time.
    while (!sampler.wait_for(20ms)) {
      if (g_interrupted != 0) break;
      if (deadline && std::chrono::steady_clock::now() >= *deadline) break;
    }
    sampler.stop();
    status = sampler.status();
    std::fputs(
        monitor::summary_text(sampler.summary(), sampler.wrapped(), sampler.overhead()).c_str(),
        summary_stream);
    std::fflush(summary_stream);
#ifdef DLPROBE_WITH_HTTP
    std::lock_guard lock(serving_mutex);
    serving = nullptr;
#endif
  } else {
    status = sampler_or.status();
    if (status.code() == Errc::invalid_argument) status = status.with_context("--gpu");
  }

#ifdef DLPROBE_WITH_HTTP
  if (server_thread.joinable()) {
    server.stop();
    server_thread.join();
  }
#endif
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);

  if (Status s = csv.close("--csv"); !s && status.is_ok()) status = s;
  if (Status s = jsonl.close("--jsonl"); !s && status.is_ok()) status = s;
  if (!status) return report_error(status);
  return kExitOk;
}

}  // namespace

Command add_monitor_command(CLI::App& app) {
  auto flags = std::make_shared<MonitorFlags>();
  CLI::App* sub = app.add_subcommand(
      "monitor", "Sample GPU utilisation, memory, power, energy, temperature and clocks (NVML)");
  sub->add_option("-i,--interval", flags->interval,
                  "Time between samples, with a unit (default 100ms, minimum 10ms)");
  sub->add_option("-c,--count", flags->count, "Stop after N samples");
  sub->add_option("--duration", flags->duration, "Stop after this long (e.g. 20s, 5m)");
  sub->add_option("--gpu", flags->gpus, "GPU indices to sample, e.g. 0,1 (default: all)");
  sub->add_flag("--processes", flags->processes, "Add a row per process (pid, used MiB, sm%)");
  sub->add_flag("--pcie", flags->pcie,
                "Add PCIe rx/tx throughput (NVML spends 20 ms per direction reading it)");
  sub->add_option("--csv", flags->csv, "Write rows as CSV to FILE ('-' = stdout, hides the table)");
  sub->add_option("--jsonl", flags->jsonl,
                  "Write rows as JSON lines to FILE ('-' = stdout, hides the table)");
  sub->add_option("--serve", flags->serve,
                  "Serve the latest sample as Prometheus text on http://HOST:PORT/metrics "
                  "(e.g. 127.0.0.1:9400; port 0 picks a free one)");
  return {sub, [flags] { return run_monitor(*flags); }};
}

}  // namespace dlprobe::cli
