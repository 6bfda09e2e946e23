#include "dlprobe/run/workload_output.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
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
