// Reading what a workload prints: the dlprobe line protocol (docs/external.md), a user's
// throughput regex, and the out-of-memory and error messages of TensorFlow, PyTorch and JAX.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dlprobe/core/status.h"

namespace re2 {
class RE2;
}

namespace dlprobe::run {

// One `{"dlprobe": {...}}` line. Every field is optional; docs/external.md defines them.
struct ProtocolRecord {
  std::optional<std::int64_t> step;
  std::optional<double> step_time_s;  // seconds the step took
  std::optional<double> data_time_s;  // of which waiting for input
  std::optional<std::int64_t> batch;  // items (images, samples) the step processed
  std::optional<double> items_per_s;  // a rate the workload measured itself
  std::optional<bool> warmup;         // this step is warm-up (overrides --warmup-steps)
  std::optional<std::int64_t> warmup_steps;
  std::optional<std::uint64_t> framework_peak_bytes;
  std::optional<std::uint64_t> framework_reserved_bytes;
  std::optional<std::uint64_t> framework_allocated_bytes;
  std::optional<std::string> framework;  // "pytorch", "tensorflow", "jax", …
  std::optional<std::string> model;
  std::optional<std::string> precision;  // "fp32", "tf32", "fp16", "bf16", "fp8"
  std::optional<bool> channels_last;     // NHWC activations
  std::optional<bool> oom;               // the workload caught an out-of-memory error itself
  std::optional<std::string> message;    // with oom: the framework's text
  bool end = false;                      // the workload finished its measurement
};

// nullopt: not a protocol line (no `{"dlprobe"` in it). An error: it is one but malformed (not
// JSON, `dlprobe` not an object, a field of the wrong type or out of range).
Result<std::optional<ProtocolRecord>> parse_protocol_line(std::string_view line);

// What a --throughput-regex match gave.
struct RegexMatch {
  std::optional<double> items_per_s;
  std::optional<double> step_time_s;
  std::optional<std::int64_t> step;
};

// --throughput-regex: RE2 syntax (no backreferences or lookaround; matched in time linear in the
// line, however long) with named groups `(?<ips>…)` (items per second), `(?<step_s>…)` (seconds
// per step, with --batch for throughput), `(?<step>…)`; `(?P<name>…)` is accepted too. Without a
// named group the first group is items per second.
class ThroughputRegex {
 public:
  static Result<ThroughputRegex> compile(std::string_view pattern);
  std::optional<RegexMatch> match(std::string_view line) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::shared_ptr<const re2::RE2> regex_;  // immutable, so copies of the options share it
  int ips_group_ = 0;                      // 0: absent
  int step_s_group_ = 0;
  int step_group_ = 0;
};

// A throughput (or what gives one) in a form that training scripts and tools print on their own,
// read without a --throughput-regex. docs/external.md lists the forms with examples.
struct PrintedFigure {
  enum class Kind {
    items_per_s,  // samples, images or examples per second
    steps_per_s,  // iterations per second: items with the batch
    step_time_s,  // seconds per step: items with the batch
    batch,        // items per step, as the script says it
  };
  Kind kind = Kind::items_per_s;
  double value = 0;  // as printed: may be NaN or negative, which the caller refuses
  // A closing figure over the script's timed steps ("Throughput: …", tf_cnn_benchmarks' total,
  // the Trainer's summary), rather than one progress update of many.
  bool summary = false;
  std::string_view format;  // which form: "throughput", "average_step_time", "keras", …
};
// The figure the line prints in one of the known forms, or nullopt. Read by hand in one pass over
// the line (no regex): every line of the workload is tried, and lines may be megabytes long.
std::optional<PrintedFigure> match_printed_figure(std::string_view line);

enum class Framework { unknown, tensorflow, pytorch, jax };
std::string_view framework_name(Framework f);

// A line that says the GPU ran out of memory, and whose words said it.
struct OomMatch {
  Framework framework = Framework::unknown;
  std::string line;
};
std::optional<OomMatch> detect_oom(std::string_view line);

// The closing line of a Python traceback or a framework's fatal error ("RuntimeError: …",
// "F0412 … Check failed: …", "terminate called after …"), to say in one line why a run failed.
bool looks_like_error(std::string_view line);

}  // namespace dlprobe::run
