#include "dlprobe/results/results.h"

#include "dlprobe/core/clock.h"
#include "dlprobe/core/files.h"
#include "dlprobe/core/json_text.h"
#include "dlprobe/core/named.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <concepts>
#include <limits>
#include <numeric>
#include <span>
#include <tuple>
#include <type_traits>

namespace dlprobe::results {

using nlohmann::json;

std::string iso8601_utc_now() {
  return utc_now("%Y-%m-%dT%H:%M:%SZ");
}

namespace {

constexpr Named<Kind> kKinds[] = {{Kind::native, "native"}, {Kind::external, "external"}};
constexpr Named<RunStatus> kRunStatuses[] = {{RunStatus::ok, "ok"},
                                             {RunStatus::oom, "oom"},
                                             {RunStatus::failed, "failed"},
                                             {RunStatus::interrupted, "interrupted"},
                                             {RunStatus::timeout, "timeout"}};
constexpr Named<RunsIn> kRunsIn[] = {{RunsIn::engines, "engines"},
                                     {RunsIn::processes, "processes"}};

}  // namespace

std::string_view kind_name(Kind kind) {
  return name_of(kKinds, kind, "native");
}

std::string_view run_status_name(RunStatus status) {
  return name_of(kRunStatuses, status, "failed");
}

std::string_view runs_in_name(RunsIn runs_in) {
  return name_of(kRunsIn, runs_in, "engines");
}

std::optional<std::int64_t> batch_of(Kind kind, const Settings& settings) {
  if (kind == Kind::native) return settings.batch;
  const auto it = settings.sweep.find("batch");
  if (it == settings.sweep.end()) return std::nullopt;
  std::int64_t value = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, ec] = std::from_chars(it->second.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::string precision_of(Kind kind, const Settings& settings) {
  if (kind == Kind::native) return settings.precision;
  const auto it = settings.sweep.find("precision");
  return it == settings.sweep.end() ? std::string() : it->second;
}

namespace {

// What each key a native run's file may lack means; a label names only what differs from it.
const Settings& native_defaults() {
  static const Settings d = [] {
    Settings out;
    out.width = 64;
    out.image_size = 224;
    out.classes = 1000;
    out.gpu_memory = "grow";
    out.input = "synthetic";
    out.streams = 1;
    return out;
  }();
  return d;
}

}  // namespace

Settings with_defaults(Kind kind, const Settings& s) {
  if (kind != Kind::native) return s;
  const Settings& d = native_defaults();
  Settings out = s;
  const auto fill = [](auto& value, const auto& meant) {
    if (value == std::remove_cvref_t<decltype(value)>{}) value = meant;
  };
  fill(out.width, d.width);
  fill(out.image_size, d.image_size);
  fill(out.classes, d.classes);
  fill(out.gpu_memory, d.gpu_memory);
  fill(out.input, d.input);
  fill(out.streams, d.streams);
  // memory's results once wrote the layout as its display name ("NHWC").
  std::transform(out.layout.begin(), out.layout.end(), out.layout.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool same_settings(Kind kind, const Settings& a, const Settings& b) {
  return with_defaults(kind, a) == with_defaults(kind, b);
}

std::string describe(Kind kind, const Settings& given) {
  if (kind == Kind::native) {
    const Settings s = with_defaults(kind, given);
    const Settings& d = native_defaults();
    std::string out = s.model;
    if (s.width != d.width) out += fmt::format("-w{}", s.width);
    if (s.image_size != d.image_size) out += fmt::format("@{}", s.image_size);
    out += fmt::format(" bs={}", s.batch);
    const bool own_backend = s.backend.empty() || (s.backend == "cuda" && s.device != "cpu") ||
                             (s.backend == "onednn" && s.device == "cpu");
    const std::string device = s.device + (own_backend ? "" : "/" + s.backend);
    for (const std::string* part : {&s.precision, &s.mode, &s.layout, &device, &s.optimizer}) {
      // "none" is the optimizer outside train mode: the mode already says so.
      if (!part->empty() && *part != "none") out += " " + *part;
    }
    if (s.gpu_memory != d.gpu_memory) out += " " + s.gpu_memory;
    if (s.input != d.input) out += " input=" + s.input;
    if (s.streams != d.streams) out += fmt::format(" streams={}", s.streams);
    if (s.stream_lag > 0) out += fmt::format(" stream-lag={}", s.stream_lag);
    if (!s.recompute.empty()) out += " recompute=" + s.recompute;
    // The classes shape the last layer and the loss, so two class counts are two workloads.
    if (s.classes != d.classes) out += fmt::format(" classes={}", s.classes);
    return out;
  }
  const Settings& s = given;
  if (s.sweep.empty()) return s.command;
  std::string sweep;
  for (const auto& [key, value] : s.sweep) {
    if (!sweep.empty()) sweep += ", ";
    sweep += fmt::format("{}={}", key, value);
  }
  return fmt::format("{} ({})", s.command, sweep);
}

std::string series_label(Kind kind, const Settings& s) {
  if (kind == Kind::native) {
    std::string d = describe(kind, s);
    const std::string batch = fmt::format(" bs={}", s.batch);
    if (const auto at = d.find(batch); at != std::string::npos) d.erase(at, batch.size());
    return d;
  }
  std::string name = s.command;
  for (const auto& [key, value] : s.sweep) {
    if (key != "batch") name += fmt::format(" {}={}", key, value);
  }
  return name;
}

namespace {

// Items per second of consecutive groups of steps; empty when the groups do not add up to the
// samples or one has no time.
std::vector<double> group_throughputs(const Samples& samples,
                                      const std::vector<std::int64_t>& groups) {
  std::vector<double> out;
  const std::size_t n = samples.step_seconds.size();
  if (n == 0 || samples.step_items.size() != n) return out;
  std::vector<std::int64_t> each = groups;
  if (each.empty()) each.push_back(static_cast<std::int64_t>(n));
  std::size_t at = 0;
  for (const std::int64_t steps : each) {
    if (steps < 0 || at + static_cast<std::size_t>(steps) > n) return {};
    double items = 0;
    double seconds = 0;
    for (std::size_t i = at; i < at + static_cast<std::size_t>(steps); ++i) {
      items += samples.step_items[i];
      seconds += samples.step_seconds[i];
    }
    if (!(seconds > 0)) return {};
    out.push_back(items / seconds);
    at += static_cast<std::size_t>(steps);
  }
  if (at != n) return {};
  return out;
}

}  // namespace

std::vector<double> window_throughputs(const Samples& samples) {
  return group_throughputs(samples, samples.window_steps);
}

std::vector<double> run_throughputs(const Samples& samples) {
  return group_throughputs(samples, samples.run_steps);
}

std::optional<double> other_cpu_share(const Samples& samples) {
  if (samples.window_other_cpu_seconds.empty() || samples.host_cpus < 1) return std::nullopt;
  double other = 0;
  for (const double s : samples.window_other_cpu_seconds) other += s;
  double wall = 0;
  for (const double s : samples.step_seconds) wall += s;
  if (!(wall > 0)) return std::nullopt;
  return std::min(1.0, other / (wall * samples.host_cpus));
}

std::vector<KindTime> time_by_kind(const std::vector<CallTime>& profile) {
  std::vector<KindTime> out;
  for (const CallTime& c : profile) {
    auto it =
        std::find_if(out.begin(), out.end(), [&](const KindTime& k) { return k.kind == c.kind; });
    if (it == out.end()) it = out.insert(out.end(), KindTime{c.kind, 0, 0});
    it->ms += c.ms;
    ++it->calls;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KindTime& a, const KindTime& b) { return a.ms > b.ms; });
  return out;
}

std::vector<const CallTime*> slowest_calls(const std::vector<CallTime>& profile,
                                           std::size_t count) {
  std::vector<const CallTime*> out;
  for (const CallTime& c : profile) out.push_back(&c);
  std::stable_sort(out.begin(), out.end(),
                   [](const CallTime* a, const CallTime* b) { return a->ms > b->ms; });
  out.resize(std::min(out.size(), count));
  return out;
}

// ---- the schema ----
//
// Each struct's keys are listed once, in its Schema: writing and reading both walk that list, so a
// key cannot be written without being read. Reading is hand-written rather than nlohmann's adl
// from_json: that throws on the first wrong type with a message that does not say where in the
// document it was, and the rule here is one line that names the JSON path.

namespace {

std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

Status type_error(const std::string& path, std::string_view expected, const json& v) {
  return invalid_argument(fmt::format("{}: expected {}, found {}", path, expected, v.type_name()));
}

Status require_object(const json& v, const std::string& path) {
  if (!v.is_object()) return type_error(path.empty() ? "top level" : path, "an object", v);
  return {};
}

// The value under `key` of the object `obj` (already checked to be an object).
Result<const json*> member(const json& obj, const std::string& path, std::string_view key) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    return invalid_argument(
        fmt::format("{}: missing field \"{}\"", path.empty() ? "top level" : path, key));
  }
  return &*it;
}

// Files written before a key was added within dlprobe.results/1 lack it; reading such a file
// leaves the member at its default. Present, the key is checked like any other. A since_1_when_set
// key is moreover written only when its member holds a value, so that a document without it is
// written to the byte as before the key was added (the history tells stored documents apart by
// their text).
enum class Presence { required, since_1, since_1_when_set };

// A key holding one member of S.
template <class S, class M>
struct Field {
  std::string_view key;
  M S::*member;
  Presence presence = Presence::required;
  M& of(S& s) const { return s.*member; }
  const M& of(const S& s) const { return s.*member; }
};

// A key holding a member of a member of S, for a struct written flat into its owner's object.
template <class S, class I, class M>
struct NestedField {
  std::string_view key;
  I S::*outer;
  M I::*inner;
  Presence presence = Presence::required;
  M& of(S& s) const { return s.*outer.*inner; }
  const M& of(const S& s) const { return s.*outer.*inner; }
};

// A key whose JSON form depends on more of S than one member.
template <class S>
struct CustomField {
  std::string_view key;
  json (*write)(const S&);
  Status (*read)(const json& value, const std::string& path, S& s);
  Presence presence = Presence::required;
};

// Deduction guides: clang before 17 does not deduce an aggregate's template arguments from its
// initializer (C++20's P1816), and the libFuzzer build (fuzz/README.md) is clang's.
template <class S, class M>
Field(std::string_view, M S::*) -> Field<S, M>;
template <class S, class M>
Field(std::string_view, M S::*, Presence) -> Field<S, M>;
template <class S, class I, class M>
NestedField(std::string_view, I S::*, M I::*) -> NestedField<S, I, M>;

// Schema<S>::fields lists the keys of S's JSON object; Schema<S>::check, where there is one, tests
// what the keys must agree on once all are read.
template <class S>
struct Schema;

template <class S>
concept Described = requires {
  Schema<S>::fields;
};

// The enumerations the file stores by name, and their tables.
constexpr const auto& names(Kind) {
  return kKinds;
}
constexpr const auto& names(RunStatus) {
  return kRunStatuses;
}
constexpr const auto& names(RunsIn) {
  return kRunsIn;
}
constexpr const auto& names(Severity) {
  return kSeverities;
}

template <class E>
concept NamedEnum = requires(E e) {
  names(e);
};

// ---- values ----
//
// encode() writes a member's value, decode() reads it back and names `path` in every error. All
// overloads are declared here so that the templates among them find each other.

json encode(const std::string& value);
template <class T>
requires std::is_arithmetic_v<T> json encode(T value);
template <NamedEnum E>
json encode(E value);
// A free-form object (allocator statistics, the memory analysis), or null.
json encode(const json& value);
json encode(const std::map<std::string, std::string>& value);
template <class T>
json encode(const std::optional<T>& value);
template <class T>
json encode(const std::vector<T>& value);
template <Described S>
json encode(const S& value);

Status decode(const json& v, const std::string& path, std::string& out);
Status decode(const json& v, const std::string& path, double& out);
Status decode(const json& v, const std::string& path, bool& out);
template <std::integral T>
Status decode(const json& v, const std::string& path, T& out);
template <NamedEnum E>
Status decode(const json& v, const std::string& path, E& out);
Status decode(const json& v, const std::string& path, json& out);
Status decode(const json& v, const std::string& path, std::map<std::string, std::string>& out);
// Null reads as none.
template <class T>
Status decode(const json& v, const std::string& path, std::optional<T>& out);
template <class T>
Status decode(const json& v, const std::string& path, std::vector<T>& out);
template <Described S>
Status decode(const json& v, const std::string& path, S& out);

// ---- objects ----

template <class S, class F>
void write_field(json& out, const S& s, const F& f) {
  if constexpr (requires { f.write; }) {
    out[f.key] = f.write(s);
  } else {
    json value = encode(f.of(s));
    if (f.presence == Presence::since_1_when_set && value.is_null()) return;
    out[f.key] = std::move(value);
  }
}

template <class S, class F>
Status read_field(const json& obj, const std::string& path, const F& f, S& s) {
  if (f.presence != Presence::required && !obj.contains(f.key)) return {};
  DLPROBE_ASSIGN_OR_RETURN(const json* v, member(obj, path, f.key));
  if constexpr (requires { f.read; }) {
    return f.read(*v, join_path(path, f.key), s);
  } else {
    return decode(*v, join_path(path, f.key), f.of(s));
  }
}

template <class S, class Fields>
json write_fields(const S& s, const Fields& fields) {
  json out = json::object();
  std::apply([&](const auto&... f) { (write_field(out, s, f), ...); }, fields);
  return out;
}

// The keys in order, stopping at the first error.
template <class S, class Fields>
Status read_fields(const json& v, const std::string& path, const Fields& fields, S& s) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  Status status;
  std::apply(
      [&](const auto&... f) {
        static_cast<void>(((status = read_field(v, path, f, s)).is_ok() && ...));
      },
      fields);
  return status;
}

// ---- the structs ----
//
// As nlohmann's NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE: a key is named after its member, so each is
// written once. Inside a Schema, `Self` is the struct the keys belong to.

#define DLPROBE_RESULTS_KEY(member) Field{#member, &Self::member},
#define DLPROBE_RESULTS_KEY_SINCE_1(member) Field{#member, &Self::member, Presence::since_1},
#define DLPROBE_RESULTS_KEY_WHEN_SET(member) \
  Field{#member, &Self::member, Presence::since_1_when_set},
#define DLPROBE_RESULTS_KEYS(...)                                               \
  std::tuple {                                                                  \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(DLPROBE_RESULTS_KEY, __VA_ARGS__)) \
  }
#define DLPROBE_RESULTS_KEYS_SINCE_1(...)                                               \
  std::tuple {                                                                          \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(DLPROBE_RESULTS_KEY_SINCE_1, __VA_ARGS__)) \
  }
// The Schema of a struct whose keys are all required members.
#define DLPROBE_RESULTS_SCHEMA(S, ...)                                \
  template <>                                                         \
  struct Schema<S> {                                                  \
    using Self = S;                                                   \
    static constexpr auto fields = DLPROBE_RESULTS_KEYS(__VA_ARGS__); \
  }

using stats::Summary;

DLPROBE_RESULTS_SCHEMA(Library, name, version, path);
DLPROBE_RESULTS_SCHEMA(Gpu, index, name, uuid, pci_bus_id, compute_capability, memory_total_bytes,
                       sm_count);
DLPROBE_RESULTS_SCHEMA(GpuProcess, pid, used_bytes);
DLPROBE_RESULTS_SCHEMA(DeviceState, gpu, sm_clock_mhz, mem_clock_mhz, temperature_c, power_w,
                       power_limit_w, clock_event_reasons, other_processes);
DLPROBE_RESULTS_SCHEMA(Container, runtime, image, digest);
template <>
struct Schema<Context> {
  using Self = Context;
  static constexpr auto fields = std::tuple_cat(
      DLPROBE_RESULTS_KEYS(dlprobe_version, git_hash, command_line, date, hostname, os, cpu,
                           cpu_threads, host_memory_bytes, driver_version, cuda_driver_version,
                           cuda_runtime_version, libraries, gpus, device_state),
      std::tuple{DLPROBE_RESULTS_KEY_WHEN_SET(container)});
};
DLPROBE_RESULTS_SCHEMA(Range, count, min, median, max);
DLPROBE_RESULTS_SCHEMA(TelemetrySample, t_s, gpu_util_pct, power_w, sm_clock_mhz, mem_used_mib,
                       temperature_c);
DLPROBE_RESULTS_SCHEMA(Telemetry, gpu, samples, window_s, gpu_util_pct, mem_util_pct, power_w,
                       sm_clock_mhz, mem_clock_mhz, temperature_c, mem_used_mib, energy_j,
                       energy_source, throttle_reasons, timeline);
DLPROBE_RESULTS_SCHEMA(Compute, flops_per_item, achieved_tflops, ceiling_tflops, ceiling_dtype,
                       fraction_of_ceiling);
DLPROBE_RESULTS_SCHEMA(Finding, severity, id, message, evidence, fix);
template <>
struct Schema<CallTime> {
  using Self = CallTime;
  static constexpr auto fields = DLPROBE_RESULTS_KEYS(name, kind, ms);
  static Status check(const std::string& path, const CallTime& c) {
    if (c.name.empty() || c.kind.empty()) {
      return invalid_argument(fmt::format("{}: a call needs a name and a kind", path));
    }
    if (!(c.ms >= 0)) {
      return invalid_argument(fmt::format("{}: {} ms", join_path(path, "ms"), c.ms));
    }
    return {};
  }
};
DLPROBE_RESULTS_SCHEMA(Warmup, mode, steps, seconds, steady, restarts, step_seconds);
// Besides these, the document holds "schema": kSchema, which from_json checks before anything.
DLPROBE_RESULTS_SCHEMA(Document, context, configurations, findings);

// The throughput's interval is written flat, as two keys of the summary.
template <>
struct Schema<Summary> {
  using Self = Summary;
  static constexpr auto fields = std::tuple_cat(
      DLPROBE_RESULTS_KEYS(steps, total_items, total_seconds, throughput),
      std::tuple{
          NestedField{"throughput_ci_low", &Summary::throughput_ci, &stats::Interval::low},
          NestedField{"throughput_ci_high", &Summary::throughput_ci, &stats::Interval::high}},
      DLPROBE_RESULTS_KEYS(ci_level, bootstrap_resamples, bootstrap_seed, mean_s, median_s, p90_s,
                           p99_s, min_s, max_s, mad_s, cv, outliers));
  static Status check(const std::string& path, const Summary& s) {
    // A rate, a count and a time are never negative, and an interval's low end is not above its
    // high one: compare and the history show these figures as read.
    for (const auto& [key, value] :
         {std::pair{"throughput", s.throughput}, std::pair{"total_items", s.total_items},
          std::pair{"total_seconds", s.total_seconds},
          std::pair{"throughput_ci_low", s.throughput_ci.low}}) {
      if (!(value >= 0)) {
        return invalid_argument(fmt::format("{}: {} is negative", join_path(path, key), value));
      }
    }
    if (!(s.throughput_ci.low <= s.throughput_ci.high)) {
      return invalid_argument(fmt::format("{}: {} is below the low end {}",
                                          join_path(path, "throughput_ci_high"),
                                          s.throughput_ci.high, s.throughput_ci.low));
    }
    return {};
  }
};

// The interval is written flat, as the summary's is.
template <>
struct Schema<stats::RunSpread> {
  using Self = stats::RunSpread;
  static constexpr auto fields =
      std::tuple_cat(DLPROBE_RESULTS_KEYS(runs, mean, min, max),
                     std::tuple{NestedField{"ci_low", &Self::ci, &stats::Interval::low},
                                NestedField{"ci_high", &Self::ci, &stats::Interval::high}},
                     DLPROBE_RESULTS_KEYS(level));
};

template <>
struct Schema<Memory> {
  using Self = Memory;
  static constexpr auto fields = std::tuple_cat(
      DLPROBE_RESULTS_KEYS(source, allocator_stats, framework_peak_allocated_bytes,
                           framework_peak_reserved_bytes, nvml_process_peak_bytes),
      DLPROBE_RESULTS_KEYS_SINCE_1(analysis), std::tuple{DLPROBE_RESULTS_KEY_WHEN_SET(arena)});
};

// Settings has two key sets: a native run's and an external run's (the configuration's kind says
// which); the other block's members are not written.
struct NativeSettings {
  using Self = Settings;
  static constexpr auto fields =
      std::tuple_cat(DLPROBE_RESULTS_KEYS(model, batch, precision, mode, layout, device, optimizer),
                     DLPROBE_RESULTS_KEYS_SINCE_1(gpu_memory, image_size, classes, backend, width,
                                                  input, streams, recompute, stream_lag));
};
struct ExternalSettings {
  using Self = Settings;
  static constexpr auto fields = DLPROBE_RESULTS_KEYS(command, sweep);
};

json write_settings(const Configuration& c) {
  if (c.kind == Kind::native) return write_fields(c.settings, NativeSettings::fields);
  return write_fields(c.settings, ExternalSettings::fields);
}

Status read_settings(const json& v, const std::string& path, Configuration& c) {
  DLPROBE_RETURN_IF_ERROR(c.kind == Kind::native
                              ? read_fields(v, path, NativeSettings::fields, c.settings)
                              : read_fields(v, path, ExternalSettings::fields, c.settings));
  // No run has a negative size or count (0 reads as absent: an external run's batch, a key that
  // older files lack).
  const Settings& s = c.settings;
  for (const auto& [key, value] :
       {std::pair{"batch", s.batch}, std::pair{"image_size", s.image_size},
        std::pair{"classes", s.classes}, std::pair{"width", s.width},
        std::pair{"streams", s.streams}, std::pair{"stream_lag", s.stream_lag}}) {
    if (value < 0) {
      return invalid_argument(fmt::format("{}: {} is out of range", join_path(path, key), value));
    }
  }
  return {};
}

// Items are written once when every step had the same count (the usual case), else per step.
json write_step_items(const Samples& s) {
  const bool constant =
      !s.step_items.empty() && std::all_of(s.step_items.begin(), s.step_items.end(),
                                           [&](double v) { return v == s.step_items.front(); });
  if (constant) return s.step_items.front();
  return s.step_items;
}

Status read_step_items(const json& v, const std::string& path, Samples& s) {
  if (!v.is_number()) return decode(v, path, s.step_items);
  double each = 0;
  DLPROBE_RETURN_IF_ERROR(decode(v, path, each));
  s.step_items.assign(s.step_seconds.size(), each);
  return {};
}

// Groups of consecutive steps (windows, runs): none, or each of one step or more, adding up to the
// steps. Each is at most the steps, so that the sum of a hostile file's counts cannot overflow.
Status check_groups(const std::string& path, std::string_view key, std::string_view noun,
                    const std::vector<std::int64_t>& groups, const Samples& s) {
  const auto n = static_cast<std::int64_t>(s.step_seconds.size());
  std::int64_t sum = 0;
  for (const std::int64_t steps : groups) {
    if (steps < 1 || steps > n) {
      return invalid_argument(
          fmt::format("{}: a {} of {} steps", join_path(path, key), noun, steps));
    }
    sum += steps;
  }
  if (!groups.empty() && sum != n) {
    return invalid_argument(
        fmt::format("{}: {}s of {} steps in all for {} steps", join_path(path, key), noun, sum, n));
  }
  return {};
}

template <>
struct Schema<Samples> {
  using Self = Samples;
  // The step times come before the items: a single item count stands for every step.
  static constexpr auto fields = std::tuple_cat(
      DLPROBE_RESULTS_KEYS(warmup_steps, step_seconds),
      DLPROBE_RESULTS_KEYS_SINCE_1(window_steps, run_steps, warmup, window_other_cpu_seconds,
                                   host_cpus),
      std::tuple{CustomField<Samples>{"step_items", write_step_items, read_step_items}});
  static Status check(const std::string& path, const Samples& s) {
    DLPROBE_RETURN_IF_ERROR(check_groups(path, "window_steps", "window", s.window_steps, s));
    DLPROBE_RETURN_IF_ERROR(check_groups(path, "run_steps", "run", s.run_steps, s));
    // One figure a window: every window of every run, or one a run when no run had several.
    const std::size_t windows = !s.window_steps.empty()
                                    ? s.window_steps.size()
                                    : std::max<std::size_t>(1, s.run_steps.size());
    if (!s.window_other_cpu_seconds.empty() && s.window_other_cpu_seconds.size() != windows) {
      return invalid_argument(fmt::format("{}: {} entries for {} windows",
                                          join_path(path, "window_other_cpu_seconds"),
                                          s.window_other_cpu_seconds.size(), windows));
    }
    for (const double seconds : s.window_other_cpu_seconds) {
      if (!(seconds >= 0)) {
        return invalid_argument(fmt::format("{}: {} is not a CPU time",
                                            join_path(path, "window_other_cpu_seconds"), seconds));
      }
    }
    if (s.host_cpus < 0) {
      return invalid_argument(
          fmt::format("{}: {} CPUs", join_path(path, "host_cpus"), s.host_cpus));
    }
    if (s.step_items.size() != s.step_seconds.size()) {
      return invalid_argument(fmt::format("{}: {} entries for {} steps",
                                          join_path(path, "step_items"), s.step_items.size(),
                                          s.step_seconds.size()));
    }
    // What compare, report and the history compute from: a step takes some time and counts some
    // items.
    for (std::size_t i = 0; i < s.step_seconds.size(); ++i) {
      if (!(s.step_seconds[i] > 0)) {
        return invalid_argument(fmt::format("{}: step {} took {} s",
                                            join_path(path, "step_seconds"), i, s.step_seconds[i]));
      }
      if (!(s.step_items[i] > 0)) {
        return invalid_argument(fmt::format("{}: step {} counted {} items",
                                            join_path(path, "step_items"), i, s.step_items[i]));
      }
    }
    return {};
  }
};

template <>
struct Schema<Configuration> {
  using Self = Configuration;
  // The kind comes first: the settings' keys depend on it.
  static constexpr auto fields = std::tuple_cat(
      DLPROBE_RESULTS_KEYS(kind),
      std::tuple{CustomField<Configuration>{"settings", write_settings, read_settings}},
      DLPROBE_RESULTS_KEYS(status, error, statistics),
      DLPROBE_RESULTS_KEYS_SINCE_1(run_spread, runs_in),
      DLPROBE_RESULTS_KEYS(samples, memory, telemetry, compute, findings),
      std::tuple{DLPROBE_RESULTS_KEY_WHEN_SET(profile)});
  // dlprobe computes the summary from the samples (stats::summarize): where a file has both, a
  // summary that disagrees with its samples was edited, and compare (which reads the samples)
  // and report (which shows the summary) would tell two stories.
  static Status check(const std::string& path, const Configuration& c) {
    if (!c.statistics || c.samples.step_seconds.empty()) return {};
    const Summary& s = *c.statistics;
    const std::vector<double>& seconds = c.samples.step_seconds;
    const std::vector<double>& items = c.samples.step_items;
    const double total_seconds = std::accumulate(seconds.begin(), seconds.end(), 0.0);
    const double total_items = std::accumulate(items.begin(), items.end(), 0.0);
    const auto same = [](double a, double b) {
      return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
    };
    if (s.steps != seconds.size() || !same(s.total_seconds, total_seconds) ||
        !same(s.total_items, total_items) || !same(s.throughput, total_items / total_seconds)) {
      return invalid_argument(fmt::format(
          "{}: {} steps, {} items in {} s, {} items/s, where the samples hold {} steps, {} items "
          "in {} s, {} items/s (an edited file? restore the samples, or remove the statistics, "
          "which are computed from them)",
          join_path(path, "statistics"), s.steps, s.total_items, s.total_seconds, s.throughput,
          seconds.size(), total_items, total_seconds, total_items / total_seconds));
    }
    return {};
  }
};

#undef DLPROBE_RESULTS_SCHEMA
#undef DLPROBE_RESULTS_KEYS_SINCE_1
#undef DLPROBE_RESULTS_KEYS
#undef DLPROBE_RESULTS_KEY_SINCE_1
#undef DLPROBE_RESULTS_KEY_WHEN_SET
#undef DLPROBE_RESULTS_KEY

// ---- values, defined ----

json encode(const std::string& value) {
  return value;
}

template <class T>
requires std::is_arithmetic_v<T> json encode(T value) {
  return value;
}

template <NamedEnum E>
json encode(E value) {
  return name_of(names(value), value);
}

json encode(const json& value) {
  return value.is_object() ? value : json(nullptr);
}

json encode(const std::map<std::string, std::string>& value) {
  return value;
}

template <class T>
json encode(const std::optional<T>& value) {
  return value ? encode(*value) : json(nullptr);
}

template <class T>
json encode(const std::vector<T>& value) {
  json out = json::array();
  for (const T& v : value) out.push_back(encode(v));
  return out;
}

template <Described S>
json encode(const S& value) {
  return write_fields(value, Schema<S>::fields);
}

Status decode(const json& v, const std::string& path, std::string& out) {
  if (!v.is_string()) return type_error(path, "a string", v);
  out = v.get<std::string>();
  return {};
}

Status decode(const json& v, const std::string& path, double& out) {
  if (!v.is_number()) return type_error(path, "a number", v);
  out = v.get<double>();
  // JSON text cannot hold one (parse refuses 1e400), but a value built in memory can.
  if (!std::isfinite(out)) return invalid_argument(fmt::format("{}: not a finite number", path));
  return {};
}

Status decode(const json& v, const std::string& path, bool& out) {
  if (!v.is_boolean()) return type_error(path, "true or false", v);
  out = v.get<bool>();
  return {};
}

template <std::integral T>
Status decode(const json& v, const std::string& path, T& out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      return invalid_argument(fmt::format("{}: {} is out of range", path, u));
    }
    out = static_cast<T>(u);
    return {};
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (i < 0) return invalid_argument(fmt::format("{}: {} is negative", path, i));
    } else {
      if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) {
        return invalid_argument(fmt::format("{}: {} is out of range", path, i));
      }
    }
    out = static_cast<T>(i);
    return {};
  }
  // The parser keeps a whole number beyond 64 bits as a double (and 1e30 is one): out of range,
  // not a wrong type. max + 1 is a power of two, exact as a double where max itself is not.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::trunc(d) && (d < static_cast<double>(std::numeric_limits<T>::min()) ||
                               d >= static_cast<double>(std::numeric_limits<T>::max()) + 1)) {
      return invalid_argument(fmt::format("{}: number out of range", path));
    }
  }
  return type_error(path, "an integer", v);
}

template <NamedEnum E>
Status decode(const json& v, const std::string& path, E& out) {
  std::string text;
  DLPROBE_RETURN_IF_ERROR(decode(v, path, text));
  if (const std::optional<E> value = value_named(names(out), text)) {
    out = *value;
    return {};
  }
  return invalid_argument(
      fmt::format("{}: \"{}\" is not one of {}", path, text, names_text(names(out))));
}

Status decode(const json& v, const std::string& path, json& out) {
  if (!v.is_null() && !v.is_object()) return type_error(path, "an object or null", v);
  out = v;
  return {};
}

Status decode(const json& v, const std::string& path, std::map<std::string, std::string>& out) {
  if (!v.is_object()) return type_error(path, "an object", v);
  out.clear();
  for (const auto& [key, value] : v.items()) {
    DLPROBE_RETURN_IF_ERROR(decode(value, join_path(path, key), out[key]));
  }
  return {};
}

template <class T>
Status decode(const json& v, const std::string& path, std::optional<T>& out) {
  if (v.is_null()) {
    out.reset();
    return {};
  }
  T value{};
  DLPROBE_RETURN_IF_ERROR(decode(v, path, value));
  out = std::move(value);
  return {};
}

template <class T>
Status decode(const json& v, const std::string& path, std::vector<T>& out) {
  if (!v.is_array()) return type_error(path, "an array", v);
  out.clear();
  out.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    DLPROBE_RETURN_IF_ERROR(decode(v[i], fmt::format("{}[{}]", path, i), out[i]));
  }
  return {};
}

template <Described S>
Status decode(const json& v, const std::string& path, S& out) {
  DLPROBE_RETURN_IF_ERROR(read_fields(v, path, Schema<S>::fields, out));
  if constexpr (requires { Schema<S>::check(path, out); }) return Schema<S>::check(path, out);
  return {};
}

}  // namespace

json to_json(const Document& document) {
  json out = encode(document);
  out["schema"] = kSchema;
  return out;
}

std::string serialize(const Document& document) {
  return to_json(document).dump(2) + "\n";
}

Result<Document> from_json(const json& v) {
  if (!v.is_object()) {
    return invalid_argument(fmt::format(
        "not a dlprobe results file (the top level is {}, not an object)", v.type_name()));
  }
  const auto schema = v.find("schema");
  if (schema == v.end() || !schema->is_string()) {
    return invalid_argument("not a dlprobe results file (no \"schema\" field)");
  }
  const auto name = schema->get<std::string>();
  if (name != kSchema) {
    constexpr std::string_view kFamily = "dlprobe.results/";
    if (name.starts_with(kFamily)) {
      return invalid_argument(fmt::format(
          "results schema \"{}\" is not supported; this dlprobe reads \"{}\"", name, kSchema));
    }
    return invalid_argument(fmt::format(
        "not a dlprobe results file (schema is \"{}\", expected \"{}\")", name, kSchema));
  }
  Document document;
  DLPROBE_RETURN_IF_ERROR(decode(v, "", document));
  return document;
}

Result<Document> parse(std::string_view text, std::string_view name) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return invalid_argument(fmt::format("{}: empty file, not dlprobe results", name));
  }
  Result<json> v = parse_json(text);
  if (!v) return v.status().with_context(name);
  auto document = from_json(*v);
  if (!document) return document.status().with_context(name);
  return document;
}

Result<Document> read_file(const std::filesystem::path& path) {
  DLPROBE_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path, kMaxFileBytes));
  return parse(text, path.string());
}

}  // namespace dlprobe::results
