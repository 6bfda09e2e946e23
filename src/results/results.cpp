#include "dlprobe/results/results.h"

#include "dlprobe/core/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <concepts>
#include <ctime>
#include <limits>

namespace dlprobe::results {

using nlohmann::json;

std::string iso8601_utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::native:
      return "native";
    case Kind::external:
      return "external";
  }
  return "native";
}

std::string_view run_status_name(RunStatus status) {
  switch (status) {
    case RunStatus::ok:
      return "ok";
    case RunStatus::oom:
      return "oom";
    case RunStatus::failed:
      return "failed";
    case RunStatus::interrupted:
      return "interrupted";
    case RunStatus::timeout:
      return "timeout";
  }
  return "failed";
}

std::string_view severity_name(Severity severity) {
  switch (severity) {
    case Severity::info:
      return "info";
    case Severity::warning:
      return "warning";
    case Severity::error:
      return "error";
  }
  return "info";
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

std::string describe(Kind kind, const Settings& s) {
  if (kind == Kind::native) {
    std::string out = s.model;
    if (s.image_size != 0 && s.image_size != 224) out += fmt::format("@{}", s.image_size);
    out += fmt::format(" bs={}", s.batch);
    const bool own_backend = s.backend.empty() || (s.backend == "cuda" && s.device != "cpu") ||
                             (s.backend == "onednn" && s.device == "cpu");
    const std::string device = s.device + (own_backend ? "" : "/" + s.backend);
    for (const std::string* part : {&s.precision, &s.mode, &s.layout, &device, &s.optimizer}) {
      // "none" is the optimizer outside train mode: the mode already says so.
      if (!part->empty() && *part != "none") out += " " + *part;
    }
    if (!s.gpu_memory.empty() && s.gpu_memory != "grow") out += " " + s.gpu_memory;
    return out;
  }
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

std::vector<double> window_throughputs(const Samples& samples) {
  std::vector<double> out;
  const std::size_t n = samples.step_seconds.size();
  if (n == 0 || samples.step_items.size() != n) return out;
  std::vector<std::int64_t> windows = samples.window_steps;
  if (windows.empty()) windows.push_back(static_cast<std::int64_t>(n));
  std::size_t at = 0;
  for (const std::int64_t steps : windows) {
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

// ---- writing ----

namespace {

template <class T>
json opt(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

json range_json(const std::optional<Range>& r) {
  if (!r) return nullptr;
  return {{"count", r->count}, {"min", r->min}, {"median", r->median}, {"max", r->max}};
}

json finding_json(const Finding& f) {
  return {{"severity", severity_name(f.severity)},
          {"id", f.id},
          {"message", f.message},
          {"evidence", f.evidence},
          {"fix", f.fix}};
}

json findings_json(const std::vector<Finding>& findings) {
  json out = json::array();
  for (const auto& f : findings) out.push_back(finding_json(f));
  return out;
}

json context_json(const Context& c) {
  json libraries = json::array();
  for (const auto& l : c.libraries) {
    libraries.push_back({{"name", l.name}, {"version", l.version}, {"path", l.path}});
  }
  json gpus = json::array();
  for (const auto& g : c.gpus) {
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"uuid", g.uuid},
                    {"pci_bus_id", g.pci_bus_id},
                    {"compute_capability", opt(g.compute_capability)},
                    {"memory_total_bytes", opt(g.memory_total_bytes)},
                    {"sm_count", opt(g.sm_count)}});
  }
  json states = json::array();
  for (const auto& d : c.device_state) {
    json processes = json::array();
    for (const auto& p : d.other_processes) {
      processes.push_back({{"pid", p.pid}, {"used_bytes", opt(p.used_bytes)}});
    }
    states.push_back({{"gpu", d.gpu},
                      {"sm_clock_mhz", opt(d.sm_clock_mhz)},
                      {"mem_clock_mhz", opt(d.mem_clock_mhz)},
                      {"temperature_c", opt(d.temperature_c)},
                      {"power_w", opt(d.power_w)},
                      {"power_limit_w", opt(d.power_limit_w)},
                      {"clock_event_reasons", d.clock_event_reasons},
                      {"other_processes", processes}});
  }
  return {{"dlprobe_version", c.dlprobe_version},
          {"git_hash", c.git_hash},
          {"command_line", c.command_line},
          {"date", c.date},
          {"hostname", c.hostname},
          {"os", c.os},
          {"cpu", c.cpu},
          {"cpu_threads", opt(c.cpu_threads)},
          {"host_memory_bytes", opt(c.host_memory_bytes)},
          {"driver_version", opt(c.driver_version)},
          {"cuda_driver_version", opt(c.cuda_driver_version)},
          {"cuda_runtime_version", opt(c.cuda_runtime_version)},
          {"libraries", libraries},
          {"gpus", gpus},
          {"device_state", states}};
}

json settings_json(Kind kind, const Settings& s) {
  if (kind == Kind::native) {
    return {{"model", s.model},         {"batch", s.batch},           {"precision", s.precision},
            {"mode", s.mode},           {"layout", s.layout},         {"device", s.device},
            {"optimizer", s.optimizer}, {"gpu_memory", s.gpu_memory}, {"image_size", s.image_size},
            {"classes", s.classes},     {"backend", s.backend}};
  }
  return {{"command", s.command}, {"sweep", s.sweep}};
}

json statistics_json(const std::optional<stats::Summary>& s) {
  if (!s) return nullptr;
  return {{"steps", s->steps},
          {"total_items", s->total_items},
          {"total_seconds", s->total_seconds},
          {"throughput", s->throughput},
          {"throughput_ci_low", s->throughput_ci.low},
          {"throughput_ci_high", s->throughput_ci.high},
          {"ci_level", s->ci_level},
          {"bootstrap_resamples", s->bootstrap_resamples},
          {"bootstrap_seed", s->bootstrap_seed},
          {"mean_s", s->mean_s},
          {"median_s", s->median_s},
          {"p90_s", s->p90_s},
          {"p99_s", s->p99_s},
          {"min_s", s->min_s},
          {"max_s", s->max_s},
          {"mad_s", s->mad_s},
          {"cv", s->cv},
          {"outliers", s->outliers}};
}

// Items are written once when every step had the same count (the usual case), else per step.
json samples_json(const Samples& s) {
  json items;
  const bool constant =
      !s.step_items.empty() && std::all_of(s.step_items.begin(), s.step_items.end(),
                                           [&](double v) { return v == s.step_items.front(); });
  if (constant) {
    items = s.step_items.front();
  } else {
    items = s.step_items;
  }
  return {{"warmup_steps", s.warmup_steps},
          {"step_seconds", s.step_seconds},
          {"step_items", items},
          {"window_steps", s.window_steps}};
}

json memory_json(const std::optional<Memory>& m) {
  if (!m) return nullptr;
  return {{"source", m->source},
          {"allocator_stats", m->allocator_stats.is_object() ? m->allocator_stats : json(nullptr)},
          {"framework_peak_allocated_bytes", opt(m->framework_peak_allocated_bytes)},
          {"framework_peak_reserved_bytes", opt(m->framework_peak_reserved_bytes)},
          {"nvml_process_peak_bytes", opt(m->nvml_process_peak_bytes)},
          {"analysis", m->analysis.is_object() ? m->analysis : json(nullptr)}};
}

json telemetry_json(const Telemetry& t) {
  json timeline = json::array();
  for (const auto& s : t.timeline) {
    timeline.push_back({{"t_s", s.t_s},
                        {"gpu_util_pct", opt(s.gpu_util_pct)},
                        {"power_w", opt(s.power_w)},
                        {"sm_clock_mhz", opt(s.sm_clock_mhz)},
                        {"mem_used_mib", opt(s.mem_used_mib)},
                        {"temperature_c", opt(s.temperature_c)}});
  }
  return {{"gpu", t.gpu},
          {"samples", t.samples},
          {"window_s", t.window_s},
          {"gpu_util_pct", range_json(t.gpu_util_pct)},
          {"mem_util_pct", range_json(t.mem_util_pct)},
          {"power_w", range_json(t.power_w)},
          {"sm_clock_mhz", range_json(t.sm_clock_mhz)},
          {"mem_clock_mhz", range_json(t.mem_clock_mhz)},
          {"temperature_c", range_json(t.temperature_c)},
          {"mem_used_mib", range_json(t.mem_used_mib)},
          {"energy_j", opt(t.energy_j)},
          {"energy_source", t.energy_source},
          {"throttle_reasons", t.throttle_reasons},
          {"timeline", timeline}};
}

json compute_json(const std::optional<Compute>& c) {
  if (!c) return nullptr;
  return {{"flops_per_item", opt(c->flops_per_item)},
          {"achieved_tflops", opt(c->achieved_tflops)},
          {"ceiling_tflops", opt(c->ceiling_tflops)},
          {"ceiling_dtype", c->ceiling_dtype},
          {"fraction_of_ceiling", opt(c->fraction_of_ceiling)}};
}

json configuration_json(const Configuration& c) {
  json telemetry = json::array();
  for (const auto& t : c.telemetry) telemetry.push_back(telemetry_json(t));
  return {{"kind", kind_name(c.kind)},
          {"settings", settings_json(c.kind, c.settings)},
          {"status", run_status_name(c.status)},
          {"error", c.error},
          {"statistics", statistics_json(c.statistics)},
          {"samples", samples_json(c.samples)},
          {"memory", memory_json(c.memory)},
          {"telemetry", telemetry},
          {"compute", compute_json(c.compute)},
          {"findings", findings_json(c.findings)}};
}

}  // namespace

json to_json(const Document& document) {
  json configurations = json::array();
  for (const auto& c : document.configurations) configurations.push_back(configuration_json(c));
  return {{"schema", kSchema},
          {"context", context_json(document.context)},
          {"configurations", configurations},
          {"findings", findings_json(document.findings)}};
}

std::string serialize(const Document& document) {
  return to_json(document).dump(2) + "\n";
}

// ---- reading ----
//
// Hand-written rather than nlohmann's adl from_json: that throws on the first wrong type with a
// message that does not say where in the document it was, and the rule here is one line that names
// the JSON path.

namespace {

std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

Status type_error(const std::string& path, std::string_view expected, const json& v) {
  return invalid_argument(fmt::format("{}: expected {}, found {}", path, expected, v.type_name()));
}

Status convert(const json& v, const std::string& path, std::string& out) {
  if (!v.is_string()) return type_error(path, "a string", v);
  out = v.get<std::string>();
  return {};
}

Status convert(const json& v, const std::string& path, double& out) {
  if (!v.is_number()) return type_error(path, "a number", v);
  out = v.get<double>();
  return {};
}

// Declared up front so that the templates below (vectors, optional fields) find them.
Status convert(const json& v, const std::string& path, Kind& out);
Status convert(const json& v, const std::string& path, RunStatus& out);
Status convert(const json& v, const std::string& path, Severity& out);
Status convert(const json& v, const std::string& path, Finding& out);
Status convert(const json& v, const std::string& path, Library& out);
Status convert(const json& v, const std::string& path, Gpu& out);
Status convert(const json& v, const std::string& path, GpuProcess& out);
Status convert(const json& v, const std::string& path, DeviceState& out);
Status convert(const json& v, const std::string& path, Context& out);
Status convert(const json& v, const std::string& path, stats::Summary& out);
Status convert(const json& v, const std::string& path, Samples& out);
Status convert(const json& v, const std::string& path, Memory& out);
Status convert(const json& v, const std::string& path, Range& out);
Status convert(const json& v, const std::string& path, TelemetrySample& out);
Status convert(const json& v, const std::string& path, Telemetry& out);
Status convert(const json& v, const std::string& path, Compute& out);
Status convert(const json& v, const std::string& path, Configuration& out);

template <std::integral T>
Status convert(const json& v, const std::string& path, T& out) {
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
  return type_error(path, "an integer", v);
}

template <class T>
Status convert(const json& v, const std::string& path, std::vector<T>& out) {
  if (!v.is_array()) return type_error(path, "an array", v);
  out.clear();
  out.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    DLPROBE_RETURN_IF_ERROR(convert(v[i], fmt::format("{}[{}]", path, i), out[i]));
  }
  return {};
}

Status convert(const json& v, const std::string& path, std::map<std::string, std::string>& out) {
  if (!v.is_object()) return type_error(path, "an object", v);
  out.clear();
  for (const auto& [key, value] : v.items()) {
    DLPROBE_RETURN_IF_ERROR(convert(value, join_path(path, key), out[key]));
  }
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

template <class T>
Status field(const json& obj, const std::string& path, std::string_view key, T& out) {
  DLPROBE_ASSIGN_OR_RETURN(const json* v, member(obj, path, key));
  return convert(*v, join_path(path, key), out);
}

template <class T>
Status field(const json& obj, const std::string& path, std::string_view key,
             std::optional<T>& out) {
  DLPROBE_ASSIGN_OR_RETURN(const json* v, member(obj, path, key));
  if (v->is_null()) {
    out.reset();
    return {};
  }
  T value{};
  DLPROBE_RETURN_IF_ERROR(convert(*v, join_path(path, key), value));
  out = std::move(value);
  return {};
}

// A field added within dlprobe.results/1: files from earlier writers lack it, and then `out` keeps
// its default. Present, it is checked like any other.
template <class T>
Status field_since_1(const json& obj, const std::string& path, std::string_view key, T& out) {
  if (obj.find(key) == obj.end()) return {};
  return field(obj, path, key, out);
}

Status require_object(const json& v, const std::string& path) {
  if (!v.is_object()) return type_error(path.empty() ? "top level" : path, "an object", v);
  return {};
}

template <class E, std::size_t N>
Status convert_enum(const json& v, const std::string& path, const E (&all)[N],
                    std::string_view (*name)(E), E& out) {
  std::string text;
  DLPROBE_RETURN_IF_ERROR(convert(v, path, text));
  std::string accepted;
  for (E e : all) {
    if (name(e) == text) {
      out = e;
      return {};
    }
    accepted += fmt::format("{}{}", accepted.empty() ? "" : ", ", name(e));
  }
  return invalid_argument(fmt::format("{}: \"{}\" is not one of {}", path, text, accepted));
}

Status convert(const json& v, const std::string& path, Kind& out) {
  static constexpr Kind kAll[] = {Kind::native, Kind::external};
  return convert_enum(v, path, kAll, kind_name, out);
}
Status convert(const json& v, const std::string& path, RunStatus& out) {
  static constexpr RunStatus kAll[] = {RunStatus::ok, RunStatus::oom, RunStatus::failed,
                                       RunStatus::interrupted, RunStatus::timeout};
  return convert_enum(v, path, kAll, run_status_name, out);
}
Status convert(const json& v, const std::string& path, Severity& out) {
  static constexpr Severity kAll[] = {Severity::info, Severity::warning, Severity::error};
  return convert_enum(v, path, kAll, severity_name, out);
}

Status convert(const json& v, const std::string& path, Finding& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "severity", out.severity));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "id", out.id));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "message", out.message));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "evidence", out.evidence));
  return field(v, path, "fix", out.fix);
}

Status convert(const json& v, const std::string& path, Library& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "name", out.name));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "version", out.version));
  return field(v, path, "path", out.path);
}

Status convert(const json& v, const std::string& path, Gpu& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "index", out.index));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "name", out.name));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "uuid", out.uuid));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "pci_bus_id", out.pci_bus_id));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "compute_capability", out.compute_capability));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "memory_total_bytes", out.memory_total_bytes));
  return field(v, path, "sm_count", out.sm_count);
}

Status convert(const json& v, const std::string& path, GpuProcess& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "pid", out.pid));
  return field(v, path, "used_bytes", out.used_bytes);
}

Status convert(const json& v, const std::string& path, DeviceState& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "gpu", out.gpu));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "sm_clock_mhz", out.sm_clock_mhz));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mem_clock_mhz", out.mem_clock_mhz));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "temperature_c", out.temperature_c));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "power_w", out.power_w));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "power_limit_w", out.power_limit_w));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "clock_event_reasons", out.clock_event_reasons));
  return field(v, path, "other_processes", out.other_processes);
}

Status convert(const json& v, const std::string& path, Context& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "dlprobe_version", out.dlprobe_version));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "git_hash", out.git_hash));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "command_line", out.command_line));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "date", out.date));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "hostname", out.hostname));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "os", out.os));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "cpu", out.cpu));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "cpu_threads", out.cpu_threads));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "host_memory_bytes", out.host_memory_bytes));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "driver_version", out.driver_version));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "cuda_driver_version", out.cuda_driver_version));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "cuda_runtime_version", out.cuda_runtime_version));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "libraries", out.libraries));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "gpus", out.gpus));
  return field(v, path, "device_state", out.device_state);
}

Status convert_settings(const json& v, const std::string& path, Kind kind, Settings& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  if (kind == Kind::external) {
    DLPROBE_RETURN_IF_ERROR(field(v, path, "command", out.command));
    return field(v, path, "sweep", out.sweep);
  }
  DLPROBE_RETURN_IF_ERROR(field(v, path, "model", out.model));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "batch", out.batch));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "precision", out.precision));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mode", out.mode));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "layout", out.layout));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "device", out.device));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "optimizer", out.optimizer));
  DLPROBE_RETURN_IF_ERROR(field_since_1(v, path, "gpu_memory", out.gpu_memory));
  DLPROBE_RETURN_IF_ERROR(field_since_1(v, path, "image_size", out.image_size));
  DLPROBE_RETURN_IF_ERROR(field_since_1(v, path, "classes", out.classes));
  return field_since_1(v, path, "backend", out.backend);
}

Status convert(const json& v, const std::string& path, stats::Summary& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "steps", out.steps));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "total_items", out.total_items));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "total_seconds", out.total_seconds));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "throughput", out.throughput));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "throughput_ci_low", out.throughput_ci.low));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "throughput_ci_high", out.throughput_ci.high));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "ci_level", out.ci_level));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "bootstrap_resamples", out.bootstrap_resamples));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "bootstrap_seed", out.bootstrap_seed));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mean_s", out.mean_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "median_s", out.median_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "p90_s", out.p90_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "p99_s", out.p99_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "min_s", out.min_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "max_s", out.max_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mad_s", out.mad_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "cv", out.cv));
  return field(v, path, "outliers", out.outliers);
}

Status convert(const json& v, const std::string& path, Samples& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "warmup_steps", out.warmup_steps));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "step_seconds", out.step_seconds));
  DLPROBE_RETURN_IF_ERROR(field_since_1(v, path, "window_steps", out.window_steps));
  std::int64_t windowed = 0;
  for (const std::int64_t steps : out.window_steps) {
    if (steps < 1) {
      return invalid_argument(
          fmt::format("{}: a window of {} steps", join_path(path, "window_steps"), steps));
    }
    windowed += steps;
  }
  if (!out.window_steps.empty() && windowed != static_cast<std::int64_t>(out.step_seconds.size())) {
    return invalid_argument(fmt::format("{}: windows of {} steps in all for {} steps",
                                        join_path(path, "window_steps"), windowed,
                                        out.step_seconds.size()));
  }
  DLPROBE_ASSIGN_OR_RETURN(const json* items, member(v, path, "step_items"));
  const std::string items_path = join_path(path, "step_items");
  if (items->is_number()) {
    double each = 0;
    DLPROBE_RETURN_IF_ERROR(convert(*items, items_path, each));
    out.step_items.assign(out.step_seconds.size(), each);
    return {};
  }
  DLPROBE_RETURN_IF_ERROR(convert(*items, items_path, out.step_items));
  if (out.step_items.size() != out.step_seconds.size()) {
    return invalid_argument(fmt::format("{}: {} entries for {} steps", items_path,
                                        out.step_items.size(), out.step_seconds.size()));
  }
  return {};
}

Status convert(const json& v, const std::string& path, Memory& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "source", out.source));
  DLPROBE_ASSIGN_OR_RETURN(const json* stats, member(v, path, "allocator_stats"));
  if (!stats->is_null() && !stats->is_object()) {
    return type_error(join_path(path, "allocator_stats"), "an object or null", *stats);
  }
  out.allocator_stats = *stats;
  DLPROBE_RETURN_IF_ERROR(
      field(v, path, "framework_peak_allocated_bytes", out.framework_peak_allocated_bytes));
  DLPROBE_RETURN_IF_ERROR(
      field(v, path, "framework_peak_reserved_bytes", out.framework_peak_reserved_bytes));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "nvml_process_peak_bytes", out.nvml_process_peak_bytes));
  // Added after the first files were written: absent means none.
  const auto analysis = v.find("analysis");
  if (analysis == v.end() || analysis->is_null()) return {};
  if (!analysis->is_object()) {
    return type_error(join_path(path, "analysis"), "an object or null", *analysis);
  }
  out.analysis = *analysis;
  return {};
}

Status convert(const json& v, const std::string& path, Range& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "count", out.count));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "min", out.min));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "median", out.median));
  return field(v, path, "max", out.max);
}

Status convert(const json& v, const std::string& path, TelemetrySample& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "t_s", out.t_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "gpu_util_pct", out.gpu_util_pct));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "power_w", out.power_w));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "sm_clock_mhz", out.sm_clock_mhz));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mem_used_mib", out.mem_used_mib));
  return field(v, path, "temperature_c", out.temperature_c);
}

Status convert(const json& v, const std::string& path, Telemetry& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "gpu", out.gpu));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "samples", out.samples));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "window_s", out.window_s));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "gpu_util_pct", out.gpu_util_pct));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mem_util_pct", out.mem_util_pct));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "power_w", out.power_w));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "sm_clock_mhz", out.sm_clock_mhz));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mem_clock_mhz", out.mem_clock_mhz));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "temperature_c", out.temperature_c));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "mem_used_mib", out.mem_used_mib));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "energy_j", out.energy_j));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "energy_source", out.energy_source));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "throttle_reasons", out.throttle_reasons));
  return field(v, path, "timeline", out.timeline);
}

Status convert(const json& v, const std::string& path, Compute& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "flops_per_item", out.flops_per_item));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "achieved_tflops", out.achieved_tflops));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "ceiling_tflops", out.ceiling_tflops));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "ceiling_dtype", out.ceiling_dtype));
  return field(v, path, "fraction_of_ceiling", out.fraction_of_ceiling);
}

Status convert(const json& v, const std::string& path, Configuration& out) {
  DLPROBE_RETURN_IF_ERROR(require_object(v, path));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "kind", out.kind));
  DLPROBE_ASSIGN_OR_RETURN(const json* settings, member(v, path, "settings"));
  DLPROBE_RETURN_IF_ERROR(
      convert_settings(*settings, join_path(path, "settings"), out.kind, out.settings));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "status", out.status));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "error", out.error));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "statistics", out.statistics));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "samples", out.samples));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "memory", out.memory));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "telemetry", out.telemetry));
  DLPROBE_RETURN_IF_ERROR(field(v, path, "compute", out.compute));
  return field(v, path, "findings", out.findings);
}

}  // namespace

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
  DLPROBE_RETURN_IF_ERROR(field(v, "", "context", document.context));
  DLPROBE_RETURN_IF_ERROR(field(v, "", "configurations", document.configurations));
  DLPROBE_RETURN_IF_ERROR(field(v, "", "findings", document.findings));
  return document;
}

Result<Document> parse(std::string_view text, std::string_view name) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return invalid_argument(fmt::format("{}: empty file, not dlprobe results", name));
  }
  json v;
  // nlohmann reports the position of a syntax error only through its exception; it is caught here
  // and never leaves the library.
  try {
    v = json::parse(text);
  } catch (const json::parse_error& e) {
    // The parser reports one past the end when the input stopped in the middle of a value.
    const bool truncated = e.byte > text.size();
    return invalid_argument(
        fmt::format("{}: {} at byte {}", name,
                    truncated ? "truncated JSON (the file ends early)" : "invalid JSON", e.byte));
  }
  auto document = from_json(v);
  if (!document) return document.status().with_context(name);
  return document;
}

Result<Document> read_file(const std::filesystem::path& path) {
  DLPROBE_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  return parse(text, path.string());
}

}  // namespace dlprobe::results
