// `dlprobe monitor`: a live per-GPU table like `nvidia-smi dmon`, optionally CSV / JSON lines and a
// Prometheus endpoint, ending (count, duration or Ctrl-C) with min / median / max per column.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/units.h"
#include "dlprobe/monitor/metrics_server.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/monitor/output.h"
#include "dlprobe/monitor/sampler.h"

namespace dlprobe::cli {

namespace {

using namespace std::chrono_literals;

// How often the monitor's loop looks at a deadline or a signal: a signal handler may only count,
// and 20 ms is far below anyone's reaction time.
constexpr auto kDeadlinePoll = 20ms;

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
  bool overwrite = false;
};

struct MonitorPlan {
  monitor::SamplerOptions sampler;
  std::optional<std::chrono::nanoseconds> duration;
  std::optional<monitor::Endpoint> serve;
};

Result<MonitorPlan> plan_from(const MonitorFlags& f) {
  MonitorPlan plan;
  DLPROBE_ASSIGN_OR_RETURN(plan.sampler.interval, parse_sampling_interval(f.interval));
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
    DLPROBE_ASSIGN_OR_RETURN(plan.sampler.gpus, parse_gpu_indices(f.gpus));
  }
  // The rows are a stream (each round appended as it comes, for tail -f), so they are not written
  // through write_file_atomic; the files are checked as every command's outputs are.
  const NamedOutput outputs[] = {{"--csv", f.csv}, {"--jsonl", f.jsonl}};
  DLPROBE_RETURN_IF_ERROR(check_outputs(outputs, f.overwrite));
  if (!f.serve.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(plan.serve, monitor::parse_endpoint(f.serve));
  }
  plan.sampler.processes = f.processes;
  plan.sampler.pcie_throughput = f.pcie;
  // Keep every round of a bounded run for the summary; an open-ended one keeps the most recent.
  constexpr std::uint64_t kMaxRing = 200'000;
  std::uint64_t rounds = plan.sampler.max_ticks;
  if (plan.duration) {
    // The loop in run_monitor notices the deadline within one poll, and the sampler goes on
    // taking rounds in it: room for those too, or the oldest rounds would leave the summary.
    const auto poll_rounds = static_cast<std::uint64_t>(
        (std::chrono::nanoseconds(kDeadlinePoll) + plan.sampler.interval - 1ns) /
        plan.sampler.interval);
    const auto by_time =
        static_cast<std::uint64_t>(*plan.duration / plan.sampler.interval) + 2 + poll_rounds;
    rounds = rounds == 0 ? by_time : std::min(rounds, by_time);
  }
  if (rounds != 0)
    plan.sampler.ring_capacity = static_cast<std::size_t>(std::min(rounds, kMaxRing));
  return plan;
}

int run_monitor(const MonitorFlags& flags) {
  auto plan_or = plan_from(flags);
  if (!plan_or) return report_error(plan_or.status());
  MonitorPlan plan = std::move(plan_or).value();

  auto nvml = nvml::Library::open();
  if (!nvml) return report_error(nvml.status());

  monitor::RowFile csv;
  monitor::RowFile jsonl;
  if (Status s = csv.open(flags.csv, "--csv"); !s) return report_error(s);
  if (Status s = jsonl.open(flags.jsonl, "--jsonl"); !s) return report_error(s);
  // Machine-readable rows on stdout leave no room for the table; the summary goes to stderr then.
  const bool stdout_taken = csv.to_stdout() || jsonl.to_stdout();
  std::FILE* summary_stream = stdout_taken ? stderr : stdout;

  monitor::OutputOptions out_options;
  out_options.processes = plan.sampler.processes;
  out_options.pcie = plan.sampler.pcie_throughput;
  out_options.unix_offset_ns = monitor::unix_offset_ns();
  out_options.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();

  std::unique_ptr<monitor::MetricsServer> server;
  if (plan.serve) {
    auto started = monitor::MetricsServer::start(*plan.serve, **nvml, {}, monitor::resolve_host,
                                                 plan.sampler.gpus);
    if (!started) return report_error(started.status());
    server = std::move(started).value();
    // An IPv6 address goes in brackets in a URL (and in the Host header the server checks).
    const std::string& host = plan.serve->host;
    const std::string shown = host.find(':') == std::string::npos ? host : "[" + host + "]";
    std::fprintf(stderr, "dlprobe monitor: serving metrics on http://%s:%d/metrics\n",
                 shown.c_str(), server->port());
  }

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

  Status status;
  {
    InterruptGuard guard;
    auto sampler_or = monitor::Sampler::start(*nvml, plan.sampler);
    if (sampler_or) {
      monitor::Sampler& sampler = **sampler_or;
      if (server) server->serve(&sampler);
      const auto deadline = plan.duration
                                ? std::optional(std::chrono::steady_clock::now() + *plan.duration)
                                : std::nullopt;
      while (!sampler.wait_for(kDeadlinePoll)) {
        if (guard.interrupted()) break;
        if (deadline && std::chrono::steady_clock::now() >= *deadline) break;
      }
      sampler.stop();
      status = sampler.status();
      std::fputs(
          monitor::summary_text(sampler.summary(), sampler.wrapped(), sampler.overhead()).c_str(),
          summary_stream);
      std::fflush(summary_stream);
      if (server) server->serve(nullptr);
    } else {
      status = sampler_or.status();
      if (status.code() == Errc::invalid_argument) status = status.with_context("--gpu");
    }
    server.reset();
  }

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
  add_text_options<MonitorFlags>(
      *sub, *flags,
      {{"-i,--interval", &MonitorFlags::interval,
        "Time between samples, with a unit, at least 10ms (nvidia-smi dmon's -i picks the GPU; "
        "here --gpu does)"},
       {"-c,--count", &MonitorFlags::count, "Stop after N samples"},
       {"--duration", &MonitorFlags::duration, "Stop after this long (e.g. 20s, 5m)"},
       {"--gpu", &MonitorFlags::gpus, "GPU indices to sample, e.g. 0,1 (default: all)"}});
  sub->add_flag("--processes", flags->processes, "Add a row per process (pid, used MiB, sm%)");
  sub->add_flag("--pcie", flags->pcie,
                "Add PCIe rx/tx throughput (NVML spends 20 ms per direction reading it)");
  add_text_options<MonitorFlags>(
      *sub, *flags,
      {{"--csv", &MonitorFlags::csv, "Write rows as CSV to FILE ('-' = stdout, hides the table)"},
       {"--jsonl", &MonitorFlags::jsonl,
        "Write rows as JSON lines to FILE ('-' = stdout, hides the table)"},
       {"--serve", &MonitorFlags::serve,
        "Serve the latest sample as Prometheus text on http://HOST:PORT/metrics "
        "(e.g. 127.0.0.1:9400; port 0 picks a free one)"}});
  add_overwrite_flag(*sub, flags->overwrite);
  return {sub, [flags] { return run_monitor(*flags); }};
}

}  // namespace dlprobe::cli
