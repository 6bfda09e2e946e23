// ResNet-50's stem convolution (7x7, stride 2, 3 -> 64 channels, fp16 NHWC, batch 256) under every
// cuDNN engine that takes it, with the engine's default knobs: the image's three channels as they
// are and padded to four channels, with the engines bench's default policy allows
// (--conv-engines any: also non-deterministic and reduced-precision ones) and with deterministic
// ones that keep their sums in fp32.
// Forward and weight gradient. The heuristics' lists leave engines out, and the backend's
// autotuning keeps some last (those that compile at plan time): this times each engine by index, so
// that none is missed. Each figure is the mean of a run of calls timed with CUDA events.
//   bench_stem_conv_gpu --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlprobe/engine/tensor.h"
#include "engine/backends/cuda/cudnn_graph.h"

namespace dlprobe {
namespace {

constexpr std::int64_t kBatch = 256;
constexpr std::int64_t kImage = 224;
constexpr std::int64_t kOut = 112;
constexpr std::int64_t kFeatures = 64;
constexpr std::int64_t kKernel = 7;
constexpr std::int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// Well above any engine a ResNet-50 step keeps (256 MiB), so that none is left out for it.
constexpr std::int64_t kMaxWorkspace = std::int64_t{1} << 30;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench_stem_conv_gpu: %s\n", what.c_str());
  std::exit(2);
}

struct Gpu {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  void* x = nullptr;  // the images: [N, 4, 224, 224] fp16, the three-channel views share it
  void* w = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
};

// fp16 operands uniform in [lo, hi] (random, as a step's: constants can let the tensor cores draw
// less power and clock higher).
void* upload(std::int64_t elements, double lo, double hi, std::uint64_t seed) {
  const TensorDesc d = TensorDesc::make(Shape{elements}, DType::fp16).value();
  const HostTensor host = HostTensor::random(d, seed, lo, hi);
  void* p = nullptr;
  if (cudaMalloc(&p, d.bytes()) != cudaSuccess ||
      cudaMemcpy(p, host.data(), d.bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
    fail("cannot allocate or fill a device buffer");
  }
  return p;
}

Gpu& gpu() {
  static Gpu g = [] {
    Gpu made;
    if (cudnnCreate(&made.handle) != CUDNN_STATUS_SUCCESS) fail("cudnnCreate failed (no GPU?)");
    if (cudaStreamCreate(&made.stream) != cudaSuccess ||
        cudnnSetStream(made.handle, made.stream) != CUDNN_STATUS_SUCCESS ||
        cudaEventCreate(&made.start) != cudaSuccess || cudaEventCreate(&made.stop) != cudaSuccess ||
        cudaMalloc(&made.workspace, static_cast<std::size_t>(kMaxWorkspace)) != cudaSuccess) {
      fail("cannot set up the stream, events and workspace");
    }
    made.x = upload(kBatch * 4 * kImage * kImage, -2, 2, 1);
    made.w = upload(kFeatures * 4 * kKernel * kKernel, -0.05, 0.05, 2);
    made.y = upload(kBatch * kFeatures * kOut * kOut, -1, 1, 3);
    return made;
  }();
  return g;
}

// An NHWC fp16 tensor of cuDNN's graph: dims in N, C, H, W order, channels innermost.
cuda::TensorSpec nhwc(std::int64_t uid, std::int64_t n, std::int64_t c, std::int64_t h,
                      std::int64_t alignment) {
  cuda::TensorSpec t;
  t.uid = uid;
  t.dtype = CUDNN_DATA_HALF;
  t.dims = {n, c, h, h};
  t.strides = {c * h * h, 1, h * c, c};
  t.alignment = alignment;
  return t;
}

cuda::ConvSpec stem(cuda::ConvDirection direction, std::int64_t channels, std::int64_t alignment) {
  cuda::ConvSpec s;
  s.direction = direction;
  s.x = nhwc(kUidX, kBatch, channels, kImage, alignment);
  s.w = nhwc(kUidW, kFeatures, channels, kKernel, alignment);
  s.y = nhwc(kUidY, kBatch, kFeatures, kOut, alignment);
  s.pad[0] = s.pad[1] = 3;
  s.stride[0] = s.stride[1] = 2;
  s.compute = CUDNN_DATA_FLOAT;
  return s;
}

void time_plan(benchmark::State& state, const cuda::ExecutionPlan* plan) {
  Gpu& g = gpu();
  const std::array<std::int64_t, 3> uids = {kUidX, kUidW, kUidY};
  const std::array<void*, 3> ptrs = {g.x, g.w, g.y};
  auto run = [&](int calls) -> Result<float> {
    if (cudaEventRecord(g.start, g.stream) != cudaSuccess) {
      return error(Errc::internal, "cudaEventRecord failed");
    }
    for (int i = 0; i < calls; ++i) {
      DLPROBE_RETURN_IF_ERROR(cuda::execute_plan(g.handle, *plan, uids, ptrs, g.workspace));
    }
    float ms = 0;
    if (cudaEventRecord(g.stop, g.stream) != cudaSuccess ||
        cudaEventSynchronize(g.stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, g.start, g.stop) != cudaSuccess) {
      return error(Errc::internal, "the timed calls failed on the GPU");
    }
    return ms / static_cast<float>(calls);
  };
  if (auto first = run(1); !first) {  // loads the kernel's module
    state.SkipWithError(first.status().message().c_str());
    return;
  }
  for (auto _ : state) {
    auto ms = run(5);
    if (!ms) {
      state.SkipWithError(ms.status().message().c_str());
      return;
    }
    state.SetIterationTime(*ms / 1e3);
  }
  state.SetLabel(fmt::format("{} ws {} MiB", plan->engine_name, plan->workspace_bytes >> 20));
}

// Every engine index cuDNN has that builds a plan for the variant, one benchmark each. Plans live
// to the end of the run.
void register_all() {
  static std::vector<std::unique_ptr<cuda::ExecutionPlan>> plans;
  struct Variant {
    const char* name;
    std::int64_t channels, alignment;
    // As bench's --conv-engines any: non-deterministic, FFT, Winograd and reduced-precision
    // reduction engines too.
    bool any;
  };
  for (const auto direction :
       {cuda::ConvDirection::forward, cuda::ConvDirection::backward_filter}) {
    for (const Variant v :
         {Variant{"c3_align16", 3, 16, false}, Variant{"c3_align16_any", 3, 16, true},
          Variant{"c4_align16", 4, 16, false}, Variant{"c4_align16_any", 4, 16, true}}) {
      cuda::ConvSpec spec = stem(direction, v.channels, v.alignment);
      spec.deterministic = !v.any;
      spec.allow_transforms = v.any;
      spec.allow_reduced_precision = v.any;
      auto engines = cuda::conv_engine_count(gpu().handle, spec);
      if (!engines) fail(engines.status().message());
      for (std::int64_t engine = 0; engine < *engines; ++engine) {
        auto plan = cuda::build_conv_plan_for_engine(gpu().handle, spec, engine, {}, kMaxWorkspace);
        if (!plan) {
          // Why each engine is left out: it does not take the graph, the policy rules it out
          // (its numerical notes), or it needs more workspace.
          std::fprintf(stderr, "%s: %s\n", v.name, plan.status().message().c_str());
          continue;
        }
        plans.push_back(std::make_unique<cuda::ExecutionPlan>(std::move(*plan)));
        const std::string name = fmt::format(
            "stem_{}/{}/eng{}", direction == cuda::ConvDirection::forward ? "fwd" : "wgrad", v.name,
            engine);
        benchmark::RegisterBenchmark(
            name.c_str(), [p = plans.back().get()](benchmark::State& st) { time_plan(st, p); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.05);
      }
    }
  }
}

}  // namespace
}  // namespace dlprobe

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  dlprobe::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
