// Convolutions on cuDNN against the reference backend in fp64: forward, backward data and backward
// weight, both layouts, fp32 (strict and TF32), fp16 and bf16; and the plan cache.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/temp_folder.h"
#include "cuda_test_util.h"
#include "dlprobe/core/files.h"
#include "dlprobe/engine/conv_tuning.h"
#include "engine/backends/reference/reference.h"

namespace dlprobe::testing {
namespace {

struct ConvCase {
  const char* name;
  Shape x;
  Shape w;
  Conv2dParams p;
};

const ConvCase kCases[] = {
    {"3x3 s1 p1", {2, 16, 12, 12}, {24, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}},
    {"1x1 s2 (downsample)", {2, 16, 11, 11}, {32, 16, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
    {"7x7 s2 p3 (stem)", {2, 3, 20, 20}, {8, 3, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}},
    {"3x3 s2 p1 groups 4", {2, 16, 9, 9}, {16, 4, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 4}},
};

struct Mode {
  DType dtype;
  MathMode math;
  Tolerance tol;
};

// TF32 rounds every input to 10 mantissa bits: each product is good to about 1e-3.
const Mode kModes[] = {
    {DType::fp32, MathMode::strict_fp32, tolerance_for(DType::fp32)},
    {DType::fp32, MathMode::tf32, {1e-2, 5e-3}},
    {DType::fp16, MathMode::strict_fp32, tolerance_for(DType::fp16)},
    {DType::bf16, MathMode::strict_fp32, tolerance_for(DType::bf16)},
};

// The engine of the latest call honours the mode: no TF32 tensor cores under strict fp32, no
// Winograd or FFT, and (the default) no non-deterministic engine.
::testing::AssertionResult engine_fits(const std::string& engine, MathMode math, DType t) {
  if (t == DType::fp32 && math == MathMode::strict_fp32 &&
      engine.find("tensor_core") != std::string::npos) {
    return ::testing::AssertionFailure() << engine << " runs strict fp32 on tensor cores";
  }
  for (const char* banned : {"nondeterministic", "winograd", "fft", "reduced_precision"}) {
    if (engine.find(banned) != std::string::npos) {
      return ::testing::AssertionFailure() << engine << " is " << banned;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaConv, AllDirectionsMatchReference) {
  auto& backend = CudaEnv::backend();
  std::uint64_t seed = 100;
  for (const ConvCase& c : kCases) {
    for (const Mode& mode : kModes) {
      for (Layout layout : {Layout::nchw, Layout::nhwc}) {
        SCOPED_TRACE(fmt::format("{} {}{}", c.name, case_name(mode.dtype, layout),
                                 mode.math == MathMode::tf32 ? " tf32" : ""));
        backend.set_math_mode(mode.math);
        const Shape ys = conv2d_output_shape(c.x, c.w, c.p).value();
        const HostTensor x = rand(c.x, ++seed, mode.dtype, layout);
        const HostTensor w = rand(c.w, ++seed, mode.dtype, layout);
        const HostTensor dy = rand(ys, ++seed, mode.dtype, layout);
        const DeviceTensor dx_in = to_device(x);
        const DeviceTensor dw_in = to_device(w);
        const DeviceTensor ddy = to_device(dy);

        DeviceTensor y = device_output(desc(ys, mode.dtype, layout));
        ASSERT_TRUE(backend.conv2d_forward(dx_in.view(), dw_in.view(), y.view(), c.p).is_ok());
        const HostTensor y_ref = reference::conv2d_forward<double>(f64(x), f64(w), c.p).value();
        EXPECT_TRUE(matches(to_host(y), y_ref, mode.tol))
            << "forward on " << backend.last_conv_engine();
        EXPECT_TRUE(engine_fits(backend.last_conv_engine(), mode.math, mode.dtype));

        DeviceTensor dx = device_output(x.desc());
        const Status sd = backend.conv2d_backward_data(ddy.view(), dw_in.view(), dx.view(), c.p);
        ASSERT_TRUE(sd.is_ok()) << sd.message();
        const HostTensor dx_ref = reference::conv2d_backward_data<double>(
                                      f64(dy), f64(w), x.desc().with_dtype(DType::fp64), c.p)
                                      .value();
        EXPECT_TRUE(matches(to_host(dx), dx_ref, mode.tol))
            << "backward data on " << backend.last_conv_engine();
        EXPECT_TRUE(engine_fits(backend.last_conv_engine(), mode.math, mode.dtype));

        DeviceTensor dw = device_output(w.desc());
        const Status sw = backend.conv2d_backward_weight(dx_in.view(), ddy.view(), dw.view(), c.p);
        ASSERT_TRUE(sw.is_ok()) << sw.message();
        const HostTensor dw_ref = reference::conv2d_backward_weight<double>(
                                      f64(x), f64(dy), w.desc().with_dtype(DType::fp64), c.p)
                                      .value();
        EXPECT_TRUE(matches(to_host(dw), dw_ref, mode.tol))
            << "backward weight on " << backend.last_conv_engine();
        EXPECT_TRUE(engine_fits(backend.last_conv_engine(), mode.math, mode.dtype));
      }
    }
  }
  backend.set_math_mode(MathMode::strict_fp32);
}

TEST(CudaConv, PlansAreBuiltOncePerShape) {
  auto& backend = CudaEnv::backend();
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const HostTensor x = rand({4, 8, 10, 10}, 7, DType::fp16, Layout::nhwc);
  const HostTensor w = rand({8, 8, 3, 3}, 8, DType::fp16, Layout::nhwc);
  const DeviceTensor dx_in = to_device(x);
  const DeviceTensor dw_in = to_device(w);
  DeviceTensor y = device_output(desc({4, 8, 10, 10}, DType::fp16, Layout::nhwc));
  const std::size_t before = backend.conv_plan_count();
  ASSERT_TRUE(backend.conv2d_forward(dx_in.view(), dw_in.view(), y.view(), p).is_ok());
  EXPECT_EQ(backend.conv_plan_count(), before + 1);
  // Same shapes again, other buffers of the same alignment: the cached plan runs.
  const DeviceTensor x2 = to_device(rand({4, 8, 10, 10}, 9, DType::fp16, Layout::nhwc));
  ASSERT_TRUE(backend.conv2d_forward(x2.view(), dw_in.view(), y.view(), p).is_ok());
  EXPECT_EQ(backend.conv_plan_count(), before + 1);
  const HostTensor y_ref = reference::conv2d_forward<double>(f64(to_host(x2)), f64(w), p).value();
  EXPECT_TRUE(matches(to_host(y), y_ref));
  // Another batch size is another plan.
  const DeviceTensor x3 = to_device(rand({2, 8, 10, 10}, 10, DType::fp16, Layout::nhwc));
  DeviceTensor y3 = device_output(desc({2, 8, 10, 10}, DType::fp16, Layout::nhwc));
  ASSERT_TRUE(backend.conv2d_forward(x3.view(), dw_in.view(), y3.view(), p).is_ok());
  EXPECT_EQ(backend.conv_plan_count(), before + 2);
}

TEST(CudaConv, AutotunedPlanMatchesReference) {
  auto made = cuda::CudaBackend::create(0, CudaEnv::allocator(),
                                        {.conv_engine = ConvEngineChoice::autotune});
  ASSERT_TRUE(made.has_value()) << made.status().message();
  cuda::CudaBackend& tuned = **made;
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const HostTensor x = rand({2, 16, 12, 12}, 21, DType::bf16, Layout::nhwc);
  const HostTensor w = rand({16, 16, 3, 3}, 22, DType::bf16, Layout::nhwc);
  const DeviceTensor dx_in = to_device(x);
  const DeviceTensor dw_in = to_device(w);
  DeviceTensor y = device_output(desc({2, 16, 12, 12}, DType::bf16, Layout::nhwc));
  // The device tensors were uploaded on the shared backend's stream; wait before another stream
  // reads them.
  ASSERT_TRUE(CudaEnv::backend().synchronize().is_ok());
  const Status s = tuned.conv2d_forward(dx_in.view(), dw_in.view(), y.view(), p);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(tuned.conv_plan_count(), 1U);
  ASSERT_TRUE(tuned.synchronize().is_ok());
  const HostTensor y_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
  EXPECT_TRUE(matches(to_host(y), y_ref));
}

// A choice recorded by one backend is what a fresh backend (as in a later process) runs, without
// timing again; the exhaustive mode keeps choices of its own.
TEST(CudaConv, TuningCacheReplaysTheChoice) {
  const TempFolder dir;
  const std::filesystem::path file = dir / "tuning.json";
  auto cache = ConvTuningCache::open(file);
  ASSERT_TRUE(cache.has_value()) << cache.status().message();
  const Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const HostTensor x = rand({2, 16, 12, 12}, 31, DType::fp16, Layout::nhwc);
  const HostTensor w = rand({16, 16, 3, 3}, 32, DType::fp16, Layout::nhwc);
  const DeviceTensor x_in = to_device(x);
  const DeviceTensor w_in = to_device(w);
  ASSERT_TRUE(CudaEnv::backend().synchronize().is_ok());
  const HostTensor y_ref = reference::conv2d_forward<double>(f64(x), f64(w), p).value();
  // The engine label of the call, and whether its plan came from the cache.
  struct Ran {
    std::string engine;
    std::size_t replayed = 0;
  };
  auto run = [&](ConvEngineChoice choice) -> Ran {
    auto made = cuda::CudaBackend::create(0, CudaEnv::allocator(),
                                          {.conv_engine = choice, .tuning = *cache});
    EXPECT_TRUE(made.has_value()) << made.status().message();
    if (!made.has_value()) return {};
    DeviceTensor y = device_output(desc({2, 16, 12, 12}, DType::fp16, Layout::nhwc));
    const Status s = (*made)->conv2d_forward(x_in.view(), w_in.view(), y.view(), p);
    EXPECT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE((*made)->synchronize().is_ok());
    EXPECT_TRUE(matches(to_host(y), y_ref));
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
