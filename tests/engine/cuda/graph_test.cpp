// Convolutions recorded in a CUDA graph and replayed against the same calls run eagerly. Needs a
// GPU (LABELS gpu).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <string>

#include "cuda_rows.h"
#include "dlprobe/engine/conv_tuning.h"
#include "test_util.h"

namespace dlprobe::testing {
namespace {

using CudaGraph = CudaTest;

struct GraphMode {
  DType dtype;
  MathMode math;
  Layout layout;
};

// The ResNet stem's weight gradient (3 input channels, 7x7, stride 2; the step tests' shape),
// replayed after the graph's shared workspace was overwritten with NaN as the step's later calls
// overwrite it: a call whose engine set its workspace up at capture only (a host-side upload that
// the capture does not record) reads the NaN on replay. Run twice in a row, as a step replays.
TEST_F(CudaGraph, ReplayedStemWeightGradientMatchesEager) {
  cuda::CudaBackend& backend = shared();
  const Conv2dParams p{{2, 2}, {3, 3}, {1, 1}, 1};
  const Shape xs{8, 3, 64, 64};
  const Shape ws{64, 3, 7, 7};
  const Shape ys = conv2d_output_shape(xs, ws, p).value();
  const GraphMode modes[] = {{DType::fp32, MathMode::strict_fp32, Layout::nhwc},
                             {DType::fp32, MathMode::strict_fp32, Layout::nchw},
                             {DType::fp32, MathMode::tf32, Layout::nhwc},
                             {DType::fp16, MathMode::strict_fp32, Layout::nhwc}};
  std::uint64_t seed = 500;
  for (const GraphMode& m : modes) {
    SCOPED_TRACE(fmt::format("{}/{}{}", dtype_name(m.dtype), layout_name(m.layout),
                             m.math == MathMode::tf32 ? " tf32" : ""));
    backend.set_math_mode(m.math);
    const BackendTensor x = to_backend(env(), rand(xs, ++seed, m.dtype, m.layout));
    const BackendTensor dy = to_backend(env(), rand(ys, ++seed, m.dtype, m.layout));
    BackendTensor eager = backend_output(env(), desc(ws, m.dtype, m.layout));
    ASSERT_TRUE(backend.conv2d_backward_weight(x.view(), dy.view(), eager.view(), p).is_ok());
    const std::string engine = backend.last_conv_engine();
    const HostTensor want = to_host(env(), eager.view());

    BackendTensor replayed = backend_output(env(), desc(ws, m.dtype, m.layout));
    std::size_t trashed = 0;
    const Result<std::size_t> graph = backend.capture([&]() -> Status {
      DLPROBE_RETURN_IF_ERROR(
          backend.conv2d_backward_weight(x.view(), dy.view(), replayed.view(), p));
      const memory::DeviceBuffer* w = backend.recording_workspace();
      trashed = w != nullptr ? w->size() / sizeof(float) : 0;
      if (trashed == 0) return Status::ok();
      const TensorDesc as_floats =
          TensorDesc::make(Shape{static_cast<std::int64_t>(trashed)}, DType::fp32).value();
      return backend.fill({as_floats, w->data()}, std::numeric_limits<double>::quiet_NaN());
    });
    ASSERT_TRUE(graph.has_value()) << graph.status().message();
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_TRUE(backend.replay(*graph).is_ok());
      ASSERT_TRUE(backend.synchronize().is_ok());
      EXPECT_TRUE(identical(to_host(env(), replayed.view()), want))
          << "replay " << replay << " on " << engine << " (" << trashed
          << " workspace floats overwritten)";
    }
    backend.release_graph(*graph);
  }
  backend.set_math_mode(MathMode::strict_fp32);
}

// A graph's shared workspace is what the eager calls since the last capture took, not the most of
// every plan the backend holds: a sweep's configurations share one backend, and an earlier step's
// large workspace (strict fp32's FFT engines) must not size a later step's graph.
TEST_F(CudaGraph, WorkspaceIsSizedByTheCallsSinceTheCountWasReset) {
  // A backend of its own, autotuning among every engine as the bench does: strict fp32's
  // FFT engines take large workspaces.
  auto made = cuda::CudaBackend::create(0, allocator(),
                                        {.conv_engine = ConvEngineChoice::autotune,
                                         .deterministic = false,
                                         .transform_engines = true});
  ASSERT_TRUE(made.has_value()) << made.status().message();
  cuda::CudaBackend& backend = **made;
  const Conv2dParams stem{{2, 2}, {3, 3}, {1, 1}, 1};
  const Conv2dParams same{{1, 1}, {1, 1}, {1, 1}, 1};
  const BackendTensor x = to_backend(env(), rand({8, 3, 64, 64}, 601, DType::fp32, Layout::nhwc));
  const BackendTensor dy = to_backend(env(), rand({8, 64, 32, 32}, 602, DType::fp32, Layout::nhwc));
  BackendTensor dw = backend_output(env(), desc({64, 3, 7, 7}, DType::fp32, Layout::nhwc));
  // layer1's 3x3 weight gradient at batch 64: evaluate's sweep on an H200 chose engines with
  // 110 MiB of workspace for it at batch 32 and 1.2 GiB (FFT) at batch 256.
  const BackendTensor bx =
      to_backend(env(), rand({64, 64, 56, 56}, 603, DType::fp32, Layout::nchw));
  const BackendTensor bdy =
      to_backend(env(), rand({64, 64, 56, 56}, 604, DType::fp32, Layout::nchw));
  BackendTensor bdw = backend_output(env(), desc({64, 64, 3, 3}, DType::fp32, Layout::nchw));
  std::string big_engine;
  // The uploads ran on the shared backend's stream.
  ASSERT_TRUE(shared().synchronize().is_ok());
  auto stem_wgrad = [&] {
    return backend.conv2d_backward_weight(x.view(), dy.view(), dw.view(), stem);
  };
  // The workspace of a graph recording the stem's weight gradient, after a reset and `eager`.
  auto recorded_workspace = [&](const std::function<void()>& eager) -> std::size_t {
    backend.reset_call_workspace_peak();
    eager();
    std::size_t bytes = 0;
    const Result<std::size_t> g = backend.capture([&]() -> Status {
      bytes = backend.recording_workspace()->size();
      return stem_wgrad();
    });
    EXPECT_TRUE(g.has_value()) << g.status().message();
    if (g) backend.release_graph(*g);
    return bytes;
  };
  const std::size_t alone = recorded_workspace([&] { ASSERT_TRUE(stem_wgrad().is_ok()); });
  const std::size_t after_big = recorded_workspace([&] {
    ASSERT_TRUE(backend.conv2d_backward_weight(bx.view(), bdy.view(), bdw.view(), same).is_ok());
    big_engine = backend.last_conv_engine();
    ASSERT_TRUE(stem_wgrad().is_ok());
  });
  const std::size_t again = recorded_workspace([&] { ASSERT_TRUE(stem_wgrad().is_ok()); });
  std::printf(
      "graph workspace: stem alone %zu B, after the larger convolution (%s) %zu B, then "
      "%zu B\n",
      alone, big_engine.c_str(), after_big, again);
  ASSERT_TRUE(backend.synchronize().is_ok());
  if (after_big <= alone) {
    GTEST_SKIP() << "the larger convolution's engine took no more workspace than the stem's";
  }
  EXPECT_EQ(again, alone);
}

}  // namespace
}  // namespace dlprobe::testing
