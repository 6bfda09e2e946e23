// How `dlprobe monitor` writes rounds of samples: a live table like `nvidia-smi dmon`, CSV, JSON
// lines, the end-of-run summary and Prometheus text. A value NVML cannot give is "-" in the table,
// an empty CSV field, JSON null, and an absent Prometheus series: never a 0.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/monitor/nvml.h"
#include "dlprobe/monitor/sampler.h"

namespace dlprobe::monitor {

struct OutputOptions {
  bool processes = false;  // rows per process
  bool pcie = false;       // PCIe throughput columns
  // Rounds are stamped relative to this steady-clock time, and in Unix time through the offset
  // (system clock minus steady clock, taken once at start).
  std::int64_t start_ns = 0;
  std::int64_t unix_offset_ns = 0;
};

std::string table_header(const OutputOptions& options);
std::string table_rows(const Tick& tick, const OutputOptions& options);

std::string csv_header(const OutputOptions& options);
std::string csv_rows(const Tick& tick, const OutputOptions& options);

// One JSON object per GPU per round.
std::string jsonl_rows(const Tick& tick, const OutputOptions& options);

// min / median / max per column for each GPU, energy over the run and the sampler's own cost.
// `wrapped`: the ring dropped early rounds, so the statistics cover only the last ones.
std::string summary_text(const Summary& summary, bool wrapped, const Overhead& overhead);

// System clock minus steady clock now: OutputOptions::unix_offset_ns.
std::int64_t unix_offset_ns();

// Where rows go: a file, or stdout for "-"; nowhere for an empty path. Every write is flushed, so
// that a reader (tail -f, a pipe) sees each round as it comes.
class RowFile {
 public:
  // Errc::io_error naming `flag` when the file cannot be written.
  Status open(const std::string& path, std::string_view flag);
  bool active() const { return stdout_ || file_.is_open(); }
  bool to_stdout() const { return stdout_; }
  void write(const std::string& text);
  // Errc::io_error naming `flag` when a write to the file failed.
  Status close(std::string_view flag);

 private:
  bool stdout_ = false;
  std::ofstream file_;
  std::string path_;
};

// The latest round in Prometheus text exposition format 0.0.4.
std::string prometheus_text(const std::optional<Tick>& latest,
                            const std::vector<nvml::DeviceInfo>& devices, const Overhead& overhead);

}  // namespace dlprobe::monitor
