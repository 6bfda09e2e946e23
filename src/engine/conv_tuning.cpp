#include "dlprobe/conv_tuning.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "dlprobe/files.h"

namespace dlprobe {
namespace {

constexpr std::string_view kSchema = "dlprobe.conv-tuning";
constexpr int kVersion = 1;

}  // namespace

Result<std::shared_ptr<ConvTuningCache>> ConvTuningCache::open(std::filesystem::path path) {
  auto cache = std::make_shared<ConvTuningCache>();
  auto text = read_whole_file(path);
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
  return write_file_atomic(*path_, serialize(entries_)).with_context("tuning cache");
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
    out[key] = {{"engine", e.engine},
                {"label", e.label},
                {"ms", e.ms},
                {"workspace_bytes", e.workspace_bytes}};
  }
  return j.dump(1) + "\n";
}

Result<std::map<std::string, ConvTuningEntry>> ConvTuningCache::parse(std::string_view text,
                                                                      std::string_view source) {
  auto bad = [&](std::string_view what) {
    return invalid_argument(fmt::format("{}: not a dlprobe tuning cache: {}", source, what));
  };
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("invalid JSON");
  if (!j.is_object() || !j.contains("schema") || j["schema"] != kSchema) {
    return bad(fmt::format("no \"schema\": \"{}\"", kSchema));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    return bad(fmt::format("schema version {} expected", kVersion));
  }
  if (!j.contains("entries") || !j["entries"].is_object()) return bad("no \"entries\" object");
  std::map<std::string, ConvTuningEntry> entries;
  for (const auto& [key, v] : j["entries"].items()) {
    const bool ok = v.is_object() && v.contains("engine") && v["engine"].is_number_integer() &&
                    v["engine"].get<std::int64_t>() >= 0 && v.contains("label") &&
                    v["label"].is_string() && v.contains("ms") && v["ms"].is_number() &&
                    v.contains("workspace_bytes") && v["workspace_bytes"].is_number_integer() &&
                    v["workspace_bytes"].get<std::int64_t>() >= 0;
    if (!ok) {
      return bad(
          fmt::format("entry \"{}\" needs engine >= 0, label, ms and workspace_bytes >= 0", key));
    }
    entries[key] = {v["engine"].get<std::int64_t>(), v["label"].get<std::string>(),
                    v["ms"].get<double>(), v["workspace_bytes"].get<std::int64_t>()};
  }
  return entries;
}

}  // namespace dlprobe
