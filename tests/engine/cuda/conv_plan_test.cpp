// The CUDA backend's convolution plans beyond their numerics (the table in backend_ops_test checks
// those): a plan per shape, built once; an autotuned plan; the tuning cache replaying a choice in
// a fresh backend, and loading a fused graph's plan whole; and the runtime-fusion graphs with a
// batch norm's apply and ReLU, which only this backend has, against the fp64 reference.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/temp_folder.h"
#include "cuda_rows.h"
#include "dlprobe/core/files.h"
#include "dlprobe/engine/conv_tuning.h"
#include "engine/backends/cuda/cudnn_graph.h"
#include "engine/backends/cuda/timed_choice.h"
#include "engine/backends/reference/reference.h"
#include "test_util.h"

namespace dlprobe::testing {
namespace {

using CudaConv = CudaTest;

HostTensor f64(const HostTensor& t) {
  return t.to_dtype(DType::fp64).value();
}

TEST_F(CudaConv, PlansAreBuiltOncePerShape) {
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const HostTensor x = rand({4, 8, 10, 10}, 7, DType::fp16, Layout::nhwc);
  const HostTensor w = rand({8, 8, 3, 3}, 8, DType::fp16, Layout::nhwc);
  const BackendTensor dx_in = to_backend(env(), x);
  const BackendTensor dw_in = to_backend(env(), w);
  BackendTensor y = backend_output(env(), desc({4, 8, 10, 10}, DType::fp16, Layout::nhwc));
  const std::size_t before = shared().conv_plan_count();
  ASSERT_TRUE(shared().conv2d_forward(dx_in.view(), dw_in.view(), y.view(), p).is_ok());
  EXPECT_EQ(shared().conv_plan_count(), before + 1);
  // Same shapes again, other buffers of the same alignment: the cached plan runs.
  const HostTensor x2 = rand({4, 8, 10, 10}, 9, DType::fp16, Layout::nhwc);
  const BackendTensor dx2 = to_backend(env(), x2);
  ASSERT_TRUE(shared().conv2d_forward(dx2.view(), dw_in.view(), y.view(), p).is_ok());
  EXPECT_EQ(shared().conv_plan_count(), before + 1);
  const HostTensor y_ref = reference::conv2d_forward<double>(f64(x2), f64(w), p).value();
  EXPECT_TRUE(matches(to_host(env(), y.view()), y_ref, kFp16, {.terms = 8 * 9}));
  // Another batch size is another plan.
  const BackendTensor x3 = to_backend(env(), rand({2, 8, 10, 10}, 10, DType::fp16, Layout::nhwc));
  BackendTensor y3 = backend_output(env(), desc({2, 8, 10, 10}, DType::fp16, Layout::nhwc));
  ASSERT_TRUE(shared().conv2d_forward(x3.view(), dw_in.view(), y3.view(), p).is_ok());
  EXPECT_EQ(shared().conv_plan_count(), before + 2);
}

TEST_F(CudaConv, AutotunedPlanMatchesReference) {
  auto made =
      cuda::CudaBackend::create(0, allocator(), {.conv_engine = ConvEngineChoice::autotune});
  ASSERT_TRUE(made.has_value()) << made.status().message();
  cuda::CudaBackend& tuned = **made;
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const HostTensor x = rand({2, 16, 12, 12}, 21, DType::bf16, Layout::nhwc);
  const HostTensor w = rand({16, 16, 3, 3}, 22, DType::bf16, Layout::nhwc);
  const BackendTensor dx_in = to_backend(env(), x);
  const BackendTensor dw_in = to_backend(env(), w);
  BackendTensor y = backend_output(env(), desc({2, 16, 12, 12}, DType::bf16, Layout::nhwc));
  // The tensors were uploaded on the shared backend's stream; wait before another stream reads
  // them.
  ASSERT_TRUE(shared().synchronize().is_ok());
  const Status s = tuned.conv2d_forward(dx_in.view(), dw_in.view(), y.view(), p);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(tuned.conv_plan_count(), 1U);
  ASSERT_TRUE(tuned.synchronize().is_ok());
  const HostTensor y_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
  EXPECT_TRUE(matches(to_host(env(), y.view()), y_ref, kBf16, {.terms = 16 * 9}));
}

// A choice recorded by one backend is what a fresh backend (as in a later process) runs, without
// timing again; the exhaustive mode keeps choices of its own.
TEST_F(CudaConv, TuningCacheReplaysTheChoice) {
  const TempFolder dir;
  const std::filesystem::path file = dir / "tuning.json";
  auto cache = ConvTuningCache::open(file);
  ASSERT_TRUE(cache.has_value()) << cache.status().message();
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const HostTensor x = rand({2, 16, 12, 12}, 31, DType::fp16, Layout::nhwc);
  const HostTensor w = rand({16, 16, 3, 3}, 32, DType::fp16, Layout::nhwc);
  const BackendTensor x_in = to_backend(env(), x);
  const BackendTensor w_in = to_backend(env(), w);
  ASSERT_TRUE(shared().synchronize().is_ok());
  const HostTensor y_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
  // The engine label of the call, and whether its plan came from the cache.
  struct Ran {
    std::string engine;
    std::size_t replayed = 0;
  };
  auto run_with = [&](ConvEngineChoice choice, std::shared_ptr<ConvTuningCache> tuning) -> Ran {
    auto made = cuda::CudaBackend::create(0, allocator(),
                                          {.conv_engine = choice, .tuning = std::move(tuning)});
    EXPECT_TRUE(made.has_value()) << made.status().message();
    if (!made.has_value()) return {};
    BackendTensor y = backend_output(env(), desc({2, 16, 12, 12}, DType::fp16, Layout::nhwc));
    const Status s = (*made)->conv2d_forward(x_in.view(), w_in.view(), y.view(), p);
    EXPECT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE((*made)->synchronize().is_ok());
    EXPECT_TRUE(matches(to_host(env(), y.view()), y_ref, kFp16, {.terms = 16 * 9}));
    return {(*made)->last_conv_engine(), (*made)->conv_plans_replayed()};
  };
  auto run = [&](ConvEngineChoice choice) { return run_with(choice, *cache); };
  const Ran tuned = run(ConvEngineChoice::autotune);
  EXPECT_EQ(tuned.replayed, 0U);
  EXPECT_EQ((*cache)->size(), 1U);
  // The recorded choice carries its knobs: cuDNN's heuristics set them per shape for its Hopper
  // engines, and a replay at the engine's defaults ran fp16 ResNet-50 four times slower when
  // read_knobs lost them.
  {
    auto text = read_whole_file(file);
    ASSERT_TRUE(text.has_value()) << text.status().message();
    auto entries = ConvTuningCache::parse(*text, file.string());
    ASSERT_TRUE(entries.has_value()) << entries.status().message();
    ASSERT_EQ(entries->size(), 1U);
    EXPECT_FALSE(entries->begin()->second.knobs.empty()) << entries->begin()->second.label;
  }
  // Engine and knob choices (both in the label) come back, with no candidate timed.
  const Ran replayed = run(ConvEngineChoice::autotune);
  EXPECT_EQ(replayed.engine, tuned.engine);
  EXPECT_EQ(replayed.replayed, 1U);
  EXPECT_EQ((*cache)->size(), 1U);
  // The file holds the choice for the next process.
  auto reread = ConvTuningCache::open(file);
  ASSERT_TRUE(reread.has_value()) << reread.status().message();
  EXPECT_EQ((*reread)->size(), 1U);
  EXPECT_EQ(run(ConvEngineChoice::exhaustive).replayed, 0U);
  EXPECT_EQ((*cache)->size(), 2U);
  // Heuristic choices are cuDNN's first and cost nothing to make: not recorded.
  run(ConvEngineChoice::heuristic);
  EXPECT_EQ((*cache)->size(), 2U);
  // A choice that an older rule made among the timed configurations (its key names no version of
  // timed_choice.h's rule) is tuned again, not replayed.
  auto text = read_whole_file(file);
  ASSERT_TRUE(text.has_value()) << text.status().message();
  auto entries = ConvTuningCache::parse(*text, file.string());
  ASSERT_TRUE(entries.has_value()) << entries.status().message();
  const std::string current = fmt::format("| autotune v{} |", cuda::kTimedChoiceVersion);
  const auto recorded = std::find_if(entries->begin(), entries->end(), [&](const auto& e) {
    return e.first.find(current) != std::string::npos;
  });
  ASSERT_NE(recorded, entries->end()) << "no key names " << current;
  std::string older_key = recorded->first;
  older_key.replace(older_key.find(current), current.size(), "| autotune |");
  auto older = std::make_shared<ConvTuningCache>();
  ASSERT_TRUE(older->record(older_key, recorded->second).is_ok());
  EXPECT_EQ(run_with(ConvEngineChoice::autotune, older).replayed, 0U);
  EXPECT_EQ(older->size(), 2U);
}

using CudnnHandle = std::unique_ptr<cudnnContext, decltype(&cudnnDestroy)>;
CudnnHandle cudnn_handle() {
  cudnnHandle_t raw = nullptr;
  return {cudnnCreate(&raw) == CUDNN_STATUS_SUCCESS ? raw : nullptr, &cudnnDestroy};
}

// A candidate as "eng<index> <knob>=<value> ...".
std::string plan_label(const cuda::ExecutionPlan& plan) {
  std::string label = fmt::format("eng{}", plan.engine_index);
  for (const ConvKnob& k : plan.knobs) label += fmt::format(" {}={}", k.type, k.value);
  return label;
}

// ResNet-50's layer1 3x3 convolution at batch 32, fp16 NHWC (strides of N, C, H, W), for the
// plan builder's tests that time candidates with a timer of their own.
cuda::ConvSpec layer1_conv2_spec() {
  auto nhwc = [](std::int64_t uid, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    return cuda::TensorSpec{uid, CUDNN_DATA_HALF, {n, c, h, w}, {h * w * c, 1, w * c, c}};
  };
  cuda::ConvSpec spec;
  spec.x = nhwc(1, 32, 64, 56, 56);
  spec.w = nhwc(2, 64, 64, 3, 3);
  spec.y = nhwc(3, 32, 64, 56, 56);
  spec.pad[0] = spec.pad[1] = 1;
  spec.deterministic = false;
  return spec;
}

// Autotuning times every configuration the heuristics offer, each once: one engine runs other
// kernels under other knob choices (tile sizes, split counts), and on an H200 the heuristics list
// several configurations of one engine for ResNet-50's shapes (five of engine 47 for its fp16
// stem). A search that kept each engine's first configuration only fails here. The timer records
// the candidates instead of running them, the first reported fastest.
TEST_F(CudaConv, AutotuningTimesEveryKnobConfigurationOnce) {
  const CudnnHandle handle = cudnn_handle();
  ASSERT_NE(handle, nullptr);
  const cuda::ConvSpec spec = layer1_conv2_spec();
  std::vector<std::string> timed;
  std::map<std::int64_t, int> per_engine;
  const cuda::PlanTimer timer = [&](const cuda::ExecutionPlan& plan, float) -> Result<float> {
    timed.push_back(plan_label(plan));
    ++per_engine[plan.engine_index];
    return static_cast<float>(timed.size());
  };
  auto plan = cuda::build_conv_plan(handle.get(), spec, ConvEngineChoice::autotune,
                                    std::int64_t{256} << 20, timer);
  ASSERT_TRUE(plan.has_value()) << plan.status().message();
  ASSERT_FALSE(timed.empty());
  EXPECT_EQ(std::set<std::string>(timed.begin(), timed.end()).size(), timed.size())
      << fmt::format("{}", fmt::join(timed, "; "));
  const auto most =
      std::max_element(per_engine.begin(), per_engine.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  EXPECT_GE(most->second, 2) << fmt::format("{}", fmt::join(timed, "; "));
  // The plan is the candidate timed fastest (the first), with its knobs.
  EXPECT_EQ(plan->time_ms, 1.0F);
}

// Among the timed configurations the tuning keeps one without workspace where it is within
// kWorkspaceFreeTolerance of the fastest (timed_choice.h), else the fastest: the timer here makes
// every configuration with workspace the fastest.
TEST_F(CudaConv, AutotuningKeepsAConfigurationWithoutWorkspaceWithinTheTolerance) {
  const CudnnHandle handle = cudnn_handle();
  ASSERT_NE(handle, nullptr);
  const cuda::ConvSpec spec = layer1_conv2_spec();
  for (const float free_ms : {1.02F, 1.05F}) {
    std::size_t with = 0;
    std::size_t without = 0;
    const cuda::PlanTimer timer = [&](const cuda::ExecutionPlan& plan, float) -> Result<float> {
      ++(plan.workspace_bytes > 0 ? with : without);
      return plan.workspace_bytes > 0 ? 1.0F : free_ms;
    };
    auto plan = cuda::build_conv_plan(handle.get(), spec, ConvEngineChoice::autotune,
                                      std::int64_t{256} << 20, timer);
    ASSERT_TRUE(plan.has_value()) << plan.status().message();
    ASSERT_GT(with, 0U) << "no configuration with workspace was timed for this shape";
    ASSERT_GT(without, 0U) << "no configuration without workspace was timed for this shape";
    if (free_ms <= 1.0 + cuda::kWorkspaceFreeTolerance) {
      EXPECT_EQ(plan->workspace_bytes, 0);
      EXPECT_EQ(plan->time_ms, free_ms);
    } else {
      EXPECT_GT(plan->workspace_bytes, 0);
      EXPECT_EQ(plan->time_ms, 1.0F);
    }
  }
}

// With a timer, a fused graph's plan is the fastest of all its configurations that build (each
// distinct, more than one for this shape on an H200), not the first; without one, nothing is
// timed. The timer here makes each later candidate twice as fast (beyond any tolerance of
// timed_choice.h), so a search that kept the first would fail; and it is called once for every
// configuration that builds, as a timer that fails them all counts them, so a search that stopped
// after a few would fail too where more build.
TEST_F(CudaConv, TunedFusedGraphKeepsTheFastestOfAllItsConfigurations) {
  const CudnnHandle handle = cudnn_handle();
  ASSERT_NE(handle, nullptr);
  // With bn1 + ReLU in its prologue and bn2's sums in its epilogue.
  auto channels = [](std::int64_t uid, cudnnDataType_t type, std::int64_t c) {
    return cuda::TensorSpec{uid, type, {1, c, 1, 1}, {c, 1, c, c}};
  };
  cuda::FusedConvSpec spec;
  spec.conv = layer1_conv2_spec();
  spec.scale = channels(4, CUDNN_DATA_HALF, 64);
  spec.bias = channels(5, CUDNN_DATA_HALF, 64);
  spec.sum = channels(6, CUDNN_DATA_FLOAT, 64);
  spec.sqsum = channels(7, CUDNN_DATA_FLOAT, 64);
  std::vector<std::string> timed;
  const cuda::PlanTimer timer = [&](const cuda::ExecutionPlan& plan, float) -> Result<float> {
    timed.push_back(plan_label(plan));
    return std::ldexp(1.0F, -static_cast<int>(timed.size()));
  };
  constexpr std::int64_t kWorkspace = std::int64_t{256} << 20;
  auto first = cuda::build_fused_conv_plan(handle.get(), spec, kWorkspace);
  ASSERT_TRUE(first.has_value()) << first.status().message();
  EXPECT_TRUE(timed.empty());
  auto tuned = cuda::build_fused_conv_plan(handle.get(), spec, kWorkspace, timer);
  ASSERT_TRUE(tuned.has_value()) << tuned.status().message();
  EXPECT_GE(timed.size(), 2U) << fmt::format("{}", fmt::join(timed, "; "));
  std::size_t built = 0;
  const cuda::PlanTimer failing = [&](const cuda::ExecutionPlan&, float) -> Result<float> {
    ++built;
    return error(Errc::internal, "not timed here");
  };
  EXPECT_FALSE(cuda::build_fused_conv_plan(handle.get(), spec, kWorkspace, failing).has_value())
      << "no configuration was timed, so none can be kept";
  EXPECT_EQ(timed.size(), built) << fmt::format("{}", fmt::join(timed, "; "));
  EXPECT_EQ(std::set<std::string>(timed.begin(), timed.end()).size(), timed.size())
      << fmt::format("{}", fmt::join(timed, "; "));
  // The last timed, the fastest by this timer.
  EXPECT_EQ(tuned->time_ms, std::ldexp(1.0F, -static_cast<int>(timed.size())))
      << fmt::format("{}", fmt::join(timed, "; "));
  RecordProperty("candidates_timed", fmt::format("{}", fmt::join(timed, "; ")));
}

// A fused graph's plan is kept whole (serialized) in the tuning cache: a fresh backend with the
// file (as a later process) loads it instead of building it, and it computes the same bits. A plan
// cuDNN does not take back is built again and replaced.
TEST_F(CudaConv, FusedPlansLoadFromTheTuningCache) {
  const TempFolder dir;
  const std::filesystem::path file = dir / "tuning.json";
  auto cache = ConvTuningCache::open(file);
  ASSERT_TRUE(cache.has_value()) << cache.status().message();
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const BackendTensor x = to_backend(env(), rand({4, 32, 10, 10}, 41, DType::fp16, Layout::nhwc));
  const BackendTensor w = to_backend(env(), rand({64, 32, 3, 3}, 42, DType::fp16, Layout::nhwc));
  const BackendTensor scale =
      to_backend(env(), rand({32}, 43, DType::fp16, Layout::nchw, 0.5, 1.5));
  const BackendTensor bias =
      to_backend(env(), rand({32}, 44, DType::fp16, Layout::nchw, -0.5, 0.5));
  ASSERT_TRUE(shared().synchronize().is_ok());
  struct Ran {
    HostTensor y;
    std::string engine;
    std::size_t loaded = 0;
  };
  auto run = [&](const std::shared_ptr<ConvTuningCache>& tuning) -> Ran {
    auto made = cuda::CudaBackend::create(0, allocator(), {.tuning = tuning});
    EXPECT_TRUE(made.has_value()) << made.status().message();
    if (!made.has_value()) return {};
    BackendTensor y = backend_output(env(), desc({4, 64, 10, 10}, DType::fp16, Layout::nhwc));
    BackendTensor sum = backend_output(env(), desc({64}, DType::fp32));
    BackendTensor sqsum = backend_output(env(), desc({64}, DType::fp32));
    const Status s = (*made)->conv2d_forward_fused(x.view(), scale.view(), bias.view(), w.view(),
                                                   y.view(), sum.view(), sqsum.view(), p);
    EXPECT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE((*made)->synchronize().is_ok());
    return {to_host(env(), y.view()), (*made)->last_conv_engine(), (*made)->fused_plans_loaded()};
  };
  const Ran built = run(*cache);
  EXPECT_EQ(built.loaded, 0U);
  ASSERT_EQ((*cache)->size(), 1U);
  std::string key;
  {
    auto text = read_whole_file(file);
    ASSERT_TRUE(text.has_value()) << text.status().message();
    auto entries = ConvTuningCache::parse(*text, file.string());
    ASSERT_TRUE(entries.has_value()) << entries.status().message();
    ASSERT_EQ(entries->size(), 1U);
    key = entries->begin()->first;
    EXPECT_FALSE(entries->begin()->second.plan.empty()) << key;
  }
  auto reread = ConvTuningCache::open(file);
  ASSERT_TRUE(reread.has_value()) << reread.status().message();
  const Ran loaded = run(*reread);
  EXPECT_EQ(loaded.loaded, 1U);
  EXPECT_EQ(loaded.engine, built.engine);
  EXPECT_TRUE(identical(loaded.y, built.y));

  // Half a plan: cuDNN refuses it, the graph is compiled again and the cache holds the new plan.
  ConvTuningEntry damaged = *(*reread)->find(key);
  damaged.plan.resize(damaged.plan.size() / 2);
  auto broken = std::make_shared<ConvTuningCache>();
  ASSERT_TRUE(broken->record(key, damaged).is_ok());
  const Ran rebuilt = run(broken);
  EXPECT_EQ(rebuilt.loaded, 0U);
  EXPECT_TRUE(identical(rebuilt.y, built.y));
  ASSERT_TRUE(broken->find(key).has_value());
  EXPECT_NE(broken->find(key)->plan, damaged.plan);
}

// A fused graph's test shape: c input channels, k output channels, square images and kernels.
struct FusedCase {
  std::int64_t c, k, size, kernel, stride, pad;

  std::string name() const {
    return fmt::format("C={} K={} {}x{} stride {}", c, k, kernel, kernel, stride);
  }
  Conv2dParams params() const { return {{stride, stride}, {pad, pad}, {1, 1}, 1}; }
  std::int64_t out() const { return (size + 2 * pad - kernel) / stride + 1; }
};

// Whether per-channel sums and sums of squares are those of y_ref (fp64) over its channels: a
// sum's error grows with the magnitudes summed.
::testing::AssertionResult statistics_match(const HostTensor& y_ref, const HostTensor& sums,
                                            const HostTensor& squares) {
  const std::int64_t k = y_ref.desc().dim(1);
  std::vector<double> want_sum(static_cast<std::size_t>(k));
  std::vector<double> want_sq(static_cast<std::size_t>(k));
  std::vector<double> magnitude(static_cast<std::size_t>(k));
  for_each_index(y_ref.desc().shape(), [&](std::array<std::int64_t, 4> i) {
    const double v = value_at(y_ref, i);
    const auto ch = static_cast<std::size_t>(i[1]);
    want_sum[ch] += v;
    want_sq[ch] += v * v;
    magnitude[ch] += std::abs(v);
  });
  for (std::int64_t ch = 0; ch < k; ++ch) {
    const auto u = static_cast<std::size_t>(ch);
    if (std::abs(sums.get(ch) - want_sum[u]) > 1e-2 * magnitude[u] + 1e-3 ||
        std::abs(squares.get(ch) - want_sq[u]) > 1e-2 * want_sq[u] + 1e-3) {
      return ::testing::AssertionFailure()
             << "channel " << ch << ": sum " << sums.get(ch) << " against " << want_sum[u]
             << ", sum of squares " << squares.get(ch) << " against " << want_sq[u];
    }
  }
  return ::testing::AssertionSuccess();
}

// A fused convolution's operands for case c over n images, drawn from `seed` on: x, w and the
// prologue's scale and bias, on the host and on the backend, and y's shape.
struct FusedOperands {
  FusedOperands(OpenedBackend& env, const FusedCase& c, std::int64_t n, std::uint64_t seed)
      : x(rand({n, c.c, c.size, c.size}, seed, DType::fp16, Layout::nhwc, -2, 2)),
        w(rand({c.k, c.c, c.kernel, c.kernel}, seed + 1, DType::fp16, Layout::nhwc)),
        scale(rand({c.c}, seed + 2, DType::fp16, Layout::nchw, 0.5, 1.5)),
        bias(rand({c.c}, seed + 3, DType::fp16, Layout::nchw, -0.5, 0.5)),
        x_in(to_backend(env, x)),
        w_in(to_backend(env, w)),
        scale_in(to_backend(env, scale)),
        bias_in(to_backend(env, bias)),
        y_desc(desc({n, c.k, c.out(), c.out()}, DType::fp16, Layout::nhwc)) {}
  HostTensor x, w, scale, bias;
  BackendTensor x_in, w_in, scale_in, bias_in;
  TensorDesc y_desc;
};

// x * scale + bias per channel in fp64, with or without the ReLU, rounded to fp16 as the tensor
// cores read it: the input a fused convolution's prologue gives it.
HostTensor prologue_of(const HostTensor& x, const HostTensor& scale, const HostTensor& bias,
                       bool relu) {
  HostTensor a(desc(x.desc().shape(), DType::fp64, Layout::nhwc));
  for_each_index(x.desc().shape(), [&](std::array<std::int64_t, 4> i) {
    const double v = value_at(x, i) * scale.get(i[1]) + bias.get(i[1]);
    a.set(offset_of(a.desc(), i), relu ? std::max(v, 0.0) : v);
  });
  return f64(a.to_dtype(DType::fp16).value());
}

// cuDNN's runtime fusion of a batch norm's apply and ReLU into the convolution after it, with the
// next batch norm's statistics from its output, and into its weight gradient, against the fp64
// reference of the steps. The outputs must also differ from a convolution without the prologue
// and from one without the ReLU: a fusion that dropped either would fail here.
TEST_F(CudaConv, FusedBatchNormReluConvolutionMatchesReference) {
  for (const FusedCase& c : {FusedCase{32, 64, 10, 3, 1, 1}, FusedCase{64, 32, 9, 1, 1, 0},
                             FusedCase{32, 32, 12, 3, 2, 1}}) {
    SCOPED_TRACE(c.name());
    const std::int64_t n = 4;
    const Conv2dParams p = c.params();
    const FusedOperands ops(env(), c, n, 31);
    const auto& [x, w, scale, bias, x_in, w_in, scale_in, bias_in, y_desc] = ops;
    const std::int64_t out = c.out();
    BackendTensor y = backend_output(env(), y_desc);
    BackendTensor sum = backend_output(env(), desc({c.k}, DType::fp32));
    BackendTensor sqsum = backend_output(env(), desc({c.k}, DType::fp32));
    const Status ran =
        shared().conv2d_forward_fused(x_in.view(), scale_in.view(), bias_in.view(), w_in.view(),
                                      y.view(), sum.view(), sqsum.view(), p);
    ASSERT_TRUE(ran.is_ok()) << ran.message();

    auto prologue = [&](bool relu) { return prologue_of(x, scale, bias, relu); };
    const HostTensor y_ref = reference::conv2d_forward<double>(prologue(true), f64(w), p).value();
    const HostTensor y_got = to_host(env(), y.view());
    const Check check{.terms = static_cast<double>(c.c * c.kernel * c.kernel)};
    EXPECT_TRUE(matches(y_got, y_ref, kFp16, check));
    EXPECT_FALSE(
        matches(y_got, reference::conv2d_forward<double>(f64(x), f64(w), p).value(), kFp16, check))
        << "the prologue made no difference";
    EXPECT_FALSE(matches(
        y_got, reference::conv2d_forward<double>(prologue(false), f64(w), p).value(), kFp16, check))
        << "the ReLU made no difference";

    // Without the prologue (a block's first convolution): the plain convolution and its
    // statistics.
    BackendTensor y_plain = backend_output(env(), y_desc);
    BackendTensor sum_plain = backend_output(env(), desc({c.k}, DType::fp32));
    BackendTensor sqsum_plain = backend_output(env(), desc({c.k}, DType::fp32));
    const Status plain = shared().conv2d_forward_fused(
        x_in.view(), {}, {}, w_in.view(), y_plain.view(), sum_plain.view(), sqsum_plain.view(), p);
    ASSERT_TRUE(plain.is_ok()) << plain.message();
    const HostTensor y_plain_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
    const HostTensor y_plain_got = to_host(env(), y_plain.view());
    EXPECT_TRUE(matches(y_plain_got, y_plain_ref, kFp16, check));
    EXPECT_FALSE(matches(y_plain_got, y_ref, kFp16, check)) << "a prologue ran without one asked";
    const HostTensor plain_sums = to_host(env(), sum_plain.view());
    const HostTensor plain_squares = to_host(env(), sqsum_plain.view());
    EXPECT_TRUE(statistics_match(y_plain_ref, plain_sums, plain_squares));

    // The weight gradient with the same prologue, the normalised input recomputed from x.
    const HostTensor dy = rand(y_desc.shape(), 35, DType::fp16, Layout::nhwc);
    const BackendTensor dy_in = to_backend(env(), dy);
    BackendTensor dw = backend_output(env(), w.desc());
    const Status grad = shared().conv2d_backward_weight_fused(
        x_in.view(), scale_in.view(), bias_in.view(), dy_in.view(), dw.view(), p);
    ASSERT_TRUE(grad.is_ok()) << grad.message();
    const HostTensor dw_got = to_host(env(), dw.view());
    const Check sums_over_images{.terms = static_cast<double>(n * out * out)};
    const TensorDesc dw_ref_desc = desc(w.desc().shape(), DType::fp64, Layout::nhwc);
    EXPECT_TRUE(matches(
        dw_got,
        reference::conv2d_backward_weight<double>(prologue(true), f64(dy), dw_ref_desc, p).value(),
        kFp16, sums_over_images));
    EXPECT_FALSE(matches(
        dw_got, reference::conv2d_backward_weight<double>(f64(x), f64(dy), dw_ref_desc, p).value(),
        kFp16, sums_over_images))
        << "the weight gradient's prologue made no difference";
    EXPECT_FALSE(matches(
        dw_got,
        reference::conv2d_backward_weight<double>(prologue(false), f64(dy), dw_ref_desc, p).value(),
        kFp16, sums_over_images))
        << "the weight gradient's ReLU made no difference";

    EXPECT_TRUE(statistics_match(y_ref, to_host(env(), sum.view()), to_host(env(), sqsum.view())));
  }
  EXPECT_EQ(shared().unfusable_graphs(), 0U) << "a fused graph ran as its unfused calls";
}

// With CudaBackendOptions::conv_sums at pass the convolution runs without cuDNN's statistics
// epilogue (with its prologue, or alone) and dlprobe's pass sums its output: y and its statistics
// against the fp64 reference, with and without the prologue, the merge in the pass's own launch
// (cooperative) and in a second; the sums must not be those of the other output (a pass over the
// wrong tensor would pass a looser check). A ResNet-50 batch-32 shape, whose sums take many
// splits, and 12 output channels, which the pass reads one element at a time (no 16-byte packs).
TEST_F(CudaConv, ConvolutionSumsByAPassMatchReference) {
  struct SumsCase {
    FusedCase shape;
    bool prologue_too;  // also with the prologue (runtime fusion wants packed channels)
  };
  for (const bool cooperative : {true, false}) {
    SCOPED_TRACE(cooperative ? "merged in the pass's launch" : "merged in a second launch");
    auto made = cuda::CudaBackend::create(
        0, allocator(), {.conv_sums = ConvSumsBy::pass, .cooperative_launches = cooperative});
    ASSERT_TRUE(made.has_value()) << made.status().message();
    cuda::CudaBackend& backend = **made;
    for (const SumsCase& sc :
         {SumsCase{{32, 64, 10, 3, 1, 1}, true}, SumsCase{{64, 32, 9, 1, 1, 0}, true},
          SumsCase{{64, 256, 28, 1, 1, 0}, true}, SumsCase{{16, 12, 9, 3, 1, 1}, false}}) {
      const FusedCase& c = sc.shape;
      SCOPED_TRACE(c.name());
      const std::int64_t n = c.size > 20 ? 32 : 4;
      const Conv2dParams p = c.params();
      const FusedOperands ops(env(), c, n, 51);
      const auto& [x, w, scale, bias, x_in, w_in, scale_in, bias_in, y_desc] = ops;
      const Check check{.terms = static_cast<double>(c.c * c.kernel * c.kernel)};
      const HostTensor with_ref =
          reference::conv2d_forward<double>(prologue_of(x, scale, bias, true), f64(w), p).value();
      const HostTensor plain_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
      for (const bool with_prologue : {true, false}) {
        if (with_prologue && !sc.prologue_too) continue;
        SCOPED_TRACE(with_prologue ? "with the prologue" : "without");
        BackendTensor y = backend_output(env(), y_desc);
        BackendTensor sum = backend_output(env(), desc({c.k}, DType::fp32));
        BackendTensor sqsum = backend_output(env(), desc({c.k}, DType::fp32));
        const std::size_t passes = backend.sums_passes();
        const Status ran = backend.conv2d_forward_fused(
            x_in.view(), with_prologue ? scale_in.view() : TensorView{},
            with_prologue ? bias_in.view() : TensorView{}, w_in.view(), y.view(), sum.view(),
            sqsum.view(), p);
        ASSERT_TRUE(ran.is_ok()) << ran.message();
        EXPECT_EQ(backend.sums_passes(), passes + 1) << "the sums by cuDNN's epilogue";
        ASSERT_TRUE(backend.synchronize().is_ok());
        const HostTensor& want = with_prologue ? with_ref : plain_ref;
        const HostTensor& other = with_prologue ? plain_ref : with_ref;
        EXPECT_TRUE(matches(to_host(env(), y.view()), want, kFp16, check));
        const HostTensor sums = to_host(env(), sum.view());
        const HostTensor squares = to_host(env(), sqsum.view());
        EXPECT_TRUE(statistics_match(want, sums, squares));
        EXPECT_FALSE(statistics_match(other, sums, squares)) << "the sums of the other output";
      }
    }
  }
}

// A batch norm's finalize before a fused convolution of case c over n images: sums of its
// count = n * size * size values a channel, with means in [-1, 1] and variances in [0.5, 2],
// gamma, beta and running statistics, drawn from `seed` on.
struct FinalizeInputs {
  FinalizeInputs(const FusedCase& c, std::int64_t n, std::uint64_t seed)
      : count(n * c.size * c.size),
        sum(desc({c.c}, DType::fp32)),
        sqsum(desc({c.c}, DType::fp32)),
        gamma(rand({c.c}, seed + 2, DType::fp32, Layout::nchw, 0.5, 1.5)),
        beta(rand({c.c}, seed + 3, DType::fp32)),
        running_mean(rand({c.c}, seed + 4, DType::fp32)),
        running_var(rand({c.c}, seed + 5, DType::fp32, Layout::nchw, 0.5, 1.5)) {
    const HostTensor mean = rand({c.c}, seed, DType::fp64, Layout::nchw, -1.0, 1.0);
    const HostTensor var = rand({c.c}, seed + 1, DType::fp64, Layout::nchw, 0.5, 2.0);
    for (std::int64_t i = 0; i < c.c; ++i) {
      sum.set(i, static_cast<double>(count) * mean.get(i));
      sqsum.set(i, static_cast<double>(count) * (var.get(i) + mean.get(i) * mean.get(i)));
    }
  }
  std::int64_t count;
  HostTensor sum, sqsum, gamma, beta, running_mean, running_var;
};

// The inputs on the backend (`sums` in place of their sum) and the outputs of a call that
// finalizes them, with y and its sums for the convolution after it.
struct FinalizeCall {
  FinalizeCall(OpenedBackend& env, const FinalizeInputs& in, const HostTensor& sums, DType pt,
               const TensorDesc& y_desc)
      : count(in.count),
        sum(to_backend(env, sums)),
        sqsum(to_backend(env, in.sqsum)),
        gamma(to_backend(env, in.gamma)),
        beta(to_backend(env, in.beta)),
        running_mean(to_backend(env, in.running_mean)),
        running_var(to_backend(env, in.running_var)),
        save_mean(backend_output(env, in.gamma.desc())),
        save_invstd(backend_output(env, in.gamma.desc())),
        scale(backend_output(env, desc(in.gamma.desc().shape(), pt))),
        bias(backend_output(env, desc(in.gamma.desc().shape(), pt))),
        y(backend_output(env, y_desc)),
        y_sum(backend_output(env, desc({y_desc.dim(1)}, DType::fp32))),
        y_sqsum(backend_output(env, desc({y_desc.dim(1)}, DType::fp32))) {}
  Backend::BatchNormFinalize finalize() const {
    return {sum.view(),         sqsum.view(),     count,
            gamma.view(),       beta.view(),      running_mean.view(),
            running_var.view(), save_mean.view(), save_invstd.view(),
            scale.view(),       bias.view(),      {.eps = 1e-5, .momentum = 0.1}};
  }
  // Every output on the host by name: the finalize's, with `with_y` also y, with `with_sums`
  // y's sums.
  std::map<std::string, HostTensor> outputs(OpenedBackend& env, bool with_y, bool with_sums) const {
    std::map<std::string, HostTensor> out{{"save_mean", to_host(env, save_mean.view())},
                                          {"save_invstd", to_host(env, save_invstd.view())},
                                          {"running_mean", to_host(env, running_mean.view())},
                                          {"running_var", to_host(env, running_var.view())},
                                          {"scale", to_host(env, scale.view())},
                                          {"bias", to_host(env, bias.view())}};
    if (with_y) out.emplace("y", to_host(env, y.view()));
    if (with_sums) {
      out.emplace("y_sum", to_host(env, y_sum.view()));
      out.emplace("y_sqsum", to_host(env, y_sqsum.view()));
    }
    return out;
  }
  std::int64_t count;
  BackendTensor sum, sqsum, gamma, beta, running_mean, running_var, save_mean, save_invstd, scale,
      bias, y, y_sum, y_sqsum;
};

// With conv_prologue_timed (bench's --conv-prologue auto) a call shape's first call runs both
// routes of its prologue, cuDNN's graph and dlprobe's pass, an untimed run and three timed ones
// each, and keeps the faster in the tuning cache; a backend over the same cache runs that route
// without timing. The forward whose batch norm finalizes in the call (the step's call) gives y
// against fp64 by either route, and the finalize's outputs to the bit as batch_norm_finalize
// gives them on a backend that times nothing: its timed runs move copies of the running
// statistics, so the real ones move once. The weight gradient's route is timed apart.
TEST_F(CudaConv, PrologueRouteTimedOnceAndKept) {
  auto tuning = std::make_shared<ConvTuningCache>();
  const CudaBackendOptions timed{.conv_engine = ConvEngineChoice::autotune,
                                 .deterministic = false,
                                 .conv_prologue_timed = true,
                                 .tuning = tuning};
  auto plain_made = cuda::CudaBackend::create(0, allocator(), {.deterministic = false});
  ASSERT_TRUE(plain_made.has_value()) << plain_made.status().message();
  cuda::CudaBackend& plain = **plain_made;
  const FusedCase c{32, 64, 10, 3, 1, 1};
  const std::int64_t n = 4;
  const Conv2dParams p = c.params();
  const FusedOperands ops(env(), c, n, 91);
  const FinalizeInputs in(c, n, 93);
  const DType pt = plain.conv_prologue_dtype(DType::fp16);
  const std::vector<std::string> names = {"save_mean",   "save_invstd", "running_mean",
                                          "running_var", "scale",       "bias"};

  // The finalize's outputs by name and y with its sums, from the one call on `backend` or (none)
  // from batch_norm_finalize on the plain backend.
  using Outputs = std::map<std::string, HostTensor>;
  const auto run = [&](cuda::CudaBackend* backend) -> Outputs {
    const FinalizeCall call(env(), in, in.sum, pt, ops.y_desc);
    // With y's sums, as in the step: cuDNN has no engine for this graph without them.
    const Status ran = backend != nullptr
                           ? backend->conv2d_forward_finalize_fused(
                                 call.finalize(), ops.x_in.view(), ops.w_in.view(), call.y.view(),
                                 call.y_sum.view(), call.y_sqsum.view(), p)
                           : plain.batch_norm_finalize(call.finalize());
    EXPECT_TRUE(ran.is_ok()) << ran.message();
    EXPECT_TRUE((backend != nullptr ? backend->synchronize() : plain.synchronize()).is_ok());
    return call.outputs(env(), backend != nullptr, backend != nullptr);
  };
  const Outputs finalized = run(nullptr);
  const HostTensor& scale_ref = finalized.at("scale");
  const HostTensor& bias_ref = finalized.at("bias");
  const HostTensor input = prologue_of(ops.x, scale_ref, bias_ref, true);
  const HostTensor y_ref = reference::conv2d_forward<double>(input, f64(ops.w), p).value();
  const Check check{.terms = static_cast<double>(c.c * c.kernel * c.kernel)};
  const HostTensor dy = rand(ops.y_desc.shape(), 99, DType::fp16, Layout::nhwc);
  const BackendTensor dy_in = to_backend(env(), dy);
  const TensorDesc dw_desc = desc(ops.w.desc().shape(), DType::fp64, Layout::nhwc);
  const HostTensor dw_ref = reference::conv2d_backward_weight<double>(
                                prologue_of(ops.x, ops.scale, ops.bias, true), f64(dy), dw_desc, p)
                                .value();
  const Check sums_over_images{.terms = static_cast<double>(n * c.out() * c.out())};

  // Prologue passes of the forward and of the weight gradient, on a new timed backend.
  const auto passes_of = [&]() -> std::pair<std::size_t, std::size_t> {
    auto made = cuda::CudaBackend::create(0, allocator(), timed);
    EXPECT_TRUE(made.has_value()) << made.status().message();
    if (!made.has_value()) return {};
    cuda::CudaBackend& backend = **made;
    const Outputs got = run(&backend);
    for (const std::string& name : names) {
      const HostTensor& a = got.at(name);
      const HostTensor& b = finalized.at(name);
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        EXPECT_EQ(a.get(i), b.get(i)) << name << "[" << i << "]";
      }
    }
    EXPECT_TRUE(matches(got.at("y"), y_ref, kFp16, check));
    EXPECT_TRUE(statistics_match(y_ref, got.at("y_sum"), got.at("y_sqsum")));
    const std::size_t forward = backend.prologue_passes();
    BackendTensor dw = backend_output(env(), ops.w.desc());
    const Status grad = backend.conv2d_backward_weight_fused(
        ops.x_in.view(), ops.scale_in.view(), ops.bias_in.view(), dy_in.view(), dw.view(), p);
    EXPECT_TRUE(grad.is_ok()) << grad.message();
    EXPECT_TRUE(backend.synchronize().is_ok());
    EXPECT_TRUE(matches(to_host(env(), dw.view()), dw_ref, kFp16, sums_over_images));
    EXPECT_EQ(backend.unfusable_graphs(), 0U) << "cuDNN had no engine: the routes were one";
    return {forward, backend.prologue_passes() - forward};
  };
  const std::size_t entries = tuning->size();
  const auto [forward, gradient] = passes_of();
  // Timing ran the pass four times, then the call once more by the route it chose.
  EXPECT_TRUE(forward == 4 || forward == 5) << forward;
  EXPECT_TRUE(gradient == 4 || gradient == 5) << gradient;
  EXPECT_GE(tuning->size(), entries + 2) << "both routes kept";
  const auto [forward_again, gradient_again] = passes_of();
  EXPECT_EQ(forward_again, forward - 4) << "the kept route, untimed";
  EXPECT_EQ(gradient_again, gradient - 4) << "the kept route, untimed";
}

// With conv_prologue_pass_up_to_bytes (bench's --conv-prologue up-to:SIZE) a call whose input
// holds at most that many bytes takes the pass, and a larger one cuDNN's prologue (or the pass
// as the fallback where cuDNN has no engine for the graph, which it counts), forward and weight
// gradient alike, each against fp64.
TEST_F(CudaConv, PrologueByAPassUpToASize) {
  const FusedCase c{32, 64, 10, 3, 1, 1};
  const std::int64_t bytes_of_two = 2 * c.c * c.size * c.size * 2;  // fp16 x of 2 images
  auto made = cuda::CudaBackend::create(
      0, allocator(),
      {.deterministic = false,
       .conv_prologue_pass_up_to_bytes = static_cast<std::uint64_t>(bytes_of_two)});
  ASSERT_TRUE(made.has_value()) << made.status().message();
  cuda::CudaBackend& backend = **made;
  const Conv2dParams p = c.params();
  for (const std::int64_t n : {2, 4}) {
    SCOPED_TRACE(n);
    const FusedOperands ops(env(), c, n, 71);
    BackendTensor y = backend_output(env(), ops.y_desc);
    BackendTensor sum = backend_output(env(), desc({c.k}, DType::fp32));
    BackendTensor sqsum = backend_output(env(), desc({c.k}, DType::fp32));
    const std::size_t before = backend.prologue_passes();
    const std::size_t refused = backend.unfusable_graphs();
    ASSERT_TRUE(backend
                    .conv2d_forward_fused(ops.x_in.view(), ops.scale_in.view(), ops.bias_in.view(),
                                          ops.w_in.view(), y.view(), sum.view(), sqsum.view(), p)
                    .is_ok());
    const HostTensor dy = rand(ops.y_desc.shape(), 73, DType::fp16, Layout::nhwc);
    const BackendTensor dy_in = to_backend(env(), dy);
    BackendTensor dw = backend_output(env(), ops.w.desc());
    ASSERT_TRUE(backend
                    .conv2d_backward_weight_fused(ops.x_in.view(), ops.scale_in.view(),
                                                  ops.bias_in.view(), dy_in.view(), dw.view(), p)
                    .is_ok());
    ASSERT_TRUE(backend.synchronize().is_ok());
    const std::size_t passes = backend.prologue_passes() - before;
    if (n == 2) {
      EXPECT_EQ(passes, 2U) << "the pass, forward and weight gradient";
    } else {
      EXPECT_EQ(passes, backend.unfusable_graphs() - refused) << "the pass, not as a fallback";
    }
    const HostTensor input = prologue_of(ops.x, ops.scale, ops.bias, true);
    const HostTensor y_ref = reference::conv2d_forward<double>(input, f64(ops.w), p).value();
    EXPECT_TRUE(matches(to_host(env(), y.view()), y_ref, kFp16,
                        {.terms = static_cast<double>(c.c * c.kernel * c.kernel)}));
    const TensorDesc dw_desc = desc(ops.w.desc().shape(), DType::fp64, Layout::nhwc);
    EXPECT_TRUE(
        matches(to_host(env(), dw.view()),
                reference::conv2d_backward_weight<double>(input, f64(dy), dw_desc, p).value(),
                kFp16, {.terms = static_cast<double>(n * c.out() * c.out())}));
  }
}

// With CudaBackendOptions::conv_prologue_pass dlprobe's pass writes relu(x * scale + bias) to
// scratch and the convolution and its weight gradient run without cuDNN's prologue, the
// statistics from cuDNN's epilogue or from the sums pass: y, its statistics and the weight
// gradient against the fp64 reference, and not against the same without the prologue.
TEST_F(CudaConv, PrologueByAPassMatchesReference) {
  for (const bool sums_pass : {false, true}) {
    SCOPED_TRACE(sums_pass ? "sums by a pass" : "sums in the epilogue");
    auto made =
        cuda::CudaBackend::create(0, allocator(),
                                  {.conv_sums = sums_pass ? ConvSumsBy::pass : ConvSumsBy::epilogue,
                                   .conv_prologue_pass = true});
    ASSERT_TRUE(made.has_value()) << made.status().message();
    cuda::CudaBackend& backend = **made;
    for (const FusedCase& c : {FusedCase{32, 64, 10, 3, 1, 1}, FusedCase{64, 32, 9, 1, 1, 0},
                               FusedCase{32, 32, 12, 3, 2, 1}}) {
      SCOPED_TRACE(c.name());
      const std::int64_t n = 4;
      const Conv2dParams p = c.params();
      const FusedOperands ops(env(), c, n, 61);
      const auto& [x, w, scale, bias, x_in, w_in, scale_in, bias_in, y_desc] = ops;
      BackendTensor y = backend_output(env(), y_desc);
      BackendTensor sum = backend_output(env(), desc({c.k}, DType::fp32));
      BackendTensor sqsum = backend_output(env(), desc({c.k}, DType::fp32));
      const std::size_t passes = backend.prologue_passes();
      const std::size_t sums_passes = backend.sums_passes();
      const Status ran =
          backend.conv2d_forward_fused(x_in.view(), scale_in.view(), bias_in.view(), w_in.view(),
                                       y.view(), sum.view(), sqsum.view(), p);
      ASSERT_TRUE(ran.is_ok()) << ran.message();
      EXPECT_EQ(backend.prologue_passes(), passes + 1) << "the prologue by cuDNN";
      EXPECT_EQ(backend.sums_passes(), sums_passes + (sums_pass ? 1 : 0));
      const HostTensor input = prologue_of(x, scale, bias, true);
      const HostTensor y_ref = reference::conv2d_forward<double>(input, f64(w), p).value();
      const HostTensor plain_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
      const Check check{.terms = static_cast<double>(c.c * c.kernel * c.kernel)};
      const HostTensor y_got = to_host(env(), y.view());
      EXPECT_TRUE(matches(y_got, y_ref, kFp16, check));
      EXPECT_FALSE(matches(y_got, plain_ref, kFp16, check)) << "the prologue made no difference";
      EXPECT_TRUE(
          statistics_match(y_ref, to_host(env(), sum.view()), to_host(env(), sqsum.view())));

      const HostTensor dy = rand(y_desc.shape(), 65, DType::fp16, Layout::nhwc);
      const BackendTensor dy_in = to_backend(env(), dy);
      BackendTensor dw = backend_output(env(), w.desc());
      const Status grad = backend.conv2d_backward_weight_fused(
          x_in.view(), scale_in.view(), bias_in.view(), dy_in.view(), dw.view(), p);
      ASSERT_TRUE(grad.is_ok()) << grad.message();
      EXPECT_EQ(backend.prologue_passes(), passes + 2) << "the weight gradient's prologue by cuDNN";
      ASSERT_TRUE(backend.synchronize().is_ok());
      const HostTensor dw_got = to_host(env(), dw.view());
      const Check sums_over_images{.terms = static_cast<double>(n * c.out() * c.out())};
      const TensorDesc dw_desc = desc(w.desc().shape(), DType::fp64, Layout::nhwc);
      EXPECT_TRUE(matches(
          dw_got, reference::conv2d_backward_weight<double>(input, f64(dy), dw_desc, p).value(),
          kFp16, sums_over_images));
      EXPECT_FALSE(matches(
          dw_got, reference::conv2d_backward_weight<double>(f64(x), f64(dy), dw_desc, p).value(),
          kFp16, sums_over_images))
          << "the weight gradient's prologue made no difference";
    }
  }
}

// conv2d_forward_finalize_fused where the prologue runs as dlprobe's pass: the finalize made in
// the pass's launch gives every output of batch_norm_finalize and then conv2d_forward_fused
// (both already checked against fp64) to the bit: y and its sums, the saved and running
// statistics, the prologue's scale and bias. Packed channels with y's sums, and 12 channels (one
// value a thread) without. The same call over sums one channel's mean apart must differ: the
// comparison sees a finalize that read the wrong statistics.
TEST_F(CudaConv, FinalizeInThePrologueMatchesItsTwoCalls) {
  auto made = cuda::CudaBackend::create(0, allocator(), {.conv_prologue_pass = true});
  ASSERT_TRUE(made.has_value()) << made.status().message();
  cuda::CudaBackend& backend = **made;
  for (const auto& [c, with_sums] : {std::pair{FusedCase{32, 64, 10, 3, 1, 1}, true},
                                     std::pair{FusedCase{64, 32, 9, 1, 1, 0}, true},
                                     std::pair{FusedCase{12, 16, 9, 3, 1, 1}, false}}) {
    SCOPED_TRACE(c.name());
    const std::int64_t n = 4;
    const Conv2dParams p = c.params();
    const FusedOperands ops(env(), c, n, 81);
    const FinalizeInputs in(c, n, 83);
    HostTensor shifted = in.sum;
    shifted.set(1, in.sum.get(1) + static_cast<double>(in.count) * 0.25);
    const DType pt = backend.conv_prologue_dtype(DType::fp16);

    // Every output of one run, on the host.
    using Outputs = std::map<std::string, HostTensor>;
    const auto run = [&](bool one_call, const HostTensor& sums) -> Outputs {
      const FinalizeCall call(env(), in, sums, pt, ops.y_desc);
      const Backend::BatchNormFinalize f = call.finalize();
      const TensorView ys = with_sums ? call.y_sum.view() : TensorView{};
      const TensorView ysq = with_sums ? call.y_sqsum.view() : TensorView{};
      const std::size_t passes = backend.prologue_passes();
      Status ran = Status::ok();
      if (one_call) {
        ran = backend.conv2d_forward_finalize_fused(f, ops.x_in.view(), ops.w_in.view(),
                                                    call.y.view(), ys, ysq, p);
      } else {
        ran = backend.batch_norm_finalize(f);
        if (ran.is_ok()) {
          ran = backend.conv2d_forward_fused(ops.x_in.view(), f.scale, f.bias, ops.w_in.view(),
                                             call.y.view(), ys, ysq, p);
        }
      }
      EXPECT_TRUE(ran.is_ok()) << ran.message();
      EXPECT_EQ(backend.prologue_passes(), passes + 1) << "the prologue by cuDNN";
      EXPECT_TRUE(backend.synchronize().is_ok());
      return call.outputs(env(), true, with_sums);
    };
    // The tensors that differ anywhere in a bit, by name.
    const auto differing = [](const Outputs& a, const Outputs& b) {
      std::set<std::string> names;
      for (const auto& [name, t] : a) {
        const HostTensor& u = b.at(name);
        for (std::int64_t i = 0; i < t.numel(); ++i) {
          if (t.get(i) != u.get(i)) names.insert(name);
        }
      }
      return names;
    };
    const Outputs two_calls = run(false, in.sum);
    const Outputs one_call = run(true, in.sum);
    EXPECT_EQ(differing(one_call, two_calls), std::set<std::string>{});
    const std::set<std::string> apart = differing(run(true, shifted), two_calls);
    for (const char* name : {"y", "save_mean", "running_mean", "bias"}) {
      EXPECT_TRUE(apart.contains(name)) << name << " did not move with the mean";
    }
    // Sums over another count than x's values a channel are refused, not finalized.
    const BackendTensor any = backend_output(env(), desc({c.c}, DType::fp32));
    const BackendTensor any_scale = backend_output(env(), desc({c.c}, pt));
    const Backend::BatchNormFinalize wrong{
        any.view(), any.view(), in.count + 1, any.view(),       any.view(),       any.view(),
        any.view(), any.view(), any.view(),   any_scale.view(), any_scale.view(), {}};
    BackendTensor y = backend_output(env(), ops.y_desc);
    const Status refused = backend.conv2d_forward_finalize_fused(
        wrong, ops.x_in.view(), ops.w_in.view(), y.view(), {}, {}, p);
    EXPECT_FALSE(refused.is_ok());
    EXPECT_NE(refused.message().find("values a channel"), std::string::npos) << refused.message();
  }
}

// The data gradient with a ResNet block output's add and ReLU backward in its epilogue, against
// the fp64 reference: (dgrad(dy, w) + add) where relu_y > 0. It must also differ from the data
// gradient masked without the add and from the sum without the mask: an epilogue that dropped
// either would fail here. The cases: ResNet's first 1x1 convolution of a block (more channels in
// dx than in dy), a 3x3, and a stride-2 projection.
TEST_F(CudaConv, FusedDataGradientAddReluMatchesReference) {
  for (const FusedCase& c : {FusedCase{64, 16, 10, 1, 1, 0}, FusedCase{32, 32, 9, 3, 1, 1},
                             FusedCase{32, 64, 10, 1, 2, 0}}) {
    SCOPED_TRACE(c.name());
    const std::int64_t n = 4;
    const Conv2dParams p = c.params();
    const std::int64_t out = c.out();
    const TensorDesc dx_desc = desc({n, c.c, c.size, c.size}, DType::fp16, Layout::nhwc);
    const HostTensor dy = rand({n, c.k, out, out}, 41, DType::fp16, Layout::nhwc);
    const HostTensor w = rand({c.k, c.c, c.kernel, c.kernel}, 42, DType::fp16, Layout::nhwc);
    const HostTensor add = rand(dx_desc.shape(), 43, DType::fp16, Layout::nhwc);
    // A ReLU's output: zero about half the time.
    const HostTensor pre = rand(dx_desc.shape(), 44, DType::fp16, Layout::nhwc);
    HostTensor relu_y(dx_desc);
    for_each_index(dx_desc.shape(), [&](std::array<std::int64_t, 4> i) {
      relu_y.set(offset_of(dx_desc, i), std::max(value_at(pre, i), 0.0));
    });
    const BackendTensor dy_in = to_backend(env(), dy);
    const BackendTensor w_in = to_backend(env(), w);
    const BackendTensor add_in = to_backend(env(), add);
    const BackendTensor relu_y_in = to_backend(env(), relu_y);
    BackendTensor dx = backend_output(env(), dx_desc);
    const Status ran = shared().conv2d_backward_data_add_relu(
        dy_in.view(), w_in.view(), add_in.view(), relu_y_in.view(), dx.view(), p);
    ASSERT_TRUE(ran.is_ok()) << ran.message();

    const TensorDesc ref_desc = desc(dx_desc.shape(), DType::fp64, Layout::nhwc);
    const HostTensor grad =
        reference::conv2d_backward_data<double>(f64(dy), f64(w), ref_desc, p).value();
    // grad (+ add where with_add) where relu_y > 0 (everywhere unless masked).
    auto expected = [&](bool with_add, bool masked) {
      HostTensor r(ref_desc);
      for_each_index(ref_desc.shape(), [&](std::array<std::int64_t, 4> i) {
        const double v = value_at(grad, i) + (with_add ? value_at(add, i) : 0.0);
        r.set(offset_of(ref_desc, i), !masked || value_at(relu_y, i) > 0.0 ? v : 0.0);
      });
      return r;
    };
    const HostTensor got = to_host(env(), dx.view());
    const Check check{.terms = static_cast<double>(c.k * c.kernel * c.kernel + 1)};
    EXPECT_TRUE(matches(got, expected(true, true), kFp16, check));
    EXPECT_FALSE(matches(got, expected(false, true), kFp16, check)) << "the add made no difference";
    EXPECT_FALSE(matches(got, expected(true, false), kFp16, check))
        << "the ReLU's mask made no difference";
  }
  EXPECT_EQ(shared().unfusable_graphs(), 0U) << "a fused graph ran as its unfused calls";
}

}  // namespace
}  // namespace dlprobe::testing
