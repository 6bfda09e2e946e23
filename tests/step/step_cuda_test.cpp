// The whole planned step on the CUDA backend against the same step on the reference backend, in
// every precision and layout (the yardstick is in step_compare.h). Needs a GPU (LABELS gpu).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../engine/test_util.h"
#include "dlprobe/engine/cuda_backend.h"
#include "step_compare.h"

namespace dlprobe::engine {
namespace {

using testing::config;

testing::Rig make_cuda_rig(const StepConfig& c) {
  return testing::make_rig_on(
      c, memory::make_cuda_memory_source(0),
      [](memory::CachingAllocator& allocator) { return make_cuda_backend(0, allocator); });
}

TEST(StepCudaTest, Fp32GradientsNchw) {
  testing::compare_gradients(Precision::fp32, Layout::nchw, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Fp32GradientsNhwc) {
  testing::compare_gradients(Precision::fp32, Layout::nhwc, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Tf32GradientsNchw) {
  testing::compare_gradients(Precision::tf32, Layout::nchw, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Fp16GradientsNhwc) {
  testing::compare_gradients(Precision::fp16, Layout::nhwc, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Bf16GradientsNhwc) {
  testing::compare_gradients(Precision::bf16, Layout::nhwc, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Fp32TrainSgd) {
  testing::compare_training(Precision::fp32, OptimizerKind::sgd, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Fp16TrainSgd) {
  testing::compare_training(Precision::fp16, OptimizerKind::sgd, make_cuda_rig, "cuda");
}
TEST(StepCudaTest, Fp32TrainAdamW) {
  testing::compare_training(Precision::fp32, OptimizerKind::adamw, make_cuda_rig, "cuda");
}

// Batch norm inside the convolutions runs where the engines may differ between runs and keep
// partial sums in 16 bits (as under bench's default, --conv-engines any, but for FFT and Winograd
// engines), and its whole fp16 step passes the same comparison with fp64.
// With `sums_pass` and `prologue_pass`, dlprobe's passes in place of cuDNN's statistics epilogue
// and prologue (CudaBackendOptions::conv_sums, conv_prologue_pass); without `stem_backward`, the
// stem's pool backward and its batch norm's as two calls (fused_stem_backward off).
testing::RigFactory fusing_cuda_rig(bool sums_pass, bool prologue_pass, bool stem_backward = true) {
  return [=](const StepConfig& c) {
    return testing::make_rig_on(c, memory::make_cuda_memory_source(0),
                                [=](memory::CachingAllocator& allocator) {
                                  CudaBackendOptions o;
                                  o.deterministic = false;
                                  o.reduced_precision_reductions = true;
                                  o.conv_sums = sums_pass ? ConvSumsBy::pass : ConvSumsBy::epilogue;
                                  o.conv_prologue_pass = prologue_pass;
                                  o.fused_stem_backward = stem_backward;
                                  return make_cuda_backend(0, allocator, o);
                                });
  };
}

testing::Rig make_fusing_cuda_rig(const StepConfig& c) {
  return fusing_cuda_rig(false, false)(c);
}

// bench's `--stem-backward apart` on top of the default fused step.
testing::Rig make_stem_apart_cuda_rig(const StepConfig& c) {
  return fusing_cuda_rig(false, false, false)(c);
}

int calls_of(const testing::Rig& r, CallKind kind) {
  int n = 0;
  for (const Call& call : r.step->calls()) n += call.kind == kind ? 1 : 0;
  return n;
}

TEST(StepCudaTest, Fp16GradientsNhwcWithBatchNormInsideTheConvolutions) {
  const StepConfig c = config(Precision::fp16, Layout::nhwc, StepMode::grads);
  testing::Rig fusing = make_fusing_cuda_rig(c);
  testing::Rig exact = make_cuda_rig(c);
  ASSERT_TRUE(fusing.step && exact.step);
  // ResNet-18: every convolution but the stem's sums its output, the 7 block outputs whose
  // gradient arrives as two terms take it in a data gradient's epilogue, the 3 projection
  // blocks apply their two batch norms in one pass, and the stem's pool, ReLU and batch norm
  // backward is one call.
  EXPECT_EQ(calls_of(fusing, CallKind::conv_forward_fused), 19);
  EXPECT_EQ(calls_of(fusing, CallKind::conv_backward_data_add_relu), 7);
  EXPECT_EQ(calls_of(fusing, CallKind::batch_norm_apply_add), 3);
  EXPECT_EQ(calls_of(fusing, CallKind::batch_norm_relu_max_pool_backward), 1);
  EXPECT_EQ(calls_of(fusing, CallKind::max_pool_backward), 0);
  EXPECT_EQ(calls_of(exact, CallKind::conv_forward_fused), 0)
      << "deterministic engines: no runtime fusion";
  EXPECT_EQ(calls_of(exact, CallKind::conv_backward_data_add_relu), 0);
  testing::compare_gradients(Precision::fp16, Layout::nhwc, make_fusing_cuda_rig, "cuda fused");
}

// The stem's pool backward and its batch norm's as two calls (bench --stem-backward apart), in the
// fused step of each half precision and in tf32: the same comparison with fp64.
TEST(StepCudaTest, GradientsNhwcWithTheStemBackwardApart) {
  const StepConfig c = config(Precision::fp16, Layout::nhwc, StepMode::grads);
  testing::Rig rig = make_stem_apart_cuda_rig(c);
  ASSERT_TRUE(rig.step);
  EXPECT_EQ(calls_of(rig, CallKind::batch_norm_relu_max_pool_backward), 0);
  EXPECT_EQ(calls_of(rig, CallKind::max_pool_backward), 1);
  for (const Precision p : {Precision::fp16, Precision::bf16, Precision::tf32}) {
    testing::compare_gradients(p, Layout::nhwc, make_stem_apart_cuda_rig,
                               "cuda, stem backward apart");
  }
}

// The convolutions' statistics summed by dlprobe's pass over each output rather than in cuDNN's
// epilogue (bench --conv-sums pass): the same calls in the plan, the same comparison with fp64.
testing::Rig make_sums_pass_cuda_rig(const StepConfig& c) {
  return fusing_cuda_rig(true, false)(c);
}

TEST(StepCudaTest, Fp16GradientsNhwcWithTheConvolutionsSumsByAPass) {
  const StepConfig c = config(Precision::fp16, Layout::nhwc, StepMode::grads);
  testing::Rig rig = make_sums_pass_cuda_rig(c);
  ASSERT_TRUE(rig.step);
  EXPECT_EQ(calls_of(rig, CallKind::conv_forward_fused), 19);
  testing::compare_gradients(Precision::fp16, Layout::nhwc, make_sums_pass_cuda_rig,
                             "cuda fused, sums by a pass");
}

// Both passes: the batch norms' apply into scratch before each convolution that would take it as
// its prologue, and the sums after each output.
TEST(StepCudaTest, Fp16GradientsNhwcWithTheConvolutionsPrologueAndSumsByPasses) {
  testing::compare_gradients(Precision::fp16, Layout::nhwc, fusing_cuda_rig(true, true),
                             "cuda fused, prologue and sums by passes");
}

// bf16 takes batch norm inside the convolutions only with the sums pass (its statistics epilogue
// made the bf16 step slower than batch norm apart; bench's `--conv-sums auto` takes the pass in
// bf16), and keeps every normalised input (cuDNN has no engine for most bf16 prologues).
TEST(StepCudaTest, Bf16GradientsNhwcWithTheConvolutionsSumsByAPass) {
  const StepConfig c = config(Precision::bf16, Layout::nhwc, StepMode::grads);
  testing::Rig rig = make_sums_pass_cuda_rig(c);
  testing::Rig epilogue = make_fusing_cuda_rig(c);
  ASSERT_TRUE(rig.step && epilogue.step);
  EXPECT_EQ(calls_of(rig, CallKind::conv_forward_fused), 19);
  EXPECT_EQ(calls_of(epilogue, CallKind::conv_forward_fused), 0) << "bf16 without the pass";
  EXPECT_EQ(calls_of(rig, CallKind::conv_backward_weight_fused), 0) << "every input kept";
  testing::compare_gradients(Precision::bf16, Layout::nhwc, make_sums_pass_cuda_rig,
                             "cuda fused bf16, sums by a pass");
}

// tf32 (fp32 tensors) the same way.
TEST(StepCudaTest, Tf32GradientsNhwcWithTheConvolutionsSumsByAPass) {
  const StepConfig c = config(Precision::tf32, Layout::nhwc, StepMode::grads);
  testing::Rig rig = make_sums_pass_cuda_rig(c);
  ASSERT_TRUE(rig.step);
  EXPECT_EQ(calls_of(rig, CallKind::conv_forward_fused), 19);
  EXPECT_EQ(calls_of(rig, CallKind::conv_backward_data_add_relu), 7);
  testing::compare_gradients(Precision::tf32, Layout::nhwc, make_sums_pass_cuda_rig,
                             "cuda fused tf32, sums by a pass");
}

// Training steps too: the running statistics come from the finalize, and the weights move.
TEST(StepCudaTest, Fp16TrainSgdWithBatchNormInsideTheConvolutions) {
  testing::compare_training(Precision::fp16, OptimizerKind::sgd, make_fusing_cuda_rig,
                            "cuda fused");
}

// Recorded as a CUDA graph and replayed, the fused step computes what its eager steps compute.
// Not to the bit: its loss moves in the fifth digit between eager runs of one plan (see
// CudaBackend::fuses_conv_batch_norm); within 1e-3 of the loss and 1e-2 of fc's gradient.
TEST(StepCudaTest, FusedGraphReplayAgreesWithEagerSteps) {
  StepConfig c = config(Precision::fp16, Layout::nhwc, StepMode::grads);
  c.memory_plan = MemoryPlan::planned;
  testing::Rig eager = make_fusing_cuda_rig(c);
  c.graph = true;
  testing::Rig graph = make_fusing_cuda_rig(c);
  ASSERT_TRUE(eager.step && graph.step);
  for (int i = 0; i < 3; ++i) {  // eager, recorded and replayed, replayed
    Result<StepResult> a = eager.step->run_step();
    Result<StepResult> b = graph.step->run_step();
    ASSERT_TRUE(a.has_value() && b.has_value()) << b.status().message();
    EXPECT_NEAR(b->loss, a->loss, 1e-3 * std::abs(a->loss)) << "step " << i;
  }
  EXPECT_TRUE(graph.step->graph_recorded());
  EXPECT_GT(calls_of(graph, CallKind::conv_forward_fused), 0);
  EXPECT_LT(testing::norm_error(graph.step->gradient("fc.weight").value(),
                                eager.step->gradient("fc.weight").value()),
            1e-2);
}

// A planned step recorded as a CUDA graph and replayed computes what the eager step computes, to
// the bit (the same deterministic kernels on the same addresses).
TEST(StepCudaTest, GraphReplayMatchesEagerSteps) {
  for (const Precision precision : {Precision::fp32, Precision::fp16}) {
    StepConfig c = config(precision, Layout::nhwc, StepMode::grads);
    c.memory_plan = MemoryPlan::planned;
    testing::Rig eager = make_cuda_rig(c);
    c.graph = true;
    testing::Rig graph = make_cuda_rig(c);
    ASSERT_TRUE(eager.step && graph.step);
    for (int i = 0; i < 3; ++i) {  // eager, recorded and replayed, replayed
      Result<StepResult> a = eager.step->run_step();
      Result<StepResult> b = graph.step->run_step();
      ASSERT_TRUE(a.has_value() && b.has_value()) << b.status().message();
      EXPECT_EQ(a->loss, b->loss) << "step " << i;
    }
    // Else the comparison below would be of two eager runs.
    EXPECT_TRUE(graph.step->graph_recorded()) << precision_name(precision);
    for (const char* name : {"conv1.weight", "layer3.1.bn2.weight", "fc.weight"}) {
      const HostTensor ga = eager.step->gradient(name).value();
      const HostTensor gb = graph.step->gradient(name).value();
      // Element for element, inf and NaN included: under fp16 the stem's scaled gradient can
      // overflow at the first loss scale (the fp16 gradient comparison sees inf there in every
      // backend), and it must do so in both runs alike.
      EXPECT_TRUE(dlprobe::testing::identical(gb, ga))
          << name << " (" << precision_name(precision) << ")";
    }
    EXPECT_EQ(eager.step->tensor("bn1.running_mean")->get(3),
              graph.step->tensor("bn1.running_mean")->get(3));
  }
}

// Training replayed as a CUDA graph computes what eager training computes, to the bit, with
// either optimizer, from the optimizer's first step (SGD's momentum buffer and AdamW's moments
// start there) through fp16 loss scales that overflow (the steps skipped, the scale backed off)
// and grow every second clean step: the calls read the scale and the step count from the
// counters on the device, so one recording serves every step. Then five steps queued back to
// back, collected once, end where the eager ones do.
TEST(StepCudaTest, TrainGraphReplayMatchesEagerSteps) {
  for (const OptimizerKind optimizer : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    for (const Precision precision : {Precision::fp32, Precision::fp16}) {
      const std::string what =
          fmt::format("{} {}", optimizer_name(optimizer), precision_name(precision));
      StepConfig c = config(precision, Layout::nhwc, StepMode::train);
      c.memory_plan = MemoryPlan::planned;
      c.optimizer = optimizer;
      c.sgd.momentum = 0.9;
      c.scaler.init_scale = 1 << 20;  // fp16 gradients times 65536 already overflow at this size
      c.scaler.growth_interval = 2;
      testing::Rig eager = make_cuda_rig(c);
      c.graph = true;
      testing::Rig graph = make_cuda_rig(c);
      ASSERT_TRUE(eager.step && graph.step);
      int skipped = 0;
      for (int i = 0; i < 10; ++i) {
        Result<StepResult> a = eager.step->run_step();
        Result<StepResult> b = graph.step->run_step();
        ASSERT_TRUE(a.has_value() && b.has_value()) << b.status().message();
        EXPECT_EQ(a->loss, b->loss) << what << " step " << i;
        EXPECT_EQ(a->skipped, b->skipped) << what << " step " << i;
        EXPECT_EQ(a->loss_scale, b->loss_scale) << what << " step " << i;
        skipped += a->skipped ? 1 : 0;
      }
      EXPECT_TRUE(graph.step->graph_recorded()) << what;
      if (precision == Precision::fp16) {
        EXPECT_GT(skipped, 0) << what << ": no step skipped";
      }
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(eager.step->enqueue().is_ok());
        ASSERT_TRUE(graph.step->enqueue().is_ok());
      }
      Result<StepResult> a = eager.step->collect();
      Result<StepResult> b = graph.step->collect();
      ASSERT_TRUE(a.has_value() && b.has_value()) << b.status().message();
      EXPECT_EQ(a->loss, b->loss) << what;
      EXPECT_EQ(eager.step->loss_scale(), graph.step->loss_scale()) << what;
      EXPECT_EQ(eager.step->optimizer_steps(), graph.step->optimizer_steps()) << what;
      for (const char* name : {"conv1.weight", "layer3.1.bn2.weight", "fc.weight"}) {
        EXPECT_TRUE(dlprobe::testing::identical(graph.step->tensor(name).value(),
                                                eager.step->tensor(name).value()))
            << name << " (" << what << ")";
      }
    }
  }
}

// Weight gradients on a second stream (StepConfig::streams): with deterministic engines the same
// values to the bit as on one stream, eagerly and replayed as a graph (whose capture forks and
// joins the streams), also with stream 0 waiting for a weight gradient three calls behind
// (StepConfig::stream_lag); and the fused fp16 step and SGD training pass the fp64 comparison.
testing::Rig on_two_streams(StepConfig c, const testing::RigFactory& make) {
  c.streams = 2;
  c.memory_plan = MemoryPlan::planned;
  return make(c);
}

TEST(StepCudaTest, TwoStreamsMatchOneStream) {
  for (const Precision precision : {Precision::fp32, Precision::fp16}) {
    StepConfig c = config(precision, Layout::nhwc, StepMode::grads);
    c.memory_plan = MemoryPlan::planned;
    testing::Rig one = make_cuda_rig(c);
    testing::Rig two = on_two_streams(c, make_cuda_rig);
    c.stream_lag = 3;
    testing::Rig lagged_eager = on_two_streams(c, make_cuda_rig);
    c.graph = true;
    testing::Rig lagged = on_two_streams(c, make_cuda_rig);
    c.stream_lag = 0;
    testing::Rig graph = on_two_streams(c, make_cuda_rig);
    ASSERT_TRUE(one.step && two.step && graph.step && lagged.step && lagged_eager.step);
    int second = 0;
    for (const Call& call : two.step->calls()) second += call.stream;
    EXPECT_EQ(second, 20) << "ResNet-18's weight gradients";
    for (int i = 0; i < 3; ++i) {  // eager; recorded and replayed; replayed
      const double want = testing::run(one);
      EXPECT_EQ(testing::run(two), want) << "step " << i;
      EXPECT_EQ(testing::run(graph), want) << "step " << i;
      EXPECT_EQ(testing::run(lagged), want) << "step " << i << ", lag 3";
      EXPECT_EQ(testing::run(lagged_eager), want) << "step " << i << ", lag 3, eager";
    }
    EXPECT_TRUE(graph.step->graph_recorded()) << precision_name(precision);
    for (const char* name :
         {"conv1.weight", "layer1.0.conv1.weight", "layer3.0.downsample.0.weight",
          "layer4.1.conv2.weight", "fc.weight"}) {
      const HostTensor want = one.step->gradient(name).value();
      EXPECT_TRUE(dlprobe::testing::identical(two.step->gradient(name).value(), want))
          << name << " (" << precision_name(precision) << ", eager)";
      EXPECT_TRUE(dlprobe::testing::identical(graph.step->gradient(name).value(), want))
          << name << " (" << precision_name(precision) << ", graph)";
      EXPECT_TRUE(dlprobe::testing::identical(lagged.step->gradient(name).value(), want))
          << name << " (" << precision_name(precision) << ", graph, lag 3)";
      EXPECT_TRUE(dlprobe::testing::identical(lagged_eager.step->gradient(name).value(), want))
          << name << " (" << precision_name(precision) << ", eager, lag 3)";
    }
  }
}

TEST(StepCudaTest, Fp16GradientsOnTwoStreamsWithBatchNormInsideTheConvolutions) {
  testing::compare_gradients(
      Precision::fp16, Layout::nhwc,
      [](const StepConfig& c) { return on_two_streams(c, make_fusing_cuda_rig); },
      "cuda fused, two streams");
}

TEST(StepCudaTest, Fp16TrainSgdOnTwoStreams) {
  testing::compare_training(
      Precision::fp16, OptimizerKind::sgd,
      [](const StepConfig& c) { return on_two_streams(c, make_cuda_rig); }, "cuda, two streams");
}

// Block outputs recomputed in the backward pass (StepConfig::recompute_block_outputs) over the
// fused fp16 step: the gradients pass the fp64 comparison, and the plan recomputes.
testing::Rig recomputing(StepConfig c) {
  c.recompute_block_outputs = true;
  c.memory_plan = MemoryPlan::planned;
  return make_fusing_cuda_rig(c);
}

TEST(StepCudaTest, Fp16GradientsWithRecomputedBlockOutputs) {
  testing::Rig r = recomputing(config(Precision::fp16, Layout::nhwc, StepMode::grads));
  ASSERT_TRUE(r.step);
  int recomputed = 0;
  int recast = 0;
  for (const Call& call : r.step->calls()) {
    recomputed += call.name.ends_with(".recompute") ? 1 : 0;
    recast += call.name == "conv1.input.cast.recompute" ? 1 : 0;
  }
  EXPECT_EQ(recomputed, 8) << "ResNet-18: 7 block outputs (the 3 projection shortcuts' batch "
                              "norms in their passes) and the images' fp16 cast";
  EXPECT_EQ(recast, 1) << "conv1's weight gradient casts the images again";
  testing::compare_gradients(Precision::fp16, Layout::nhwc, recomputing,
                             "cuda fused, recomputed block outputs");
}

TEST(StepCudaTest, Fp16TrainSgdWithRecomputedBlockOutputs) {
  testing::compare_training(Precision::fp16, OptimizerKind::sgd, recomputing,
                            "cuda fused, recomputed block outputs");
}

TEST(StepCudaTest, InferLoss) {
  const StepConfig c = config(Precision::fp32, Layout::nhwc, StepMode::infer);
  testing::Rigs r = testing::make_rigs(c, make_cuda_rig);
  ASSERT_TRUE(r.exact.step && r.ref.step && r.dut.step);
  const double le = testing::run(r.exact);
  const double lr = testing::run(r.ref);
  const double lg = r.dut.step->run_step()->loss;
  EXPECT_LE(std::abs(lg - le), 4 * std::abs(lr - le) + 1e-4 * std::abs(le));
}

}  // namespace
}  // namespace dlprobe::engine
