// The defaults `dlprobe bench` and `dlprobe evaluate` run, pinned for every device kind and
// precision (every step mode takes the same): a change here is a change of what users measure, and
// must be one on purpose.
#include <gtest/gtest.h>

#include <string>

#include "dlprobe/device/fastest_settings.h"

namespace dlprobe::device {
namespace {

using engine::Precision;

TEST(FastestSettings, EveryDeviceAndPrecision) {
  struct Case {
    DeviceKind device;
    Precision precision;
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
      // every step mode (training's loss scale and step count are read on the device).
      {gpu, Precision::fp32, nchw, true, true},
      {gpu, Precision::tf32, nhwc, true, true},
      {gpu, Precision::fp16, nhwc, true, true},
      {gpu, Precision::bf16, nhwc, true, true},
      {gpu, Precision::fp64, nchw, true, true},
      // CPU: NHWC, memory as it grows, eager steps.
      {cpu, Precision::fp32, nhwc, false, false},
      {cpu, Precision::tf32, nhwc, false, false},
      {cpu, Precision::fp16, nhwc, false, false},
      {cpu, Precision::bf16, nhwc, false, false},
      {cpu, Precision::fp64, nhwc, false, false},
  };
  for (const Case& c : cases) {
    const FastestSettings s = fastest_settings(c.device, c.precision);
    const std::string what = std::string(c.device == gpu ? "cuda " : "cpu ") +
                             std::string(engine::precision_name(c.precision));
    EXPECT_EQ(s.layout, c.layout) << what;
    EXPECT_EQ(s.planned, c.planned) << what;
    EXPECT_EQ(s.graph, c.graph) << what;
    // The weight gradients beside the rest on a GPU in fp16, bf16 and tf32, the precisions it was
    // measured in, unbounded at small batches and 16 calls behind at most above; the CPU backends
    // have one stream.
    const bool two =
        c.device == gpu && (c.precision == Precision::fp16 || c.precision == Precision::bf16 ||
                            c.precision == Precision::tf32);
    EXPECT_EQ(s.two_streams_up_to, two ? 128 : 0) << what;
    EXPECT_EQ(s.stream_lag_above, two ? 16 : 0) << what;
  }
}

}  // namespace
}  // namespace dlprobe::device
