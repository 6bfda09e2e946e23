#include "dlprobe/run/workload_output.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "re2/re2.h"

namespace dlprobe::run {

namespace {

using json = nlohmann::json;

Status bad_field(std::string_view key, std::string_view wanted) {
  return invalid_argument(fmt::format("dlprobe line: \"{}\" must be {}", key, wanted));
}

Result<double> non_negative(const json& v, std::string_view key) {
  if (!v.is_number()) return bad_field(key, "a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) return bad_field(key, "a finite number >= 0");
  return d;
}

Result<std::int64_t> integer(const json& v, std::string_view key, std::int64_t min) {
  if (!v.is_number_integer()) return bad_field(key, "an integer");
  const auto i = v.get<std::int64_t>();
  if (i < min) return bad_field(key, fmt::format("an integer >= {}", min));
  return i;
}

Result<std::uint64_t> bytes(const json& v, std::string_view key) {
  // Python prints large byte counts as integers, but some tools divide and print floats.
  DLPROBE_ASSIGN_OR_RETURN(double d, non_negative(v, key));
  if (d >= static_cast<double>(std::numeric_limits<std::uint64_t>::max())) {
    return bad_field(key, "a byte count");
  }
  return static_cast<std::uint64_t>(std::llround(d));
}

Result<bool> boolean(const json& v, std::string_view key) {
  if (!v.is_boolean()) return bad_field(key, "true or false");
  return v.get<bool>();
}

Result<std::string> text(const json& v, std::string_view key) {
  if (!v.is_string()) return bad_field(key, "a string");
  return v.get<std::string>();
}

bool contains(std::string_view line, std::string_view needle) {
  return line.find(needle) != std::string_view::npos;
}

}  // namespace

Result<std::optional<ProtocolRecord>> parse_protocol_line(std::string_view line) {
  // The object may follow a logger's prefix ("INFO:root: {...}"), so it is looked for, not
  // required at the start of the line.
  const auto start = line.find("{\"dlprobe\"");
  if (start == std::string_view::npos) return std::optional<ProtocolRecord>();
  json doc = json::parse(line.substr(start), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return invalid_argument("dlprobe line: not one JSON object");
  }
  const json& body = doc["dlprobe"];
  if (!body.is_object()) return invalid_argument("dlprobe line: \"dlprobe\" must be an object");

  ProtocolRecord r;
  for (const auto& [key, v] : body.items()) {
    if (key == "step") {
      DLPROBE_ASSIGN_OR_RETURN(r.step, integer(v, key, 0));
    } else if (key == "step_time_s") {
      DLPROBE_ASSIGN_OR_RETURN(r.step_time_s, non_negative(v, key));
    } else if (key == "data_time_s") {
      DLPROBE_ASSIGN_OR_RETURN(r.data_time_s, non_negative(v, key));
    } else if (key == "batch") {
      DLPROBE_ASSIGN_OR_RETURN(r.batch, integer(v, key, 1));
    } else if (key == "items_per_s" || key == "images_per_s" || key == "samples_per_s") {
      DLPROBE_ASSIGN_OR_RETURN(r.items_per_s, non_negative(v, key));
    } else if (key == "warmup") {
      DLPROBE_ASSIGN_OR_RETURN(r.warmup, boolean(v, key));
    } else if (key == "warmup_steps") {
      DLPROBE_ASSIGN_OR_RETURN(r.warmup_steps, integer(v, key, 0));
    } else if (key == "framework_peak_bytes") {
      DLPROBE_ASSIGN_OR_RETURN(r.framework_peak_bytes, bytes(v, key));
    } else if (key == "framework_reserved_bytes") {
      DLPROBE_ASSIGN_OR_RETURN(r.framework_reserved_bytes, bytes(v, key));
    } else if (key == "framework_allocated_bytes") {
      DLPROBE_ASSIGN_OR_RETURN(r.framework_allocated_bytes, bytes(v, key));
    } else if (key == "framework") {
      DLPROBE_ASSIGN_OR_RETURN(r.framework, text(v, key));
    } else if (key == "model") {
      DLPROBE_ASSIGN_OR_RETURN(r.model, text(v, key));
    } else if (key == "precision") {
      DLPROBE_ASSIGN_OR_RETURN(r.precision, text(v, key));
    } else if (key == "channels_last") {
      DLPROBE_ASSIGN_OR_RETURN(r.channels_last, boolean(v, key));
    } else if (key == "oom") {
      DLPROBE_ASSIGN_OR_RETURN(r.oom, boolean(v, key));
    } else if (key == "message") {
      DLPROBE_ASSIGN_OR_RETURN(r.message, text(v, key));
    } else if (key == "end") {
      DLPROBE_ASSIGN_OR_RETURN(r.end, boolean(v, key));
    }
    // Other keys are ignored, so a workload written for a newer dlprobe still runs.
  }
  return std::optional(std::move(r));
}

Result<ThroughputRegex> ThroughputRegex::compile(std::string_view pattern) {
  // RE2, not std::regex: every output line of the workload (which may be megabytes long and is not
  // ours to trust) is searched, and libstdc++'s std::regex is a recursive backtracker that
  // recurses once per character (a 40,000-digit line overflowed the stack) and can take
  // exponential time. RE2 matches in time linear in the line, in bounded memory, without
  // recursion. RE2 before 2023 knows only the `(?P<name>…)` spelling of a named group, so
  // `(?<name>…)` is rewritten to it; `(?<=` and `(?<!` are left for RE2 to reject (it has no
  // lookaround).
  ThroughputRegex out;
  out.pattern_ = std::string(pattern);
  std::string spelled;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      spelled += pattern.substr(i, 2);
      ++i;
      continue;
    }
    spelled += c;
    if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(' && pattern.substr(i + 1, 2) == "?<" && i + 3 < pattern.size() &&
               pattern[i + 3] != '=' && pattern[i + 3] != '!') {
      spelled += "?P<";
      i += 2;
    }
  }
  RE2::Options options;
  options.set_log_errors(false);
  auto re = std::make_shared<const RE2>(spelled, options);
  if (!re->ok()) {
    return invalid_argument(fmt::format("--throughput-regex: '{}': {}", pattern, re->error()));
  }
  for (const auto& [name, group] : re->NamedCapturingGroups()) {
    if (name == "ips") {
      out.ips_group_ = group;
    } else if (name == "step_s") {
      out.step_s_group_ = group;
    } else if (name == "step") {
      out.step_group_ = group;
    } else {
      return invalid_argument(fmt::format(
          "--throughput-regex: unknown group name '{}' (use ips, step_s or step)", name));
    }
  }
  if (out.ips_group_ == 0 && out.step_s_group_ == 0) {
    if (re->NumberOfCapturingGroups() == 0) {
      return invalid_argument(
          "--throughput-regex: needs a group for the number, e.g. '(?<ips>[0-9.]+) img/s'");
    }
    out.ips_group_ = 1;
  }
  out.regex_ = std::move(re);
  return out;
}

std::optional<RegexMatch> ThroughputRegex::match(std::string_view line) const {
  std::vector<re2::StringPiece> groups(static_cast<std::size_t>(regex_->NumberOfCapturingGroups()) +
                                       1);
  if (!regex_->Match(re2::StringPiece(line.data(), line.size()), 0, line.size(), RE2::UNANCHORED,
                     groups.data(), static_cast<int>(groups.size()))) {
    return std::nullopt;
  }
  auto number = [&](int group) -> std::optional<double> {
    if (group == 0 || groups[static_cast<std::size_t>(group)].data() == nullptr) {
      return std::nullopt;
    }
    const std::string s(groups[static_cast<std::size_t>(group)].as_string());
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v < 0) return std::nullopt;
    return v;
  };
  RegexMatch r;
  r.items_per_s = number(ips_group_);
  r.step_time_s = number(step_s_group_);
  if (auto s = number(step_group_)) r.step = static_cast<std::int64_t>(*s);
  if (!r.items_per_s && !r.step_time_s) return std::nullopt;
  return r;
}

namespace {

// A number that starts at `pos` after blanks, as strtod reads it ("nan", "-3", "1e3" included);
// the index after it. Bounded: a number is never longer than 64 characters.
std::optional<std::pair<double, std::size_t>> number_after(std::string_view line, std::size_t pos) {
  while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
  std::size_t end = pos;
  const auto numeric = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
           c == '-' || c == '+';
  };
  while (end < line.size() && end - pos < 64 && numeric(line[end])) ++end;
  const std::string text(line.substr(pos, end - pos));
  char* stop = nullptr;
  const double v = std::strtod(text.c_str(), &stop);
  if (stop == text.c_str()) return std::nullopt;
  return std::pair(v, pos + static_cast<std::size_t>(stop - text.c_str()));
}

// The unsigned decimal that ends just before `end` ("9.87" in "9.87it/s").
std::optional<double> number_before(std::string_view line, std::size_t end) {
  std::size_t start = end;
  while (start > 0 && end - start < 64 &&
         ((line[start - 1] >= '0' && line[start - 1] <= '9') || line[start - 1] == '.')) {
    --start;
  }
  if (start == end) return std::nullopt;
  const std::string text(line.substr(start, end - start));
  char* stop = nullptr;
  const double v = std::strtod(text.c_str(), &stop);
  if (stop != text.c_str() + text.size()) return std::nullopt;
  return v;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

// `needle` (lower case) anywhere in the line, ignoring case.
std::size_t find_ci(std::string_view line, std::string_view needle) {
  for (std::size_t i = 0; i + needle.size() <= line.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) == needle[0] &&
        starts_with_ci(line.substr(i), needle)) {
      return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace

std::optional<PrintedFigure> match_printed_figure(std::string_view line) {
  using Kind = PrintedFigure::Kind;
  // Each form is a fixed word looked for once, so the whole match is a few passes over the line.
  // "Throughput: 812.3 samples/sec" (any unit per second).
  if (auto at = line.find("Throughput:"); at != std::string_view::npos) {
    if (auto n = number_after(line, at + 11)) {
      std::size_t u = n->second;
      while (u < line.size() && line[u] == ' ') ++u;
      std::size_t slash = u;
      while (slash < line.size() && std::isalpha(static_cast<unsigned char>(line[slash])) != 0) {
        ++slash;
      }
      if (slash > u && line.substr(slash, 2) == "/s") {
        return PrintedFigure{Kind::items_per_s, n->first, true, "throughput"};
      }
    }
  }
  // "Average Step Time: 0.1523s" (or ms, with a space before the unit or none).
  if (auto at = line.find("Average Step Time:"); at != std::string_view::npos) {
    if (auto n = number_after(line, at + 18)) {
      std::string_view unit = line.substr(n->second);
      while (unit.starts_with(' ')) unit.remove_prefix(1);
      const double scale = unit.starts_with("ms") ? 1e-3 : 1.0;
      return PrintedFigure{Kind::step_time_s, n->first * scale, true, "average_step_time"};
    }
  }
  // tf_cnn_benchmarks: "total images/sec: 2420.35" at the end, "10\timages/sec: 2417.6 +/- 0.0
  // (jitter = 0.0)\t7.390" every --display_every steps.
  if (auto at = line.find("images/sec:"); at != std::string_view::npos) {
    if (auto n = number_after(line, at + 11)) {
      const bool total = at >= 6 && line.substr(at - 6, 6) == "total ";
      return PrintedFigure{Kind::items_per_s, n->first, total, "tf_cnn_benchmarks"};
    }
  }
  // Hugging Face Trainer: "{'train_runtime': 61.2, 'train_samples_per_second': 104.5, …}" and
  // its metrics table "  train_samples_per_second =    104.5".
  if (auto at = line.find("train_samples_per_second"); at != std::string_view::npos) {
    std::size_t pos = at + 24;
    while (pos < line.size() && (line[pos] == '\'' || line[pos] == '"' || line[pos] == ' ')) ++pos;
    if (pos < line.size() && (line[pos] == ':' || line[pos] == '=')) {
      if (auto n = number_after(line, pos + 1)) {
        return PrintedFigure{Kind::items_per_s, n->first, true, "hf_trainer"};
      }
    }
  }
  // "Batch Size: 64" (tf_cnn_benchmarks: "Batch size:  64 global").
  if (auto at = find_ci(line, "batch size:"); at != std::string_view::npos) {
    if (auto n = number_after(line, at + 11)) {
      return PrintedFigure{Kind::batch, n->first, false, "batch_size"};
    }
  }
  // Keras fit: "50/50 [======] - 12s 240ms/step - loss: 6.91"; "50/50 - 12s - 240ms/step" with
  // verbose=2. The last figure of the line is the epoch's.
  if (auto at = line.rfind("s/step"); at != std::string_view::npos) {
    double scale = 1.0;
    std::size_t end = at;
    if (at >= 1 && line[at - 1] == 'm') {
      scale = 1e-3;
      end = at - 1;
    } else if (at >= 1 && line[at - 1] == 'u') {
      scale = 1e-6;
      end = at - 1;
    } else if (at >= 2 && line.substr(at - 2, 2) == "\xc2\xb5") {  // µs
      scale = 1e-6;
      end = at - 2;
    }
    if (auto v = number_before(line, end)) {
      return PrintedFigure{Kind::step_time_s, *v * scale, false, "keras"};
    }
  }
  // tqdm and PyTorch Lightning: "100%|██████████| 50/50 [00:21<00:00,  2.35it/s, loss=6.9]", or
  // "1.52s/it" when a step takes over a second.
  if (auto at = line.rfind("it/s"); at != std::string_view::npos) {
    if (auto v = number_before(line, at)) {
      return PrintedFigure{Kind::steps_per_s, *v, false, "tqdm"};
    }
  }
  if (auto at = line.rfind("s/it"); at != std::string_view::npos) {
    if (auto v = number_before(line, at)) {
      return PrintedFigure{Kind::step_time_s, *v, false, "tqdm"};
    }
  }
  return std::nullopt;
}

std::string_view framework_name(Framework f) {
  switch (f) {
    case Framework::tensorflow:
      return "tensorflow";
    case Framework::pytorch:
      return "pytorch";
    case Framework::jax:
      return "jax";
    case Framework::unknown:
      break;
  }
  return "unknown";
}

std::optional<OomMatch> detect_oom(std::string_view line) {
  struct Pattern {
    std::string_view text;
    Framework framework;
  };
  // Most specific first: XLA's "RESOURCE_EXHAUSTED: Out of memory" is JAX's, TensorFlow says
  // "OOM when allocating tensor"; a bare RESOURCE_EXHAUSTED can come from either (TF's C++ core
  // logs it too), so it is matched last and only together with memory words.
  static constexpr std::array<Pattern, 12> kPatterns{{
      {"CUDA out of memory", Framework::pytorch},
      {"torch.OutOfMemoryError", Framework::pytorch},
      {"torch.cuda.OutOfMemoryError", Framework::pytorch},
      {"OOM when allocating tensor", Framework::tensorflow},
      {"ResourceExhaustedError", Framework::tensorflow},
      {"RESOURCE_EXHAUSTED: Out of memory", Framework::jax},
      {"Out of memory while trying to allocate", Framework::jax},
      {"XlaRuntimeError: RESOURCE_EXHAUSTED", Framework::jax},
      {"CUDA error: out of memory", Framework::unknown},
      {"cudaErrorMemoryAllocation", Framework::unknown},
      {"CUBLAS_STATUS_ALLOC_FAILED", Framework::unknown},
      {"CUDNN_STATUS_ALLOC_FAILED", Framework::unknown},
  }};
  // PyTorch 2.x raises torch.OutOfMemoryError; a traceback's last line may name it bare.
  if (line.rfind("OutOfMemoryError", 0) == 0 || contains(line, ".OutOfMemoryError:")) {
    return OomMatch{Framework::pytorch, std::string(line)};
  }
  for (const auto& p : kPatterns) {
    if (contains(line, p.text)) return OomMatch{p.framework, std::string(line)};
  }
  if (contains(line, "RESOURCE_EXHAUSTED") &&
      (contains(line, "memory") || contains(line, "OOM") || contains(line, "allocat"))) {
    return OomMatch{Framework::unknown, std::string(line)};
  }
  return std::nullopt;
}

bool looks_like_error(std::string_view line) {
  // Read by hand rather than with std::regex, which recurses once per character and overflows the
  // stack on a long line. The Python form, `^([A-Za-z_][A-Za-z0-9_.]*)?(Error|Exception)(: |$)`:
  // the line opens with a dotted name that ends in Error or Exception, followed by ": " or
  // nothing. The name is the longest run of name characters, since neither ':' nor the end can
  // be one.
  if (line.starts_with("terminate called") || line.starts_with("Segmentation fault")) return true;
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  const auto is_letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  // glog's fatal lines: `F` and the date as four digits ("F0412 12:00:00.000 …").
  if (line.size() >= 6 && line[0] == 'F' && is_digit(line[1]) && is_digit(line[2]) &&
      is_digit(line[3]) && is_digit(line[4]) && line[5] == ' ') {
    return true;
  }
  if (line.empty() || !(is_letter(line[0]) || line[0] == '_')) return false;
  std::size_t end = 1;
  while (end < line.size() &&
         (is_letter(line[end]) || is_digit(line[end]) || line[end] == '_' || line[end] == '.')) {
    ++end;
  }
  const std::string_view name = line.substr(0, end);
  const std::string_view rest = line.substr(end);
  return (name.ends_with("Error") || name.ends_with("Exception")) &&
         (rest.empty() || rest.starts_with(": "));
}

}  // namespace dlprobe::run
