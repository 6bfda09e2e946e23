// The fastest way the engine knows to run a step on a kind of device, as measured
// (docs/performance.md, docs/cpu-backend.md): what `dlprobe bench` and `dlprobe evaluate` run
// unless told otherwise.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/step/step_config.h"

namespace dlprobe::device {

struct FastestSettings {
  Layout layout = Layout::nchw;
  bool planned = false;  // engine::MemoryPlan::planned: one arena laid out from the lifetimes
  bool graph = false;    // StepConfig::graph: the step recorded once and replayed
  // StepConfig::streams 2 at batches up to this one where the arena is planned, else 1.
  std::int64_t two_streams_up_to = 0;
  // Above two_streams_up_to: 2 streams too, with StepConfig::stream_lag this (0: 1 stream there).
  std::int64_t stream_lag_above = 0;
};

// A pure function of what it is given, so that a test pins every default.
// Every step mode takes the same settings (a training step replays as a graph too).
FastestSettings fastest_settings(DeviceKind device, engine::Precision precision);

// The values an open choice took, each with what it was taken for, for the line that tells the
// user what was picked: add("nhwc", "fp16"), add("nchw", "fp32").
class Picks {
 public:
  void add(std::string_view value, std::string_view what);
  bool empty() const { return picks_.empty(); }
  // "nhwc" when every configuration took the same; else "nchw for fp32 and nhwc for fp16/bf16".
  std::string text() const;

 private:
  std::vector<std::pair<std::string, std::vector<std::string>>> picks_;
};

// A layout as `--layout` spells it.
std::string_view layout_flag(Layout layout);

}  // namespace dlprobe::device
