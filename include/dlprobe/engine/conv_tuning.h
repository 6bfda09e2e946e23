// The convolution tuning cache: which cuDNN engine autotuning chose for each convolution shape,
// kept in memory and optionally in a JSON file, so that a later process on the same GPU and cuDNN
// builds the chosen plan directly instead of timing every candidate again. Like XLA's autotune
// cache directory; PyTorch's cudnn.benchmark keeps its choices for the process only. The plans of
// fused graphs (a convolution with batch norm inside) are kept whole, as cuDNN serializes them,
// so that a later process loads them instead of querying the heuristics and building candidates.
//
// Two runs that share a cache run the same engines, so a comparison between them measures the
// environment and not which engine each run's timing noise happened to favour.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe {

// How convolution engines are chosen, once per shape (the plan is cached and reused).
enum class ConvEngineChoice : std::uint8_t {
  heuristic,   // cuDNN's first-ranked engine that fits the workspace limit
  autotune,    // time every engine cuDNN's heuristics list on the real buffers, keep the fastest
               // (or the fastest without workspace, where within 3 % of it)
  exhaustive,  // also every other engine cuDNN has for the shape, within a time budget per shape
};
constexpr std::string_view conv_engine_choice_name(ConvEngineChoice choice) {
  switch (choice) {
    case ConvEngineChoice::heuristic:
      return "heuristic";
    case ConvEngineChoice::autotune:
      return "autotune";
    case ConvEngineChoice::exhaustive:
      return "exhaustive";
  }
  return "?";
}

// One knob choice of a cuDNN engine configuration: the knob's type and its value.
struct ConvKnob {
  std::int64_t type = 0;
  std::int64_t value = 0;
  friend bool operator==(const ConvKnob&, const ConvKnob&) = default;
};

// The CUDA backend also keeps here, under keys that name "prologue route", which way a call with a
// batch norm's apply before its convolution ran faster: engine 0 for cuDNN's fused graph, 1 for
// dlprobe's pass (no knobs, no plan; ms the winner's time).
struct ConvTuningEntry {
  std::int64_t engine = -1;          // cuDNN's global engine index
  std::vector<ConvKnob> knobs;       // its configuration's knob choices
  std::string label;                 // "eng<index> [notes] {knobs}", for logs
  double ms = 0;                     // its time when it was chosen
  std::int64_t workspace_bytes = 0;  // what its plan asked for
  // cuDNN's serialized plan of a fused graph (a convolution with batch norm inside): the operation
  // graph and the engine configuration; empty for a choice rebuilt from engine and knobs.
  std::string plan;
};

class ConvTuningCache {
 public:
  // In memory only: choices live as long as the cache.
  ConvTuningCache() = default;
  // Backed by `path`: a missing file is created empty (so a path that cannot be written fails
  // here); a file that is not a tuning cache (or of another schema version) is an error naming
  // it.
  static Result<std::shared_ptr<ConvTuningCache>> open(std::filesystem::path path);

  // `key` names the GPU, the cuDNN version, the tuning mode and the convolution (the CUDA
  // backend builds it); nothing else is assumed about it.
  std::optional<ConvTuningEntry> find(const std::string& key) const;
  // Keeps the choice and, with a file, rewrites it at once (atomically), so choices made before
  // a crash or Ctrl-C are kept. The entry is kept in memory even when the write fails.
  Status record(const std::string& key, ConvTuningEntry entry);
  // Drops a choice that no longer builds (another cuDNN under the same version string).
  void forget(const std::string& key);

  std::size_t size() const;
  const std::optional<std::filesystem::path>& path() const { return path_; }

  // The file's text for these entries, and its parser (errors name `source`).
  static std::string serialize(const std::map<std::string, ConvTuningEntry>& entries);
  static Result<std::map<std::string, ConvTuningEntry>> parse(std::string_view text,
                                                              std::string_view source);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, ConvTuningEntry> entries_;
  std::optional<std::filesystem::path> path_;
};

}  // namespace dlprobe
