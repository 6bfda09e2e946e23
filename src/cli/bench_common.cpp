#include "bench_common.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "dlprobe/core/files.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/doctor/doctor.h"
#include "dlprobe/results/table.h"
#include "dlprobe/run/results.h"

namespace dlprobe::cli {

void add_tuning_flags(CLI::App& sub, TuningFlags& flags) {
  sub.add_option("--conv-algo", flags.algo,
                 "cuDNN engine per convolution shape: heuristic (cuDNN's first choice), autotune "
                 "(time the engines cuDNN's heuristics list, keep the fastest, as "
                 "cudnn.benchmark) or exhaustive (also every other engine, within 0.4 s a shape)")
      ->capture_default_str();
  sub.add_option("--tuning-cache", flags.cache,
                 "Keep autotuned choices in this JSON file and start from those it holds for "
                 "this GPU and cuDNN (runs that share it run the same engines)");
}

Result<Tuning> tuning_options(const TuningFlags& flags) {
  Tuning t;
  DLPROBE_ASSIGN_OR_RETURN(t.algo, bench::parse_conv_algo(flags.algo, "--conv-algo"));
  if (flags.cache.empty()) {
    t.cache = std::make_shared<ConvTuningCache>();
  } else {
    auto cache = ConvTuningCache::open(flags.cache);
    if (!cache) return cache.status().with_context("--tuning-cache");
    t.cache = std::move(cache).value();
  }
  return t;
}
namespace {

std::atomic<int> g_interrupts{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the signal handler needs a lock-free counter");

void on_signal(int) {
  g_interrupts.fetch_add(1);
}

struct sigaction g_old_int {};
struct sigaction g_old_term {};

std::string eta_text(const std::optional<double>& s) {
  if (!s) return "ETA ?";
  return "ETA " + format_duration(std::chrono::nanoseconds(static_cast<std::int64_t>(*s * 1e9)));
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupts = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  // SA_RESETHAND: the second signal finds the default action and ends the process.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_old_int);
  sigaction(SIGTERM, &action, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

const std::atomic<int>* InterruptGuard::flag() const {
  return &g_interrupts;
}

bool InterruptGuard::interrupted() const {
  return g_interrupts.load() > 0;
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

results::Context bench_context(const std::vector<std::string>& command_line,
                               const std::shared_ptr<nvml::Library>& nvml,
                               const doctor::StackVersions& versions) {
  results::Context c = run::results_context(command_line, nvml);
  if (versions.cuda_runtime_loaded > 0) {
    c.cuda_runtime_version = doctor::decode_cuda_version(versions.cuda_runtime_loaded).str();
  }
  for (const doctor::LibraryProbe* p : {&versions.cudnn, &versions.cublas, &versions.cublaslt,
                                        &versions.nccl, &versions.cupti, &versions.onednn}) {
    c.libraries.push_back({p->name, p->loaded ? p->version : "", p->loaded ? p->path : ""});
  }
  return c;
}

std::shared_ptr<nvml::Library> open_nvml() {
  auto lib = nvml::Library::open();
  if (!lib) {
    log_warn("no GPU telemetry: {}", lib.status().message());
    return nullptr;
  }
  return *lib;
}

std::optional<bench::TelemetrySource> telemetry_for(const bench::Device& device,
                                                    const std::shared_ptr<nvml::Library>& nvml) {
  if (device.kind != DeviceKind::cuda || !nvml) return std::nullopt;
  const auto bus = bench::cuda_pci_bus_id(device.index);
  if (bus) {
    const std::string want = doctor::normalize_pci_bus_id(*bus);
    const unsigned count = nvml->device_count().value_or(0);
    for (unsigned i = 0; i < count; ++i) {
      auto info = nvml->device_info(i);
      if (info && doctor::normalize_pci_bus_id(info->pci_bus_id) == want) {
        bench::TelemetrySource source;
        source.nvml = nvml;
        source.gpu = i;
        return source;
      }
    }
  }
  log_warn("no GPU telemetry: NVML does not list {}", bench::device_name(device));
  return std::nullopt;
}

std::map<engine::Precision, bench::Ceiling> ceilings_by_precision(const Ceilings& ceilings) {
  std::map<engine::Precision, bench::Ceiling> out;
  for (const engine::Precision p : {engine::Precision::fp32, engine::Precision::tf32,
                                    engine::Precision::fp16, engine::Precision::bf16}) {
    const auto dtype = bench::ceiling_dtype(p);
    for (const GemmCeiling& g : ceilings.gemm) {
      if (dtype && g.measured && gemm_dtype_name(g.dtype) == *dtype) out[p] = {*dtype, g.tflops};
    }
  }
  return out;
}

ProgressLine::ProgressLine(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}

void ProgressLine::clear() {
  if (drawn_) {
    std::fputs("\r\033[K", stderr);
    drawn_ = false;
  }
}

void ProgressLine::update(const bench::SweepProgress& p) {
  if (quiet_ || !tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  std::string what;
  switch (p.step.phase) {
    case bench::Progress::Phase::planning:
      what = "planning";
      break;
    case bench::Progress::Phase::warmup:
      what = fmt::format("warm-up step {}", p.step.steps);
      break;
    case bench::Progress::Phase::timing:
      what = fmt::format("window {} step {}, ~{} img/s", p.step.window + 1, p.step.steps,
                         format_grouped(p.step.images_per_s, 1));
      break;
  }
  std::string line =
      fmt::format("[{}/{}] {}: {}, {}", p.index, p.planned, p.label, what, eta_text(p.eta_s));
  // A line wider than the terminal wraps, and "\r" would then redraw only its last part.
  winsize size{};
  const std::size_t columns =
      ::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1 ? size.ws_col - 1 : 100;
  if (line.size() > columns) line.resize(columns);
  std::fputs("\r\033[K", stderr);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::finished(std::size_t index, std::size_t planned,
                            const results::Configuration& c) {
  if (quiet_) return;
  clear();
  const std::string label = results::describe(c.kind, c.settings);
  std::string result;
  if (c.statistics) {
    const stats::Summary& s = *c.statistics;
    result = fmt::format("{} img/s ({:.0f}% CI {} - {}), {} steps", format_grouped(s.throughput, 1),
                         s.ci_level * 100, format_grouped(s.throughput_ci.low, 1),
                         format_grouped(s.throughput_ci.high, 1), s.steps);
  }
  if (c.status != results::RunStatus::ok) {
    result += fmt::format("{}{}: {}", result.empty() ? "" : "; ",
                          results::run_status_name(c.status), c.error);
  }
  std::fprintf(stderr, "[%zu/%zu] %s: %s\n", index, planned, label.c_str(), result.c_str());
  std::fflush(stderr);
}

void ProgressLine::note(const std::string& text) {
  if (quiet_) return;
  clear();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

Result<Outputs> Outputs::create(std::string json, std::string csv, std::string md,
                                results::Context context) {
  Outputs o;
  o.json_ = std::move(json);
  o.csv_ = std::move(csv);
  o.md_ = std::move(md);
  o.document_.context = std::move(context);
  DLPROBE_RETURN_IF_ERROR(o.flush());
  return o;
}

Status Outputs::write(const std::vector<results::Configuration>& configurations) {
  document_.configurations = configurations;
  return flush();
}

Status Outputs::add_findings(const std::vector<results::Finding>& findings) {
  document_.findings.insert(document_.findings.end(), findings.begin(), findings.end());
  return flush();
}

Status Outputs::flush() const {
  if (!json_.empty()) {
    DLPROBE_RETURN_IF_ERROR(
        write_file_atomic(json_, results::serialize(document_)).with_context("--json"));
  }
  if (csv_.empty() && md_.empty()) return Status::ok();
  const results::NamedDocument named{"results", document_};
  const results::Table table = results::configuration_table(std::span(&named, 1));
  if (!csv_.empty()) {
    DLPROBE_RETURN_IF_ERROR(write_file_atomic(csv_, results::to_csv(table)).with_context("--csv"));
  }
  if (!md_.empty()) {
    DLPROBE_RETURN_IF_ERROR(
        write_file_atomic(md_, results::to_markdown(table)).with_context("--md"));
  }
  return Status::ok();
}

std::string configurations_text(const std::vector<results::Configuration>& configurations) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"configuration", "status", "img/s", "95% CI", "median ms", "p99 ms", "CV %",
                  "peak mem", "TFLOP/s", "% ceil", "J/img", "util %", "W", "SM MHz"});
  const auto fixed = [](const std::optional<double>& v, int decimals) -> std::string {
    return v ? format_grouped(*v, decimals) : "-";
  };
  for (const results::Configuration& c : configurations) {
    std::vector<std::string> r;
    r.push_back(results::describe(c.kind, c.settings));
    r.push_back(std::string(results::run_status_name(c.status)));
    if (c.statistics) {
      const stats::Summary& s = *c.statistics;
      r.push_back(format_grouped(s.throughput, 1));
      r.push_back(fmt::format("{} - {}", format_grouped(s.throughput_ci.low, 1),
                              format_grouped(s.throughput_ci.high, 1)));
      r.push_back(fmt::format("{:.3f}", s.median_s * 1e3));
      r.push_back(fmt::format("{:.3f}", s.p99_s * 1e3));
      r.push_back(fmt::format("{:.2f}", s.cv * 100));
    } else {
      r.insert(r.end(), 5, "-");
    }
    const auto peak = c.memory ? results::peak_memory_bytes(*c.memory) : std::nullopt;
    r.push_back(peak ? format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(*peak, 0)))
                     : "-");
    const results::Compute* k = c.compute ? &*c.compute : nullptr;
    // Three significant digits: a CPU run reaches a few GFLOP/s, a GPU hundreds of TFLOP/s.
    r.push_back(k && k->achieved_tflops ? fmt::format("{:.3g}", *k->achieved_tflops) : "-");
    r.push_back(k && k->fraction_of_ceiling ? fmt::format("{:.1f}", *k->fraction_of_ceiling * 100)
                                            : "-");
    const results::Telemetry* t = c.telemetry.empty() ? nullptr : &c.telemetry.front();
    std::optional<double> joules;
    if (t && t->energy_j && c.statistics) joules = *t->energy_j / c.statistics->total_items;
    r.push_back(joules ? fmt::format("{:.4f}", *joules) : "-");
    const auto median = [](const std::optional<results::Range>& range) -> std::optional<double> {
      if (!range) return std::nullopt;
      return range->median;
    };
    r.push_back(fixed(t ? median(t->gpu_util_pct) : std::nullopt, 0));
    r.push_back(fixed(t ? median(t->power_w) : std::nullopt, 0));
    r.push_back(fixed(t ? median(t->sm_clock_mhz) : std::nullopt, 0));
    rows.push_back(std::move(r));
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      // Text left, numbers right.
      line += i < 2 ? fmt::format("{:<{}}", r[i], width[i]) : fmt::format("{:>{}}", r[i], width[i]);
      if (i + 1 < r.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  std::string errors;
  for (const results::Configuration& c : configurations) {
    if (c.status != results::RunStatus::ok && !c.error.empty()) {
      errors += fmt::format("  {}: {}: {}\n", results::describe(c.kind, c.settings),
                            results::run_status_name(c.status), c.error);
    }
  }
  if (!errors.empty()) out += "did not finish:\n" + errors;
  return out;
}

std::string findings_text(const std::vector<results::Configuration>& configurations,
                          const std::vector<results::Finding>& sweep_findings) {
  // A warning that several configurations share is printed once, with each one's numbers.
  struct Group {
    const results::Finding* first = nullptr;
    std::vector<std::string> lines;
  };
  std::vector<Group> groups;
  const auto add = [&](const std::string& where, const results::Finding& f) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.first->id == f.id && g.first->severity == f.severity &&
             g.first->message == f.message && g.first->fix == f.fix;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{&f, {}});
    it->lines.push_back(where.empty() ? f.evidence : fmt::format("{}: {}", where, f.evidence));
  };
  for (const results::Configuration& c : configurations) {
    for (const results::Finding& f : c.findings) add(results::describe(c.kind, c.settings), f);
  }
  for (const results::Finding& f : sweep_findings) add("", f);
  if (groups.empty()) return "";
  std::string out = "findings:\n";
  for (const Group& g : groups) {
    out += fmt::format("  [{}] {}: {}\n", results::severity_name(g.first->severity), g.first->id,
                       g.first->message);
    for (const std::string& line : g.lines) {
      if (!line.empty()) out += "      " + line + "\n";
    }
    if (!g.first->fix.empty()) out += fmt::format("      fix: {}\n", g.first->fix);
  }
  return out;
}

}  // namespace dlprobe::cli
