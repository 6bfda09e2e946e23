// What cuDNN's runtime fusion of a batch norm into the convolution after it would save in
// ResNet-50's bottlenecks, shape by shape on the GPU. Forward: the convolution alone; the unfused
// pair the step runs today (dlprobe's batch norm with ReLU: statistics and apply over x, writing
// the normalised copy, then the convolution reading it); the fused graph
// (Backend::conv2d_forward_fused: the apply and ReLU in the convolution's prologue,
// the next batch norm's statistics in its epilogue); and the convolution with only the statistics
// epilogue (the same call without scale and bias, as a block's first convolution would run). Weight
// gradient, whose input a step that keeps only the pre-norm tensor must recompute: the gradient
// alone on the normalised input; the batch norm's apply and ReLU (running statistics) then the
// gradient; and the fused graph (conv2d_backward_weight_fused). Data gradient of a block's first
// convolution, one of the two terms of the previous block output's gradient: the data gradient
// alone; it then the ReLU backward of the two terms' sum (relu_backward_add), as the step runs
// them; and the fused graph (conv2d_backward_data_add_relu: the add and the mask in the data
// gradient's epilogue). The fused forward and weight gradient also with dlprobe's passes in place
// of cuDNN's statistics epilogue and prologue (CudaBackendOptions::conv_sums and
// conv_prologue_pass, bench --conv-sums / --conv-prologue pass), each way on a backend of its own.
// fp16 NHWC, ResNet-50's blocks after each stage's first, batch 256 and 32, random operands. Each
// figure is the mean of a run of calls timed with CUDA events on the backend's stream.
//   bench_conv_fusion_gpu --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"
#include "engine/backends/cuda/cuda_backend_impl.h"

namespace dlprobe {
namespace {

// One convolution after a batch norm and ReLU in a ResNet-50 bottleneck (stride 1).
struct BottleneckConv {
  const char* name;
  std::int64_t c, k, size, kernel;
};
constexpr BottleneckConv kShapes[] = {
    {"layer1 3x3", 64, 64, 56, 3},   {"layer1 1x1", 64, 256, 56, 1},
    {"layer2 3x3", 128, 128, 28, 3}, {"layer2 1x1", 128, 512, 28, 1},
    {"layer3 3x3", 256, 256, 14, 3}, {"layer3 1x1", 256, 1024, 14, 1},
    {"layer4 3x3", 512, 512, 7, 3},  {"layer4 1x1", 512, 2048, 7, 1},
};
// A block's first convolution (1x1, from the block's input: the previous block's output).
constexpr BottleneckConv kFirstShapes[] = {
    {"layer1 conv1", 256, 64, 56, 1},
    {"layer2 conv1", 512, 128, 28, 1},
    {"layer3 conv1", 1024, 256, 14, 1},
    {"layer4 conv1", 2048, 512, 7, 1},
};

// Who does the fused convolutions' statistics and prologue: cuDNN (both), or dlprobe's passes.
enum class Passes { none, sums, prologue, both };

struct Gpu {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<cuda::CudaBackend> backend;  // Passes::none
  std::unique_ptr<cuda::CudaBackend> sums_pass, prologue_pass, both_passes;

  cuda::CudaBackend& with(Passes p) const {
    switch (p) {
      case Passes::sums:
        return *sums_pass;
      case Passes::prologue:
        return *prologue_pass;
      case Passes::both:
        return *both_passes;
      case Passes::none:
        break;
    }
    return *backend;
  }
};

// The backend every benchmark shares; a machine without a usable GPU ends the run with one line.
Gpu& gpu() {
  static Gpu* g = [] {
    auto* made = new Gpu;
    auto source = memory::make_cuda_memory_source(0);
    if (!source) {
      std::fprintf(stderr, "bench_conv_fusion_gpu: %s\n", source.status().message().c_str());
      std::exit(2);
    }
    auto allocator = memory::CachingAllocator::create(std::move(*source));
    if (!allocator) {
      std::fprintf(stderr, "bench_conv_fusion_gpu: %s\n", allocator.status().message().c_str());
      std::exit(2);
    }
    made->allocator = std::move(*allocator);
    // Autotuned plain convolutions, as `dlprobe bench` runs them; the fused graphs take cuDNN's
    // first choice (their engines compile at plan time).
    auto open = [&](bool sums, bool prologue) {
      auto backend =
          cuda::CudaBackend::create(0, *made->allocator,
                                    {.conv_engine = ConvEngineChoice::autotune,
                                     .conv_sums = sums ? ConvSumsBy::pass : ConvSumsBy::epilogue,
                                     .conv_prologue_pass = prologue});
      if (!backend) {
        std::fprintf(stderr, "bench_conv_fusion_gpu: %s\n", backend.status().message().c_str());
        std::exit(2);
      }
      return std::move(*backend);
    };
    made->backend = open(false, false);
    made->sums_pass = open(true, false);
    made->prologue_pass = open(false, true);
    made->both_passes = open(true, true);
    return made;
  }();
  return *g;
}

struct Tensor {
  memory::DeviceBuffer buffer;
  TensorView view;
};

// Uniform in [lo, hi]: random operands, as a step's, rather than constants, which can let the
// tensor cores draw less power and clock higher.
Tensor tensor(const Shape& s, DType t, Layout l, double lo, double hi, std::uint64_t seed) {
  const TensorDesc d = TensorDesc::make(s, t, l).value();
  Tensor out{gpu().allocator->allocate_buffer(d.bytes(), memory::Category::temporaries).value(),
             {}};
  out.view = TensorView{d, out.buffer.data()};
  const HostTensor host = HostTensor::random(d, seed, lo, hi);
  const Status up = gpu().backend->upload(out.view.data, host.data(), d.bytes());
  if (!up.is_ok()) std::fprintf(stderr, "upload: %s\n", up.message().c_str());
  return out;
}

// Over kShapes.
enum class Variant { conv, conv_stats, unfused, fused, wgrad, apply_then_wgrad, wgrad_fused };
// Over kFirstShapes.
enum class DgradVariant { alone, then_relu_add, fused };

// Times `once` on backend b (after one untimed call, which builds the plan: a runtime-fusion
// engine compiles then) over runs of calls.
template <class F>
void time_calls(benchmark::State& state, cuda::CudaBackend& b, F&& once) {
  if (Status s0 = once(); !s0.is_ok() || !(s0 = b.synchronize()).is_ok()) {
    state.SkipWithError(s0.message().c_str());
    return;
  }
  constexpr int kCalls = 20;
  for (auto _ : state) {
    Status ok = b.mark(0);
    for (int i = 0; i < kCalls && ok.is_ok(); ++i) ok = once();
    if (ok.is_ok()) ok = b.mark(1);
    auto ms = ok.is_ok() ? b.elapsed_ms(0, 1) : Result<double>(ok);
    if (!ms) {
      state.SkipWithError(ms.status().message().c_str());
      return;
    }
    state.SetIterationTime(*ms / 1e3 / kCalls);
  }
}

// The data gradient of a block's first convolution, dx shaped as the block's input.
void run_dgrad(benchmark::State& state, DgradVariant variant) {
  const BottleneckConv& s = kFirstShapes[state.range(0)];
  const std::int64_t n = state.range(1);
  state.SetLabel(fmt::format("{} C={} K={} bs{}", s.name, s.c, s.k, n));
  cuda::CudaBackend& b = *gpu().backend;
  const Conv2dParams p{{1, 1}, {0, 0}, {1, 1}, 1};
  const Shape input{n, s.c, s.size, s.size};
  Tensor dy = tensor({n, s.k, s.size, s.size}, DType::fp16, Layout::nhwc, -1, 1, 1);
  Tensor w = tensor({s.k, s.c, 1, 1}, DType::fp16, Layout::nhwc, -0.05, 0.05, 2);
  Tensor add = tensor(input, DType::fp16, Layout::nhwc, -1, 1, 3);
  Tensor relu_y = tensor(input, DType::fp16, Layout::nhwc, 0, 1, 4);
  Tensor grad = tensor(input, DType::fp16, Layout::nhwc, 0, 0, 5);
  Tensor dx = tensor(input, DType::fp16, Layout::nhwc, 0, 0, 6);
  time_calls(state, b, [&]() -> Status {
    switch (variant) {
      case DgradVariant::alone:
        return b.conv2d_backward_data(dy.view, w.view, dx.view, p);
      case DgradVariant::then_relu_add:
        DLPROBE_RETURN_IF_ERROR(b.conv2d_backward_data(dy.view, w.view, grad.view, p));
        return b.relu_backward_add(add.view, grad.view, relu_y.view, dx.view);
      case DgradVariant::fused:
        return b.conv2d_backward_data_add_relu(dy.view, w.view, add.view, relu_y.view, dx.view, p);
    }
    return Status::ok();
  });
}

void run(benchmark::State& state, Variant variant, Passes passes) {
  const BottleneckConv& s = kShapes[state.range(0)];
  const std::int64_t n = state.range(1);
  state.SetLabel(fmt::format("{} C={} K={} bs{}", s.name, s.c, s.k, n));
  cuda::CudaBackend& b = gpu().with(passes);
  const Conv2dParams p{{1, 1}, {s.kernel / 2, s.kernel / 2}, {1, 1}, 1};
  Tensor x = tensor({n, s.c, s.size, s.size}, DType::fp16, Layout::nhwc, -2, 2, 1);
  Tensor a = tensor({n, s.c, s.size, s.size}, DType::fp16, Layout::nhwc, 0, 2, 2);
  Tensor w = tensor({s.k, s.c, s.kernel, s.kernel}, DType::fp16, Layout::nhwc, -0.05, 0.05, 3);
  Tensor y = tensor({n, s.k, s.size, s.size}, DType::fp16, Layout::nhwc, -1, 1, 4);
  Tensor scale = tensor({s.c}, DType::fp16, Layout::nchw, 0.5, 1.5, 5);
  Tensor bias = tensor({s.c}, DType::fp16, Layout::nchw, -0.5, 0.5, 6);
  Tensor gamma = tensor({s.c}, DType::fp32, Layout::nchw, 0.5, 1.5, 7);
  Tensor beta = tensor({s.c}, DType::fp32, Layout::nchw, -0.5, 0.5, 8);
  Tensor mean = tensor({s.c}, DType::fp32, Layout::nchw, -0.1, 0.1, 9);
  Tensor var = tensor({s.c}, DType::fp32, Layout::nchw, 0.5, 1.5, 10);
  Tensor save_mean = tensor({s.c}, DType::fp32, Layout::nchw, 0, 0, 11);
  Tensor save_invstd = tensor({s.c}, DType::fp32, Layout::nchw, 0, 0, 12);
  Tensor sum = tensor({s.k}, DType::fp32, Layout::nchw, 0, 0, 13);
  Tensor sqsum = tensor({s.k}, DType::fp32, Layout::nchw, 0, 0, 14);
  const TensorView no_residual{};
  time_calls(state, b, [&]() -> Status {
    switch (variant) {
      case Variant::conv:
        return b.conv2d_forward(x.view, w.view, y.view, p);
      case Variant::conv_stats:
        return b.conv2d_forward_fused(x.view, {}, {}, w.view, y.view, sum.view, sqsum.view, p);
      case Variant::unfused:
        DLPROBE_RETURN_IF_ERROR(b.batch_norm_relu_train_forward(
            x.view, gamma.view, beta.view, mean.view, var.view, no_residual, a.view, save_mean.view,
            save_invstd.view, {}));
        return b.conv2d_forward(a.view, w.view, y.view, p);
      case Variant::fused:
        return b.conv2d_forward_fused(x.view, scale.view, bias.view, w.view, y.view, sum.view,
                                      sqsum.view, p);
      // The weight gradient, y as its dy and w as its dw.
      case Variant::wgrad:
        return b.conv2d_backward_weight(a.view, y.view, w.view, p);
      case Variant::apply_then_wgrad:
        DLPROBE_RETURN_IF_ERROR(b.batch_norm_relu_inference_forward(
            x.view, gamma.view, beta.view, mean.view, var.view, no_residual, a.view, {}));
        return b.conv2d_backward_weight(a.view, y.view, w.view, p);
      case Variant::wgrad_fused:
        return b.conv2d_backward_weight_fused(x.view, scale.view, bias.view, y.view, w.view, p);
    }
    return Status::ok();
  });
}

// One benchmark family: every shape of a list at batch 256 and 32.
void add_family(const char* name, std::int64_t shapes, std::function<void(benchmark::State&)> fn) {
  auto* bm = benchmark::RegisterBenchmark(name, std::move(fn));
  for (std::int64_t batch : {256, 32}) {
    for (std::int64_t i = 0; i < shapes; ++i) bm->Args({i, batch});
  }
  bm->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
}

// Registered before main: no GPU is touched until a benchmark runs.
const bool kRegistered = [] {
  for (const auto& [name, variant] :
       {std::pair{"conv_alone", Variant::conv}, std::pair{"conv_stats", Variant::conv_stats},
        std::pair{"bn_relu_then_conv", Variant::unfused}, std::pair{"fused", Variant::fused},
        std::pair{"wgrad_alone", Variant::wgrad},
        std::pair{"bn_relu_apply_then_wgrad", Variant::apply_then_wgrad},
        std::pair{"wgrad_fused", Variant::wgrad_fused}}) {
    add_family(name, std::ssize(kShapes),
               [v = variant](benchmark::State& st) { run(st, v, Passes::none); });
  }
  // The fused calls with dlprobe's passes (the statistics, the prologue, or both).
  for (const auto& [name, variant, passes] :
       {std::tuple{"conv_stats_sums_pass", Variant::conv_stats, Passes::sums},
        std::tuple{"fused_sums_pass", Variant::fused, Passes::sums},
        std::tuple{"fused_prologue_pass", Variant::fused, Passes::prologue},
        std::tuple{"fused_both_passes", Variant::fused, Passes::both},
        std::tuple{"wgrad_fused_prologue_pass", Variant::wgrad_fused, Passes::prologue}}) {
    add_family(name, std::ssize(kShapes),
               [v = variant, ps = passes](benchmark::State& st) { run(st, v, ps); });
  }
  for (const auto& [name, variant] :
       {std::pair{"dgrad_alone", DgradVariant::alone},
        std::pair{"dgrad_then_relu_backward_add", DgradVariant::then_relu_add},
        std::pair{"dgrad_add_relu_fused", DgradVariant::fused}}) {
    add_family(name, std::ssize(kFirstShapes),
               [v = variant](benchmark::State& st) { run_dgrad(st, v); });
  }
  return true;
}();

}  // namespace
}  // namespace dlprobe

BENCHMARK_MAIN();
