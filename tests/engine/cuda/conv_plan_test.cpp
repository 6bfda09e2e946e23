// The CUDA backend's convolution plans beyond their numerics (the table in backend_ops_test checks
// those): a plan per shape, built once; an autotuned plan; and the tuning cache replaying a choice
// in a fresh backend.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/temp_folder.h"
#include "cuda_rows.h"
#include "dlprobe/core/files.h"
#include "dlprobe/engine/conv_tuning.h"
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
  auto run = [&](ConvEngineChoice choice) -> Ran {
    auto made =
        cuda::CudaBackend::create(0, allocator(), {.conv_engine = choice, .tuning = *cache});
    EXPECT_TRUE(made.has_value()) << made.status().message();
    if (!made.has_value()) return {};
    BackendTensor y = backend_output(env(), desc({2, 16, 12, 12}, DType::fp16, Layout::nhwc));
    const Status s = (*made)->conv2d_forward(x_in.view(), w_in.view(), y.view(), p);
    EXPECT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE((*made)->synchronize().is_ok());
    EXPECT_TRUE(matches(to_host(env(), y.view()), y_ref, kFp16, {.terms = 16 * 9}));
    return {(*made)->last_conv_engine(), (*made)->conv_plans_replayed()};
  };
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
}

}  // namespace
}  // namespace dlprobe::testing
