// The fastest way the engine knows to run a step on a kind of device, as measured
// (docs/performance.md, docs/cpu-backend.md): what `dlprobe bench` and `dlprobe evaluate` run
// unless told otherwise.
#pragma once

#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/step/step_config.h"

namespace dlprobe::device {

struct FastestSettings {
  Layout layout = Layout::nchw;
  bool planned = false;  // engine::MemoryPlan::planned: one arena laid out from the lifetimes
  bool graph = false;    // StepConfig::graph: the step recorded once and replayed
};

// A pure function of what it is given, so that a test pins every default.
FastestSettings fastest_settings(DeviceKind device, engine::Precision precision,
                                 engine::StepMode mode);

}  // namespace dlprobe::device
