#include "dlprobe/engine/conv_tuning.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "dlprobe/core/files.h"
#include "dlprobe/core/json_text.h"
#include "dlprobe/core/log.h"

namespace dlprobe {
namespace {

constexpr std::string_view kSchema = "dlprobe.conv-tuning";
// Version 2: version 1 files were written without the configurations' knob choices (read_knobs
// read none), and replaying them ran engines at their defaults, so they are refused.
constexpr int kVersion = 2;
// A cache holds a few hundred bytes per convolution shape and about 5 KB per fused graph's plan
// (ResNet-50 at one batch: 160 KB), far below this; the bound
// keeps a path that never ends (/dev/zero) or a wrong, huge file from taking all the memory.
constexpr std::uint64_t kMaxFileBytes = std::uint64_t{64} << 20;

}  // namespace

Result<std::shared_ptr<ConvTuningCache>> ConvTuningCache::open(std::filesystem::path path) {
  auto cache = std::make_shared<ConvTuningCache>();
  auto text = read_whole_file(path, kMaxFileBytes);
  if (text) {
    DLPROBE_ASSIGN_OR_RETURN(cache->entries_, parse(*text, path.string()));
  } else if (text.status().code() == Errc::not_found) {
    // Written at once, empty, so that a path that cannot be written fails before any tuning.
    DLPROBE_RETURN_IF_ERROR(write_file_atomic(path, serialize({})));
  } else {
    return text.status();
  }
  cache->path_ = std::move(path);
  return cache;
}

std::optional<ConvTuningEntry> ConvTuningCache::find(const std::string& key) const {
  const std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

Status ConvTuningCache::record(const std::string& key, ConvTuningEntry entry) {
  const std::lock_guard lock(mutex_);
  entries_[key] = std::move(entry);
  if (!path_) return Status::ok();
  std::string text = serialize(entries_);
  if (text.size() > kMaxFileBytes) {
    // A file past the bound could not be opened again. The kept plans only save start-up time
    // (each can be built again from its graph), so they go, and the engine choices stay.
    log_warn("tuning cache {}: past {} MiB; the fused graphs' kept plans are dropped",
             path_->string(), kMaxFileBytes >> 20);
    for (auto& [k, e] : entries_) e.plan.clear();
    text = serialize(entries_);
  }
  return write_file_atomic(*path_, text).with_context("tuning cache");
}

void ConvTuningCache::forget(const std::string& key) {
  const std::lock_guard lock(mutex_);
  entries_.erase(key);
}

std::size_t ConvTuningCache::size() const {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

std::string ConvTuningCache::serialize(const std::map<std::string, ConvTuningEntry>& entries) {
  nlohmann::json j;
  j["schema"] = kSchema;
  j["version"] = kVersion;
  nlohmann::json& out = j["entries"];
  out = nlohmann::json::object();
  for (const auto& [key, e] : entries) {
    nlohmann::json knobs = nlohmann::json::array();
    for (const ConvKnob& k : e.knobs) knobs.push_back({k.type, k.value});
    out[key] = {{"engine", e.engine},
                {"knobs", knobs},
                {"label", e.label},
                {"ms", e.ms},
                {"workspace_bytes", e.workspace_bytes}};
    if (!e.plan.empty()) out[key]["plan"] = e.plan;
  }
  // cuDNN's serialized plans are JSON text; should one ever hold bytes that are not UTF-8, they
  // are replaced rather than thrown on: such a plan then fails to load and is built again.
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<std::map<std::string, ConvTuningEntry>> ConvTuningCache::parse(std::string_view text,
                                                                      std::string_view source) {
  auto bad = [&](std::string_view what) {
    return invalid_argument(fmt::format(
        "{}: not a dlprobe tuning cache: {} (name a new file to start one; this one is kept)",
        source, what));
  };
  const Result<nlohmann::json> parsed = parse_json(text);
  if (!parsed) return bad(parsed.status().message());
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("schema") || j["schema"] != kSchema) {
    return bad(fmt::format("no \"schema\": \"{}\"", kSchema));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    return bad(fmt::format("schema version {} expected", kVersion));
  }
  if (!j.contains("entries") || !j["entries"].is_object()) return bad("no \"entries\" object");
  std::map<std::string, ConvTuningEntry> entries;
  for (const auto& [key, v] : j["entries"].items()) {
    // An unsigned value past int64's range would wrap to a negative knob.
    const auto int64 = [](const nlohmann::json& x) {
      return x.is_number_integer() &&
             !(x.is_number_unsigned() &&
               x.get<std::uint64_t>() >
                   static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
    };
    const auto pair_of_ints = [&](const nlohmann::json& k) {
      return k.is_array() && k.size() == 2 && int64(k[0]) && int64(k[1]);
    };
    const bool ok =
        v.is_object() && v.contains("engine") && v["engine"].is_number_integer() &&
        v["engine"].get<std::int64_t>() >= 0 && v.contains("knobs") && v["knobs"].is_array() &&
        std::all_of(v["knobs"].begin(), v["knobs"].end(), pair_of_ints) && v.contains("label") &&
        v["label"].is_string() && v.contains("ms") && v["ms"].is_number() &&
        v["ms"].get<double>() >= 0 && v.contains("workspace_bytes") &&
        v["workspace_bytes"].is_number_integer() && v["workspace_bytes"].get<std::int64_t>() >= 0 &&
        (!v.contains("plan") || v["plan"].is_string());
    if (!ok) {
      return bad(
          fmt::format("entry \"{}\" needs engine >= 0, knobs as [type, value] pairs, "
                      "label, ms >= 0, workspace_bytes >= 0 and, if any, a plan as text",
                      key));
    }
    ConvTuningEntry e;
    e.engine = v["engine"].get<std::int64_t>();
    for (const auto& k : v["knobs"]) {
      e.knobs.push_back({k[0].get<std::int64_t>(), k[1].get<std::int64_t>()});
    }
    e.label = v["label"].get<std::string>();
    e.ms = v["ms"].get<double>();
    e.workspace_bytes = v["workspace_bytes"].get<std::int64_t>();
    if (v.contains("plan")) e.plan = v["plan"].get<std::string>();
    entries[key] = std::move(e);
  }
  return entries;
}

}  // namespace dlprobe
