// What `dlprobe bench` and `dlprobe evaluate` share: Ctrl-C handling, the results context, the
// mapping of a CUDA device to NVML, the GEMM ceilings per precision, the live progress line on
// stderr, the results files rewritten after every configuration, and the tables on stdout.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/bench/sweep.h"
#include "dlprobe/doctor/ceilings.h"
#include "dlprobe/doctor/versions.h"
#include "dlprobe/engine/conv_tuning.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/results/results.h"
#include "dlprobe/results/writer.h"

namespace CLI {
class App;
}

namespace dlprobe::cli {

// --conv-algo and --tuning-cache, as bench, evaluate, memory and step take them.
struct TuningFlags {
  std::string algo = "autotune";
  std::string cache;  // a file; empty: choices kept for this process only
};
void add_tuning_flags(CLI::App& sub, TuningFlags& flags);
struct Tuning {
  ConvEngineChoice algo = ConvEngineChoice::autotune;
  std::shared_ptr<ConvTuningCache> cache;  // always set: in memory, or over the file
};
// A bad choice or a file that is not a tuning cache: a one-line error naming the flag.
Result<Tuning> tuning_options(const TuningFlags& flags);

// While alive, the first SIGINT or SIGTERM sets the counter (the sweep ends the step it is on,
// keeps what it measured, and writes it) and the handler resets itself, so a second Ctrl-C stops
// the process at once.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  const std::atomic<int>* flag() const;
  bool interrupted() const;
};

// The command line as typed (main() does not hand argv to subcommands; /proc keeps it).
std::vector<std::string> own_command_line();

// The results context: host, GPUs and their state (as `dlprobe run` records them), the libraries
// doctor probed and the CUDA runtime.
results::Context bench_context(const std::vector<std::string>& command_line,
                               const std::shared_ptr<nvml::Library>& nvml,
                               const doctor::StackVersions& versions);

// NVML, or null with a warning saying why there is no GPU telemetry.
std::shared_ptr<nvml::Library> open_nvml();
// Telemetry for a CUDA device: its NVML index found by PCI bus id (CUDA and NVML can number GPUs
// differently). Nullopt, with a warning, where NVML is missing or does not list the device; always
// on the CPU.
std::optional<bench::TelemetrySource> telemetry_for(const bench::Device& device,
                                                    const std::shared_ptr<nvml::Library>& nvml);

// Measured GEMM ceilings by the precision whose matrix products run on their dtype.
std::map<engine::Precision, bench::Ceiling> ceilings_by_precision(const Ceilings& ceilings);

// The live line: configuration i of n, what it is doing, the running estimate and the ETA, redrawn
// in place on a terminal; one line per finished configuration everywhere.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet);
  void update(const bench::SweepProgress& p);
  void finished(std::size_t index, std::size_t planned, const results::Configuration& c);
  void note(const std::string& text);  // a line of its own ("measuring GEMM ceilings...")

 private:
  void clear();
  bool quiet_ = false;
  bool tty_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// --json, --csv and --md, each rewritten (atomically) after every configuration. Creating it
// writes them once, empty, so a bad path fails before anything is measured.
class Outputs {
 public:
  static Result<Outputs> create(std::string json, std::string csv, std::string md,
                                results::Context context);
  Status write(const std::vector<results::Configuration>& configurations);
  Status add_findings(const std::vector<results::Finding>& findings);
  const results::Document& document() const { return document_; }

 private:
  Status flush() const;
  std::string json_, csv_, md_;
  results::Document document_;
};

// The results as a terminal table (configuration, status, img/s and CI, median and p99 step time,
// CV, peak memory, TFLOP/s and share of the ceiling, J/image, GPU util, power, SM clock), then the
// errors of the configurations that did not finish.
std::string configurations_text(const std::vector<results::Configuration>& configurations);
// Every finding, configuration by configuration, then the sweep's own.
std::string findings_text(const std::vector<results::Configuration>& configurations,
                          const std::vector<results::Finding>& sweep_findings);

}  // namespace dlprobe::cli
