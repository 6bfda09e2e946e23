// Convolution forward on the CPU backend (oneDNN) for ResNet-50 layer shapes at a small batch, in
// both layouts: the primitive is created before timing, so this is the steady-state cost per call
// the engine pays, including the weights reorder into oneDNN's blocked layout.
#include <benchmark/benchmark.h>

#include <array>
#include <memory>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/engine/cpu_backend.h"

namespace {

using namespace dlprobe;

struct ConvShape {
  const char* name;
  Shape x;
  Shape w;
  Conv2dParams p;
};

// Batch 2: what a 2-core CI machine measures in a reasonable time.
const std::array<ConvShape, 3> kShapes = {{
    {"layer1.0.conv2 3x3 64->64 56x56",
     {2, 64, 56, 56},
     {64, 64, 3, 3},
     {{1, 1}, {1, 1}, {1, 1}, 1}},
    {"layer3.0.conv1 1x1 512->256 28x28", {2, 512, 28, 28}, {256, 512, 1, 1}, {}},
    {"layer4.0.conv2 3x3/2 512->512 14x14",
     {2, 512, 14, 14},
     {512, 512, 3, 3},
     {{2, 2}, {1, 1}, {1, 1}, 1}},
}};

void BM_CpuConvForward(benchmark::State& state) {
  const ConvShape& c = kShapes[static_cast<std::size_t>(state.range(0))];
  const Layout layout = state.range(1) != 0 ? Layout::nhwc : Layout::nchw;
  auto allocator =
      memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
  auto backend = make_cpu_backend(*allocator);
  if (!backend.has_value()) {
    state.SkipWithError(backend.status().message().c_str());
    return;
  }
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
  HostTensor x = HostTensor::random(TensorDesc::make(c.x, DType::fp32, layout).value(), 1);
  HostTensor w = HostTensor::random(TensorDesc::make(c.w, DType::fp32, layout).value(), 2);
  HostTensor y(TensorDesc::make(ys, DType::fp32, layout).value());
  // First call creates and caches the primitive.
  Status s = (*backend)->conv2d_forward(x.view(), w.view(), y.view(), c.p);
  if (!s.is_ok()) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  for (auto _ : state) {
    s = (*backend)->conv2d_forward(x.view(), w.view(), y.view(), c.p);
    benchmark::DoNotOptimize(y.data());
  }
  if (!s.is_ok()) state.SkipWithError(s.message().c_str());
  const double flops = 2.0 * static_cast<double>(ys.numel() * c.w[1] * c.w[2] * c.w[3]);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(c.name) + " " + std::string(layout_name(layout)));
}
BENCHMARK(BM_CpuConvForward)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->ArgNames({"shape", "nhwc"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
