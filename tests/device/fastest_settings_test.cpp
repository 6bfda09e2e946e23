// The defaults `dlprobe bench` and `dlprobe evaluate` run, pinned for every device kind, precision
// and mode: a change here is a change of what users measure, and must be one on purpose.
#include <gtest/gtest.h>

#include <string>

#include "dlprobe/device/fastest_settings.h"

namespace dlprobe::device {
namespace {

using engine::Precision;
using engine::StepMode;

TEST(FastestSettings, EveryDevicePrecisionAndMode) {
  struct Case {
    DeviceKind device;
    Precision precision;
    StepMode mode;
    Layout layout;
    bool planned;
    bool graph;
  };
  constexpr DeviceKind gpu = DeviceKind::cuda;
  constexpr DeviceKind cpu = DeviceKind::cpu;
  constexpr Layout nchw = Layout::nchw;
  constexpr Layout nhwc = Layout::nhwc;
  const Case cases[] = {
      // GPU: tensor-core precisions in NHWC, strict fp32 in NCHW; the planned arena; a graph in
      // every mode (training's loss scale and step count are read on the device).
      {gpu, Precision::fp32, StepMode::train, nchw, true, true},
      {gpu, Precision::fp32, StepMode::grads, nchw, true, true},
      {gpu, Precision::fp32, StepMode::infer, nchw, true, true},
      {gpu, Precision::tf32, StepMode::train, nhwc, true, true},
      {gpu, Precision::tf32, StepMode::grads, nhwc, true, true},
      {gpu, Precision::tf32, StepMode::infer, nhwc, true, true},
      {gpu, Precision::fp16, StepMode::train, nhwc, true, true},
      {gpu, Precision::fp16, StepMode::grads, nhwc, true, true},
      {gpu, Precision::fp16, StepMode::infer, nhwc, true, true},
      {gpu, Precision::bf16, StepMode::train, nhwc, true, true},
      {gpu, Precision::bf16, StepMode::grads, nhwc, true, true},
      {gpu, Precision::bf16, StepMode::infer, nhwc, true, true},
      {gpu, Precision::fp64, StepMode::grads, nchw, true, true},
      // CPU: NHWC, memory as it grows, eager steps.
      {cpu, Precision::fp32, StepMode::train, nhwc, false, false},
      {cpu, Precision::fp32, StepMode::grads, nhwc, false, false},
      {cpu, Precision::fp32, StepMode::infer, nhwc, false, false},
      {cpu, Precision::tf32, StepMode::train, nhwc, false, false},
      {cpu, Precision::tf32, StepMode::grads, nhwc, false, false},
      {cpu, Precision::tf32, StepMode::infer, nhwc, false, false},
      {cpu, Precision::fp16, StepMode::train, nhwc, false, false},
      {cpu, Precision::fp16, StepMode::grads, nhwc, false, false},
      {cpu, Precision::fp16, StepMode::infer, nhwc, false, false},
      {cpu, Precision::bf16, StepMode::train, nhwc, false, false},
      {cpu, Precision::bf16, StepMode::grads, nhwc, false, false},
      {cpu, Precision::bf16, StepMode::infer, nhwc, false, false},
      {cpu, Precision::fp64, StepMode::train, nhwc, false, false},
      {cpu, Precision::fp64, StepMode::grads, nhwc, false, false},
      {cpu, Precision::fp64, StepMode::infer, nhwc, false, false},
  };
  for (const Case& c : cases) {
    const FastestSettings s = fastest_settings(c.device, c.precision);
    const std::string what = std::string(c.device == gpu ? "cuda " : "cpu ") +
                             std::string(engine::precision_name(c.precision)) + " " +
                             std::string(engine::step_mode_name(c.mode));
    EXPECT_EQ(s.layout, c.layout) << what;
    EXPECT_EQ(s.planned, c.planned) << what;
    EXPECT_EQ(s.graph, c.graph) << what;
    // The weight gradients beside the rest on a GPU at small batches in fp16, the precision it was
    // measured in; the CPU backends have one stream.
    EXPECT_EQ(s.two_streams_up_to, c.device == gpu && c.precision == Precision::fp16 ? 128 : 0)
        << what;
  }
}

}  // namespace
}  // namespace dlprobe::device
