// memory.analysis in the results file: the layout docs/results-schema.md describes.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>

#include "dlprobe/core/json_optional.h"
#include "dlprobe/memory/analysis_json.h"
#include "dlprobe/results/results.h"

namespace dlprobe::memory {
namespace {

using nlohmann::json;

json by_category_json(const CategoryBytes& bytes) {
  json j = json::object();
  for (Category c : kAllCategories) {
    j[std::string(category_name(c))] = bytes[static_cast<std::size_t>(c)];
  }
  return j;
}

json moment_json(const MemoryMoment& m) {
  return {{"allocated_bytes", m.allocated_bytes},
          {"requested_bytes", m.requested_bytes},
          {"waste_bytes", m.waste_bytes()},
          {"reserved_bytes", m.reserved_bytes},
          {"largest_free_block_bytes", m.largest_free_block_bytes},
          {"fragmentation", m.fragmentation()},
          {"by_category", by_category_json(m.by_category)}};
}

// Column-wise, so a few hundred points stay a few kilobytes per category.
json timeline_json(const std::vector<LayerVisit>& visits) {
  json layer = json::array();
  json phase = json::array();
  json first = json::array();
  json last = json::array();
  json allocated = json::array();
  json by_category = json::object();
  for (Category c : kAllCategories) by_category[std::string(category_name(c))] = json::array();
  for (const LayerVisit& v : visits) {
    layer.push_back(v.layer);
    phase.push_back(std::string(phase_name(v.phase)));
    first.push_back(v.first_call);
    last.push_back(v.last_call);
    allocated.push_back(v.high.allocated_bytes);
    for (Category c : kAllCategories) {
      by_category[std::string(category_name(c))].push_back(v.high[c]);
    }
  }
  return {{"layer", layer},
          {"phase", phase},
          {"first_call", first},
          {"last_call", last},
          {"allocated_bytes", allocated},
          {"by_category", by_category}};
}

template <class T>
Status read(const json& j, std::string_view path, std::string_view key, T& out) {
  const auto it = j.find(key);
  if (it == j.end()) return invalid_argument(fmt::format("{}: missing field \"{}\"", path, key));
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string())
      return invalid_argument(fmt::format("{}.{}: expected a string", path, key));
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) {
      return invalid_argument(fmt::format("{}.{}: expected true or false", path, key));
    }
  } else {
    if (!it->is_number_integer()) {
      return invalid_argument(fmt::format("{}.{}: expected an integer", path, key));
    }
  }
  out = it->get<T>();
  return Status::ok();
}

// The calibration's fields that go to the file as they are, written and read in this order.
template <class C, class Visit>
void plain_fields(C& c, Visit visit) {
  visit("device", c.device);
  visit("model", c.model);
  visit("precision", c.precision);
  visit("batch", c.batch);
  visit("workspace_bytes", c.workspace_bytes);
  visit("workspace_held_bytes", c.workspace_held_bytes);
  visit("calls", c.calls);
}

}  // namespace

json to_json(const ArenaMoment& a) {
  return {{"call", a.call},
          {"call_name", a.call_name},
          {"layer", a.layer},
          {"phase", std::string(phase_name(a.phase))},
          {"block_bytes", a.block_bytes()},
          {"live_bytes", a.live_bytes()},
          {"live_by_category", by_category_json(a.live)},
          {"live_gradient_bytes", a.gradient_bytes},
          {"free_bytes", a.free_bytes},
          {"largest_free_bytes", a.largest_free_bytes},
          {"allocated_bytes", a.allocated_bytes}};
}

json to_json(const StepMemory& m) {
  json arena = nullptr;
  if (m.arena) {
    arena = {{"bytes", m.arena->bytes},
             {"peak_live_bytes", m.arena->peak_live_bytes},
             {"at_peak", m.arena_at_peak ? to_json(*m.arena_at_peak) : json(nullptr)},
             {"fullest", m.arena_fullest ? to_json(*m.arena_fullest) : json(nullptr)}};
  }
  return {{"peak", moment_json(m.peak)},
          {"peak_call", m.peak_call},
          {"peak_call_name", m.peak_call_name},
          {"peak_layer", m.peak_layer},
          {"peak_phase", std::string(phase_name(m.peak_phase))},
          {"workspace_peak_bytes", m.workspace_peak_bytes},
          {"reserved_peak_bytes", m.reserved_peak_bytes},
          {"events", m.events},
          {"arena", arena},
          {"timeline", timeline_json(m.timeline)}};
}

json to_json(const Calibration& c) {
  json by_call = json::array();
  for (const auto& [call, bytes] : c.workspace_by_call) by_call.push_back({call, bytes});
  json j = json::object();
  plain_fields(c, [&j](const char* key, const auto& value) { j[key] = value; });
  j["fused"] = c.fused;
  j["fused_conv"] = c.fused_conv;
  j["recomputed_pool"] = c.recomputed_pool;
  j["fused_pool_backward"] = c.fused_pool_backward;
  j["workspace_by_call"] = std::move(by_call);
  j["outside_allocator_bytes"] = c.outside_allocator_bytes;
  return j;
}

json to_json(const Reconciliation& r) {
  return {{"allocated_peak_bytes", r.allocated_peak_bytes},
          {"workspace_peak_bytes", r.workspace_peak_bytes},
          {"reserved_bytes", r.reserved_bytes},
          {"context_bytes", r.context_bytes},
          {"lazy_bytes", r.lazy_bytes()},
          {"nvml_process_bytes", r.nvml_process_bytes},
          {"nvml_source", r.nvml_source}};
}

json to_json(const Prediction& p) {
  json j = to_json(p.step);
  j["workspace_bytes"] = p.workspace_bytes;
  j["workspace_model"] = p.workspace_model;
  j["outside_allocator_bytes"] = p.outside_allocator_bytes;
  j["process_bytes"] = p.process_bytes();
  return j;
}

json to_json(const MaxBatchResult& r) {
  json trials = json::array();
  for (const MaxBatchTrial& t : r.trials) {
    trials.push_back({{"batch", t.batch},
                      {"fits", t.fits},
                      {"why", t.why},
                      {"peak_allocated_bytes", t.peak_allocated_bytes},
                      {"reserved_peak_bytes", t.reserved_peak_bytes},
                      {"nvml_process_bytes", t.nvml_process_bytes}});
  }
  return {{"limit_bytes", r.limit_bytes},
          {"predicted", r.predicted},
          {"found", r.found},
          {"next_fails", r.next_fails},
          {"trials", trials}};
}

json to_json(const AnalysisRecord& r) {
  json j = {{"gpu_memory", r.gpu_memory}, {"memory_plan", r.memory_plan}};
  j["measured"] = r.measured != nullptr ? to_json(r.measured->memory) : json(nullptr);
  j["reconciliation"] = r.measured != nullptr && r.measured->reconciliation
                            ? to_json(*r.measured->reconciliation)
                            : json(nullptr);
  // What this run measured, for predictions elsewhere (dlprobe memory --calibration FILE).
  j["calibration"] = r.measured != nullptr ? to_json(r.measured->calibration) : json(nullptr);
  j["predicted"] = r.predicted != nullptr ? to_json(*r.predicted) : json(nullptr);
  // Beside a measurement the predicted timeline would double the file for little: it is the
  // measured one without the backend's transient scratch.
  if (r.measured != nullptr && r.predicted != nullptr) j["predicted"]["timeline"] = nullptr;
  j["prediction_calibration"] = r.calibration != nullptr ? to_json(*r.calibration) : json(nullptr);
  j["max_batch"] = r.max_batch != nullptr ? to_json(*r.max_batch) : json(nullptr);
  return j;
}

namespace {

// A calibration's figures within what a device can hold, so that the predictions' sums of them
// cannot overflow, and its per-call list one entry a call, each within the step's calls: a file
// edited by hand is refused here rather than predicted from.
Status check_ranges(const Calibration& c, std::string_view path) {
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 50;  // 1 PiB, past any device's memory
  constexpr std::size_t kMaxCalls = 10'000'000;
  const auto bytes = [&](std::string_view key, std::int64_t v, std::int64_t least) -> Status {
    if (v < least || v > kMaxBytes) {
      return invalid_argument(fmt::format("{}.{}: {} is out of range ({} to {} bytes)", path, key,
                                          v, least, kMaxBytes));
    }
    return Status::ok();
  };
  if (c.batch < 1 || c.batch > (std::int64_t{1} << 40)) {
    return invalid_argument(fmt::format("{}.batch: {} is not a batch size", path, c.batch));
  }
  DLPROBE_RETURN_IF_ERROR(bytes("workspace_bytes", c.workspace_bytes, 0));
  DLPROBE_RETURN_IF_ERROR(bytes("workspace_held_bytes", c.workspace_held_bytes, 0));
  // What was held at every call is part of the most held at one moment.
  if (c.workspace_held_bytes > c.workspace_bytes) {
    return invalid_argument(
        fmt::format("{}.workspace_held_bytes: {} is above workspace_bytes ({}), the most held",
                    path, c.workspace_held_bytes, c.workspace_bytes));
  }
  // NVML's figure less the allocator's, each read at its own moment: it may come out below 0, by
  // what the allocator took between the two readings (a CUDA context alone is some 500 MB, so a
  // GiB below 0 is no reading of one).
  if (c.outside_allocator_bytes) {
    DLPROBE_RETURN_IF_ERROR(
        bytes("outside_allocator_bytes", *c.outside_allocator_bytes, -(std::int64_t{1} << 30)));
  }
  if (c.calls < 1 || c.calls > kMaxCalls) {
    return invalid_argument(
        fmt::format("{}.calls: {} is out of range (1 to {})", path, c.calls, kMaxCalls));
  }
  std::set<std::size_t> seen;
  for (const auto& [call, taken] : c.workspace_by_call) {
    if (call >= c.calls || !seen.insert(call).second) {
      return invalid_argument(
          fmt::format("{}.workspace_by_call: call {} is {} (the step has {} calls)", path, call,
                      call >= c.calls ? "past the step's last" : "listed twice", c.calls));
    }
    DLPROBE_RETURN_IF_ERROR(bytes("workspace_by_call", taken, 0));
  }
  return Status::ok();
}

}  // namespace

Result<Calibration> calibration_from_json(const json& j, std::string_view path) {
  if (!j.is_object()) return invalid_argument(fmt::format("{}: expected an object", path));
  Calibration c;
  Status s;
  plain_fields(c, [&](const char* key, auto& value) {
    if (s.is_ok()) s = read(j, path, key, value);
  });
  DLPROBE_RETURN_IF_ERROR(s);
  // Added after the first calibrations were written, which came from fusing backends.
  if (j.contains("fused")) DLPROBE_RETURN_IF_ERROR(read(j, path, "fused", c.fused));
  if (j.contains("fused_conv")) DLPROBE_RETURN_IF_ERROR(read(j, path, "fused_conv", c.fused_conv));
  c.recomputed_pool = false;
  if (j.contains("recomputed_pool")) {
    DLPROBE_RETURN_IF_ERROR(read(j, path, "recomputed_pool", c.recomputed_pool));
  }
  if (j.contains("fused_pool_backward")) {
    DLPROBE_RETURN_IF_ERROR(read(j, path, "fused_pool_backward", c.fused_pool_backward));
  }
  const auto by_call = j.find("workspace_by_call");
  if (by_call == j.end() || !by_call->is_array()) {
    return invalid_argument(fmt::format("{}.workspace_by_call: expected an array", path));
  }
  for (const json& entry : *by_call) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_unsigned() ||
        !entry[1].is_number_integer()) {
      return invalid_argument(
          fmt::format("{}.workspace_by_call: expected [call, bytes] pairs", path));
    }
    c.workspace_by_call.emplace_back(entry[0].get<std::size_t>(), entry[1].get<std::int64_t>());
  }
  const auto outside = j.find("outside_allocator_bytes");
  if (outside == j.end()) {
    return invalid_argument(fmt::format("{}: missing field \"outside_allocator_bytes\"", path));
  }
  if (!outside->is_null()) {
    if (!outside->is_number_integer()) {
      return invalid_argument(
          fmt::format("{}.outside_allocator_bytes: expected an integer or null", path));
    }
    c.outside_allocator_bytes = outside->get<std::int64_t>();
  }
  DLPROBE_RETURN_IF_ERROR(check_ranges(c, path));
  return c;
}

Result<std::vector<Calibration>> read_calibrations(const std::string& path) {
  DLPROBE_ASSIGN_OR_RETURN(results::Document d, results::read_file(path));
  std::vector<Calibration> out;
  for (std::size_t i = 0; i < d.configurations.size(); ++i) {
    const auto& m = d.configurations[i].memory;
    if (!m || !m->analysis.is_object()) continue;
    const auto it = m->analysis.find("calibration");
    if (it == m->analysis.end() || it->is_null()) continue;
    DLPROBE_ASSIGN_OR_RETURN(
        Calibration c,
        calibration_from_json(
            *it, fmt::format("{}: configurations[{}].memory.analysis.calibration", path, i)));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace dlprobe::memory
