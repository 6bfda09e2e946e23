// The planned call list, memory accounting, the whole-network gradient check, and state dicts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "step_test_util.h"

namespace dlprobe::engine {
namespace {

using memory::Category;
using testing::make_rig;
using testing::run;
using testing::tiny_config;

// How many calls of the plan have each name and each kind.
struct CallCounts {
  std::map<std::string, int> names;
  std::map<CallKind, int> kinds;
};
CallCounts count_calls(const TrainingStep& step) {
  CallCounts c;
  for (const Call& call : step.calls()) {
    ++c.names[call.name];
    ++c.kinds[call.kind];
  }
  return c;
}

TEST(StepPlanTest, CallListNamesEveryOpAndPairsAllocationsWithFrees) {
  StepConfig c = tiny_config();
  c.fuse = false;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  auto [names, kinds] = count_calls(*r.step);
  for (const Call& call : r.step->calls()) EXPECT_FALSE(call.layer.empty()) << call.name;
  EXPECT_EQ(names["layer1.0.conv1.forward"], 1);
  EXPECT_EQ(names["layer1.0.conv1.backward_data"], 1);
  EXPECT_EQ(names["conv1.backward_data"], 0);  // the images need no gradient
  EXPECT_EQ(names["layer2.0.downsample.1.backward"], 1);
  EXPECT_EQ(kinds[CallKind::alloc], kinds[CallKind::free]);
  EXPECT_EQ(kinds[CallKind::conv_forward], 20);  // 17 convs + 3 projection shortcuts
  EXPECT_EQ(kinds[CallKind::conv_backward_weight], 20);
  EXPECT_EQ(kinds[CallKind::conv_backward_data], 19);
  EXPECT_EQ(kinds[CallKind::batch_norm_train_forward], 20);
  EXPECT_EQ(kinds[CallKind::cast], 0);  // fp32: no working copies
  // The optimizer, then the step counted for the next.
  ASSERT_GE(r.step->calls().size(), 2U);
  EXPECT_EQ(r.step->calls().rbegin()[1].kind, CallKind::sgd_step);
  EXPECT_EQ(r.step->calls().back().kind, CallKind::advance_step);
  for (const Call& call : r.step->calls()) {
    if (call.name == "layer3.1.conv2.forward") {
      EXPECT_EQ(call.layer, "layer3.1.conv2");
    }
  }
}

// ResNet-18: the stem's BN and each block's first BN take their ReLU (9); each block's last BN
// before the sum takes the add and the ReLU (8: bn2, or downsample.1 where the shortcut projects);
// the 3 blocks with a projection keep bn2 plain. The stem's BN + ReLU also takes the max pool
// after it, whose input is then never stored. Backward: the 9 BN+ReLU pairs fuse; the ReLUs
// after a sum stay apart (the sum's gradient also flows down the shortcut), and 7 of them take in
// the sum of their own gradient's two terms (next block and its shortcut); the last block's ReLU
// feeds only the pooling, and the max pool's gradient sum stays an add.
TEST(StepPlanTest, FusesBatchNormWithReluAndResidualAdd) {
  StepConfig c = tiny_config();
  c.fuse_conv = false;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  auto [names, kinds] = count_calls(*r.step);
  EXPECT_EQ(kinds[CallKind::batch_norm_train_forward], 3);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_train_forward], 16);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_max_pool_train_forward], 1);
  EXPECT_EQ(kinds[CallKind::max_pool_forward], 0);
  EXPECT_EQ(kinds[CallKind::relu_forward], 0);
  EXPECT_EQ(kinds[CallKind::add], 1);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_backward], 9);
  EXPECT_EQ(kinds[CallKind::batch_norm_backward], 11);
  EXPECT_EQ(kinds[CallKind::relu_backward_add], 7);
  EXPECT_EQ(kinds[CallKind::relu_backward], 1);
  EXPECT_EQ(names["layer1.0.relu2.backward+grad_accumulate"], 1);
  EXPECT_EQ(names["bn1.forward+relu+maxpool"], 1);
  EXPECT_EQ(names["layer1.0.bn2.forward+add+relu"], 1);
  EXPECT_EQ(names["layer2.0.downsample.1.forward+add+relu"], 1);
  EXPECT_EQ(names["layer2.0.bn2.forward"], 1);
  EXPECT_EQ(kinds[CallKind::alloc], kinds[CallKind::free]);
}

// Batch norm inside the convolutions (the reference backend offers it in fp64 NHWC). All 20
// batch norms read a convolution's output alone; every convolution but the stem's (which reads
// the images) sums its output, and those 19 batch norms finalize from the sums. The 8 blocks'
// first BN + ReLU feed only the block's second convolution, which applies them as it loads its
// input: those 8 take no elementwise pass, their output is never stored, their finalize is made
// in that convolution's call, and the convolution's weight gradient recomputes its input. Of the
// other 11, the 3 projection blocks' bn2 (whose output only the add reads) are applied in their
// block output's pass with the shortcut's batch norm (batch_norm_apply_add), never stored, and
// that pass finalizes both; the other 5 block outputs take a pass each, which finalizes too: no
// finalize has a call of its own. The stem's BN + ReLU keeps its own statistics pass, and the
// max pool after it runs in its call.
// Backward, the 7 block outputs whose gradient arrives as two terms take it in the data gradient
// of the next block's first convolution (one of the terms), which is never stored: 7 of the 19
// data gradients, and no relu_backward_add. The 3 pairs of batch norms that a block output's pass
// summed take their one gradient in one call each (batch_norm_add_backward), which leaves 5 plain
// backwards of the 11. In NHWC the stem's BN + ReLU take their backward in the max pool's call,
// which leaves 8 of the 9 BN + ReLU backwards.
TEST(StepPlanTest, FusesBatchNormIntoConvolutions) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp64;
  c.layout = Layout::nhwc;
  testing::Rig r = make_rig(c, DType::fp64);
  ASSERT_TRUE(r.step);
  auto [names, kinds] = count_calls(*r.step);
  EXPECT_EQ(kinds[CallKind::conv_forward], 1);
  EXPECT_EQ(kinds[CallKind::conv_forward_fused], 19);
  EXPECT_EQ(kinds[CallKind::batch_norm_apply], 5);
  EXPECT_EQ(kinds[CallKind::batch_norm_apply_add], 3);
  EXPECT_EQ(kinds[CallKind::batch_norm_train_forward], 0);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_train_forward], 0);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_max_pool_train_forward], 1);
  EXPECT_EQ(kinds[CallKind::conv_backward_weight_fused], 8);
  EXPECT_EQ(kinds[CallKind::conv_backward_weight], 12);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_backward], 8);
  EXPECT_EQ(kinds[CallKind::batch_norm_relu_max_pool_backward], 1);
  EXPECT_EQ(kinds[CallKind::max_pool_backward], 0);
  EXPECT_EQ(names["maxpool.backward+relu+bn1"], 1);
  EXPECT_EQ(kinds[CallKind::conv_backward_data_add_relu], 7);
  EXPECT_EQ(kinds[CallKind::conv_backward_data], 12);
  EXPECT_EQ(kinds[CallKind::relu_backward_add], 0);
  EXPECT_EQ(kinds[CallKind::batch_norm_add_backward], 3);
  EXPECT_EQ(kinds[CallKind::batch_norm_backward], 5);
  EXPECT_EQ(names["layer2.0.downsample.1+layer2.0.bn2.backward"], 1);
  EXPECT_EQ(names["layer2.0.bn2.backward"], 0);
  EXPECT_EQ(names["layer1.1.conv1.backward_data+layer1.0.relu2.backward+grad_accumulate"], 1);
  EXPECT_EQ(names["layer1.0.conv1.forward+sums"], 1);
  EXPECT_EQ(names["layer1.0.bn1.finalize+layer1.0.conv2.forward+layer1.0.bn1+sums"], 1);
  EXPECT_EQ(names["layer1.0.conv2.backward_weight+layer1.0.bn1"], 1);
  EXPECT_EQ(names["layer1.0.bn1.finalize"], 0);
  EXPECT_EQ(names["layer1.0.bn2.finalize"], 0);
  EXPECT_EQ(names["layer1.0.bn2.finalize+apply+add+relu"], 1);
  EXPECT_EQ(names["layer2.0.bn2.finalize"], 0);
  EXPECT_EQ(names["layer2.0.downsample.1.finalize"], 0);
  EXPECT_EQ(names["layer2.0.downsample.1.finalize+layer2.0.bn2.finalize+apply+add+relu"], 1);
  EXPECT_EQ(names["bn1.forward+relu+maxpool"], 1);
  EXPECT_EQ(kinds[CallKind::alloc], kinds[CallKind::free]);

  // The 8 normalised tensors are not kept: the forward's activations peak lower by at least
  // their bytes less the prologues' scale and bias (at most 1 KiB each in fp64).
  c.fuse_conv = false;
  testing::Rig apart = make_rig(c, DType::fp64);
  ASSERT_TRUE(apart.step);
  run(r);
  run(apart);
  std::int64_t normalised = 0;
  const std::vector<Shape> shapes = r.step->model().value_shapes(c.batch, true).value();
  for (const model::Layer& l : r.step->model().layers()) {
    if (l.kind == model::LayerKind::relu && l.name.ends_with(".relu1")) {
      normalised += shapes[static_cast<std::size_t>(l.output)].numel() * 8;
    }
  }
  ASSERT_GT(normalised, 0);
  const std::int64_t fused_peak = r.allocator->stats()[Category::activations].allocated_bytes_peak;
  const std::int64_t apart_peak =
      apart.allocator->stats()[Category::activations].allocated_bytes_peak;
  EXPECT_LE(fused_peak, apart_peak - normalised + 8 * 2 * 1024) << normalised;
}

// Fused and unfused plans compute the same step: in fp64 they agree to rounding, with batch norm
// inside the convolutions, with only BN + ReLU fused, and with nothing fused.
TEST(StepPlanTest, FusedAndUnfusedStepsAgree) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp64;
  c.layout = Layout::nhwc;
  testing::Rig fused = make_rig(c, DType::fp64);
  c.fuse_conv = false;
  testing::Rig bn_relu = make_rig(c, DType::fp64);
  c.fuse = false;
  testing::Rig plain = make_rig(c, DType::fp64);
  ASSERT_TRUE(fused.step && bn_relu.step && plain.step);
  for (int i = 0; i < 2; ++i) {
    const double loss = run(plain);
    EXPECT_NEAR(run(fused), loss, 1e-12);
    EXPECT_NEAR(run(bn_relu), loss, 1e-12);
  }
  for (const char* name :
       {"conv1.weight", "layer1.0.conv2.weight", "layer1.0.bn1.weight", "layer1.0.bn1.running_var",
        "layer1.0.bn2.weight", "layer2.0.downsample.0.weight"}) {
    const HostTensor want = plain.step->tensor(name).value();
    for (const testing::Rig* rig : {&fused, &bn_relu}) {
      const HostTensor got = rig->step->tensor(name).value();
      for (std::int64_t k = 0; k < got.numel(); ++k) {
        ASSERT_NEAR(got.get(k), want.get(k), 1e-12) << name;
      }
    }
  }
}

// A rig whose reference backend asks for every normalised input of a convolution to be kept
// (make_reference_backend's keeps_normalised), or for none.
testing::Rig make_prologue_rig(const StepConfig& c, bool keeps_normalised) {
  return testing::make_rig_on(
      c, std::unique_ptr<memory::MemorySource>(std::make_unique<memory::HostMemorySource>()),
      [keeps_normalised](memory::CachingAllocator&) {
        return make_reference_backend(DType::fp64, 1, keeps_normalised);
      });
}

// Where the backend asks for it, the batch norm takes its own pass and its output is kept: no
// convolution takes a prologue, the weight gradients read the kept tensors as they are, and the
// step computes what the plain one does. Recomputing the block outputs (to hold less) keeps the
// prologues.
TEST(StepPlanTest, KeepsTheNormalisedInputWhereThePrologueIsAPass) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp64;
  c.layout = Layout::nhwc;
  testing::Rig kept = make_prologue_rig(c, true);
  testing::Rig fused = make_prologue_rig(c, false);
  StepConfig apart = c;
  apart.fuse = false;
  testing::Rig plain = make_prologue_rig(apart, false);
  ASSERT_TRUE(kept.step && fused.step && plain.step);
  auto [names, kinds] = count_calls(*kept.step);
  EXPECT_EQ(kinds[CallKind::conv_backward_weight_fused], 0);
  EXPECT_EQ(kinds[CallKind::conv_backward_weight], 20);
  EXPECT_EQ(names["layer1.0.bn1.finalize+apply+relu"], 1);
  EXPECT_EQ(names["layer1.0.conv2.forward+sums"], 1);
  EXPECT_EQ(names["layer1.0.conv2.backward_weight"], 1);
  EXPECT_EQ(names["layer1.0.bn1.finalize+layer1.0.conv2.forward+layer1.0.bn1+sums"], 0);
  EXPECT_EQ(names["layer1.0.conv2.backward_weight+layer1.0.bn1"], 0);
  // The statistics still come from the convolutions' sums.
  EXPECT_EQ(names["layer1.0.conv1.forward+sums"], 1);
  EXPECT_EQ(kinds[CallKind::batch_norm_train_forward], 0);
  EXPECT_EQ(count_calls(*fused.step).kinds[CallKind::conv_backward_weight_fused], 8);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(run(kept), run(plain), 1e-12);
  for (const char* name : {"conv1.weight", "layer1.0.conv2.weight", "layer1.0.bn1.weight",
                           "layer1.0.bn1.running_var", "layer2.0.conv2.weight"}) {
    const HostTensor want = plain.step->tensor(name).value();
    const HostTensor got = kept.step->tensor(name).value();
    for (std::int64_t k = 0; k < got.numel(); ++k) {
      ASSERT_NEAR(got.get(k), want.get(k), 1e-12) << name;
    }
  }
  c.recompute_block_outputs = true;
  testing::Rig recomputed = make_prologue_rig(c, true);
  ASSERT_TRUE(recomputed.step);
  EXPECT_EQ(count_calls(*recomputed.step).kinds[CallKind::conv_backward_weight_fused], 8);
}

// The named state entries of two steps agree to the bit: after training their weights, else
// their gradients.
void expect_same_state(const testing::Rig& got, const testing::Rig& want, StepMode mode,
                       std::initializer_list<const char*> names, const std::string& what) {
  const bool train = mode == StepMode::train;
  for (const char* name : names) {
    const HostTensor w =
        train ? want.step->tensor(name).value() : want.step->gradient(name).value();
    const HostTensor g = train ? got.step->tensor(name).value() : got.step->gradient(name).value();
    ASSERT_EQ(g.numel(), w.numel());
    for (std::int64_t j = 0; j < g.numel(); ++j) {
      ASSERT_EQ(g.get(j), w.get(j)) << what << " " << name << " [" << j << "]";
    }
  }
}

// The step over two streams on the reference backend, whose second stream runs its work at the
// next join: a wait left out, or an operand's memory reused before the join, changes the values.
testing::Rig two_stream_rig(StepConfig c, int streams, std::int64_t lag = 0) {
  c.streams = streams;
  c.stream_lag = lag;
  c.memory_plan = MemoryPlan::planned;
  return testing::make_rig_on(
      c, std::unique_ptr<memory::MemorySource>(std::make_unique<memory::HostMemorySource>()),
      [streams](memory::CachingAllocator&) {
        return make_reference_backend(DType::fp64, streams);
      });
}

TEST(StepPlanTest, WeightGradientsRunOnTheSecondStream) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp16;
  c.layout = Layout::nhwc;
  c.mode = StepMode::grads;
  testing::Rig r = two_stream_rig(c, 2);
  ASSERT_TRUE(r.step);
  int second = 0;
  std::int64_t last_second = -1;
  std::vector<std::string> waits;
  const std::vector<Call>& calls = r.step->calls();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const Call& call = calls[i];
    const bool weight_grad = call.kind == CallKind::conv_backward_weight ||
                             call.kind == CallKind::conv_backward_weight_fused;
    EXPECT_EQ(call.stream, weight_grad ? 1 : 0) << call.name;
    EXPECT_EQ(call.fork, weight_grad) << call.name;
    if (call.stream == 1) {
      ++second;
      last_second = static_cast<std::int64_t>(i);
    }
    if (call.join_through >= 0) {
      waits.push_back(call.name);
      EXPECT_EQ(call.join_through, last_second) << call.name;
    }
  }
  EXPECT_EQ(second, 20);  // ResNet-18's convolutions
  // Stream 0 waits once in the step: before the cast that reads the fp16 weight gradients, for
  // all of them (and at the step's end, the runtime's).
  EXPECT_EQ(waits, std::vector<std::string>{"weights.grad.cast"});
  // One stream: no call leaves stream 0.
  testing::Rig one = two_stream_rig(c, 1);
  ASSERT_TRUE(one.step);
  for (const Call& call : one.step->calls())
    EXPECT_FALSE(call.stream != 0 || call.fork || call.join_through >= 0);
}

TEST(StepPlanTest, TwoStreamStepsAgreeWithOneStream) {
  struct Case {
    Precision precision;
    Layout layout;
    StepMode mode;
  };
  // fp16: the weight gradients go to low-precision temporaries, which one cast reads at the end.
  for (const Case& k : {Case{Precision::fp64, Layout::nhwc, StepMode::grads},
                        Case{Precision::fp64, Layout::nhwc, StepMode::train},
                        Case{Precision::fp64, Layout::nchw, StepMode::train},
                        Case{Precision::fp16, Layout::nhwc, StepMode::grads}}) {
    StepConfig c = tiny_config();
    c.precision = k.precision;
    c.layout = k.layout;
    c.mode = k.mode;
    c.scaler.init_scale = 1.0;  // fp16 gradients times 65536 overflow at this size
    testing::Rig one = two_stream_rig(c, 1);
    ASSERT_TRUE(one.step);
    std::vector<double> losses;
    for (int i = 0; i < 2; ++i) losses.push_back(run(one));
    // Without a bound, and with stream 0 waiting after one call and after three: each wait moves
    // the end of what the arena keeps for the second stream.
    for (const std::int64_t lag : {0, 1, 3}) {
      testing::Rig two = two_stream_rig(c, 2, lag);
      ASSERT_TRUE(two.step);
      const std::string what = fmt::format("{} {} {} lag {}", precision_name(k.precision),
                                           layout_name(k.layout), step_mode_name(k.mode), lag);
      for (int i = 0; i < 2; ++i) EXPECT_EQ(run(two), losses[static_cast<std::size_t>(i)]) << what;
      expect_same_state(two, one, k.mode,
                        {"conv1.weight", "layer1.0.conv2.weight", "layer2.0.conv1.weight",
                         "layer2.0.downsample.0.weight", "layer4.1.conv2.weight"},
                        what);
    }
  }
}

// StepConfig::stream_lag: stream 0 has waited for every weight gradient more than `lag` calls
// behind it, and for no other but those the unbounded step waits for, so the arena keeps their
// operands less long: ResNet-50's fp16 gradients plan an arena between one stream's and two
// unbounded streams'.
TEST(StepPlanTest, AStreamLagBoundsTheSecondStreamsArena) {
  StepConfig c = tiny_config(64, 8, 10);
  c.model = {model::Arch::resnet50, 64, 10, false, 64};
  c.precision = Precision::fp16;
  c.layout = Layout::nhwc;
  c.mode = StepMode::grads;
  // Per call, the newest stream-1 call stream 0 has waited for by then (-1: none).
  const auto joined_by = [](const std::vector<Call>& calls) {
    std::vector<std::int64_t> out;
    std::int64_t joined = -1;
    for (const Call& call : calls) {
      joined = std::max(joined, call.join_through);
      out.push_back(joined);
    }
    return out;
  };
  testing::Rig one = two_stream_rig(c, 1);
  testing::Rig unbounded = two_stream_rig(c, 2);
  ASSERT_TRUE(one.step && unbounded.step);
  const std::vector<Call>& calls = unbounded.step->calls();
  const std::vector<std::int64_t> must = joined_by(calls);
  for (const std::int64_t lag : {1, 16}) {
    testing::Rig r = two_stream_rig(c, 2, lag);
    ASSERT_TRUE(r.step);
    ASSERT_EQ(r.step->calls().size(), calls.size());
    const std::vector<std::int64_t> got = joined_by(r.step->calls());
    std::int64_t behind = -1;  // the newest stream-1 call more than `lag` before call i
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const auto at = static_cast<std::int64_t>(i);
      for (std::int64_t j = behind + 1; j < at - lag; ++j) {
        if (calls[static_cast<std::size_t>(j)].stream == 1) behind = j;
      }
      if (calls[i].stream == 0) {
        EXPECT_EQ(got[i], std::max(must[i], behind)) << "lag " << lag << ": " << calls[i].name;
      }
    }
  }
  const auto arena = [](const testing::Rig& r) { return r.step->arena().value().bytes; };
  testing::Rig lag16 = two_stream_rig(c, 2, 16);
  ASSERT_TRUE(lag16.step);
  EXPECT_LT(arena(one), arena(unbounded));
  EXPECT_LE(arena(one), arena(lag16));
  // Measured: 1.4 % above one stream's at lag 8, 3.7 % at 32, 16.8 % unbounded.
  EXPECT_LT(static_cast<double>(arena(lag16)), 1.05 * static_cast<double>(arena(one)));
}

// The max pool after the stem's batch norm + ReLU finds its forward's and its backward's maxima in
// the ReLU's output computed from the batch norm's input, so that output is never stored
// (FusedAndUnfusedStepsAgree checks the values against the unfused step, which keeps it).
TEST(StepPlanTest, MaxPoolRecomputesItsInputFromTheBatchNorm) {
  for (const bool fuse : {true, false}) {
    StepConfig c = tiny_config();
    c.fuse = fuse;
    testing::Rig r = make_rig(c);
    ASSERT_TRUE(r.step);
    EXPECT_EQ(count_calls(*r.step).names.count("maxpool.backward+bn1"), fuse ? 1u : 0u);
    // Fused, the ReLU's output is not even a temporary: the max pool's forward runs in the batch
    // norm's call and normalises as it loads.
    int kept = 0;
    int buffers = 0;
    for (const TransientBuffer& t : r.step->transients()) {
      if (t.owner != "relu" || t.gradient) continue;
      ++buffers;
      kept += t.category == Category::activations ? 1 : 0;
    }
    EXPECT_EQ(kept, fuse ? 0 : 1) << (fuse ? "fused" : "unfused");
    EXPECT_EQ(buffers, fuse ? 0 : 1) << (fuse ? "fused" : "unfused");
  }
}

// In NHWC the stem's batch norm + ReLU take their backward in the max pool's call, which gathers
// the pool's gradient as it goes at the windows' maxima the forward kept: the pool's input
// gradient is no buffer, and neither the batch norm nor the ReLU has a backward call of its own.
// NCHW keeps the pool's backward apart.
TEST(StepPlanTest, MaxPoolTakesTheStemBatchNormBackwardInNhwc) {
  for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
    StepConfig c = tiny_config();
    c.layout = layout;
    testing::Rig r = make_rig(c);
    ASSERT_TRUE(r.step);
    const bool nhwc = layout == Layout::nhwc;
    auto [names, kinds] = count_calls(*r.step);
    EXPECT_EQ(names["maxpool.backward+relu+bn1"], nhwc ? 1 : 0);
    EXPECT_EQ(names["maxpool.backward+bn1"], nhwc ? 0 : 1);
    EXPECT_EQ(names["bn1.backward+relu"], nhwc ? 0 : 1);
    // The pool's output, and in NHWC where its windows' maxima lie, which the forward keeps for
    // the backward.
    int pool_gradients = 0;
    int pool_kept = 0;
    for (const TransientBuffer& t : r.step->transients()) {
      if (t.owner != "maxpool") continue;
      ++(t.gradient ? pool_gradients : pool_kept);
    }
    EXPECT_EQ(pool_gradients, nhwc ? 0 : 1) << layout_name(layout);
    EXPECT_EQ(pool_kept, nhwc ? 2 : 1) << layout_name(layout);
  }
}

// The most bytes of activations and temporaries live at one call.
std::uint64_t transient_peak(const TrainingStep& step) {
  std::uint64_t peak = 0;
  for (std::size_t i = 0; i < step.calls().size(); ++i) {
    std::uint64_t live = 0;
    for (const TransientBuffer& t : step.transients()) {
      if (t.first_call <= i && i <= t.last_call) live += t.bytes;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

// Step `c` in fp64 NHWC (where the reference backend runs batch norm inside the convolutions),
// keeping its block outputs and recomputing them, over the planned arena (one stream) or not.
struct KeptAndRecomputed {
  testing::Rig kept;
  testing::Rig again;
};
KeptAndRecomputed kept_and_recomputed(StepConfig c, bool planned) {
  c.precision = Precision::fp64;
  c.layout = Layout::nhwc;
  auto rig = [&](bool recompute) {
    c.recompute_block_outputs = recompute;
    return planned ? two_stream_rig(c, 1) : make_rig(c, DType::fp64);
  };
  KeptAndRecomputed r{rig(false), rig(true)};
  return r;
}

// Block outputs recomputed in the backward pass (fp64 NHWC, where the reference backend runs
// batch norm inside the convolutions): the same losses and values to the bit as the step that
// keeps them, over planned memory (whose arena hands a dead buffer's bytes to the next) and over
// memory taken per buffer.
TEST(StepPlanTest, RecomputedBlockOutputsAgreeToTheBitAndKeepFewerActivations) {
  for (const StepMode mode : {StepMode::grads, StepMode::train}) {
    for (const bool planned : {true, false}) {
      StepConfig c = tiny_config();
      c.mode = mode;
      auto [kept, again] = kept_and_recomputed(c, planned);
      ASSERT_TRUE(kept.step && again.step);
      const std::string what =
          fmt::format("{}, {}", step_mode_name(mode), planned ? "planned" : "dynamic");
      // ResNet-18's 8 blocks: the last one's output is kept (no activation is kept after it to
      // make room for its chain); the other 7 are recomputed, those of layers 2 to 4's first
      // blocks with the batch norm of their projection shortcut (in ResNet-18 bn2, whose output
      // the shortcut's batch norm takes in) in the same pass. Their shortcut's convolutions are
      // not run again: each reads a block output that is itself recomputed.
      const CallCounts calls = count_calls(*again.step);
      int recomputed = 0;
      for (const auto& [name, n] : calls.names) {
        if (name.ends_with(".recompute")) recomputed += n;
      }
      EXPECT_EQ(recomputed, 7) << what;
      EXPECT_EQ(calls.names.count("layer1.0.bn2.apply+add+relu.recompute"), 1u) << what;
      EXPECT_EQ(
          calls.names.count("layer2.0.downsample.1.apply+layer2.0.bn2.apply+add+relu.recompute"),
          1u)
          << what;
      EXPECT_EQ(calls.names.count("layer4.1.bn2.apply+add+relu.recompute"), 0u) << what;
      const CallCounts kept_calls = count_calls(*kept.step);
      EXPECT_EQ(kept_calls.kinds.at(CallKind::batch_norm_apply),
                calls.kinds.at(CallKind::batch_norm_apply) - 4)
          << what;
      EXPECT_EQ(kept_calls.kinds.at(CallKind::batch_norm_apply_add),
                calls.kinds.at(CallKind::batch_norm_apply_add) - 3)
          << what;
      // Lower by more than a tenth at this size; a backward that read the forward's buffers
      // would keep them to the end and hold as much as the step that keeps them.
      EXPECT_LT(transient_peak(*again.step), transient_peak(*kept.step) * 9 / 10) << what;
      for (int i = 0; i < 2; ++i) EXPECT_EQ(run(again), run(kept)) << what;
      expect_same_state(again, kept, mode,
                        {"conv1.weight", "layer1.0.conv1.weight", "layer1.1.bn2.weight",
                         "layer2.0.downsample.0.weight", "layer2.1.conv1.weight",
                         "layer3.0.conv1.weight", "layer4.0.downsample.1.bias"},
                        what);
    }
  }
}

// A bottleneck ResNet's first block (layer1.0) reads the max pool's output, which the step keeps:
// with the block outputs recomputed, the backward runs its projection's convolution again rather
// than keep that output, with the forward's own call, so the gradients stay the same to the bit.
// So does layer4.0, whose input (layer3's output) the planner keeps; layer2.0's and layer3.0's
// projections read recomputed outputs and their outputs are kept.
TEST(StepPlanTest, ProjectionConvolutionRunAgainAgreesToTheBit) {
  for (const bool planned : {true, false}) {
    StepConfig c = tiny_config();
    c.model = {model::Arch::resnet50, 32, 10, false, 8};
    c.mode = StepMode::grads;
    auto [kept, again] = kept_and_recomputed(c, planned);
    ASSERT_TRUE(kept.step && again.step);
    const std::string what = planned ? "planned" : "dynamic";
    const CallCounts calls = count_calls(*again.step);
    for (const char* stage : {"layer1.0", "layer2.0", "layer3.0", "layer4.0"}) {
      const bool input_kept = stage == std::string("layer1.0") || stage == std::string("layer4.0");
      EXPECT_EQ(calls.names.count(fmt::format("{}.downsample.0.forward+sums.recompute", stage)),
                input_kept ? 1u : 0u)
          << what << " " << stage;
    }
    EXPECT_EQ(count_calls(*kept.step).kinds.at(CallKind::conv_forward_fused),
              calls.kinds.at(CallKind::conv_forward_fused) - 2)
        << what;
    for (int i = 0; i < 2; ++i) EXPECT_EQ(run(again), run(kept)) << what;
    expect_same_state(again, kept, StepMode::grads,
                      {"conv1.weight", "layer1.0.conv1.weight", "layer1.0.downsample.0.weight",
                       "layer1.0.downsample.1.weight", "layer4.0.downsample.0.weight"},
                      what);
  }
}

// Where batch norm does not run inside the convolutions (the reference backend: fp32) nothing
// can be recomputed: the step keeps its outputs and its config says so.
TEST(StepPlanTest, RecomputeWithoutBatchNormInsideTheConvolutionsKeepsTheOutputs) {
  StepConfig c = tiny_config();
  c.layout = Layout::nhwc;
  c.recompute_block_outputs = true;
  testing::Rig fp32 = make_rig(c);
  c.precision = Precision::fp64;
  testing::Rig fp64 = make_rig(c, DType::fp64);
  ASSERT_TRUE(fp32.step && fp64.step);
  EXPECT_FALSE(fp32.step->config().recompute_block_outputs);
  EXPECT_TRUE(fp64.step->config().recompute_block_outputs);
  for (const Call& call : fp32.step->calls()) EXPECT_FALSE(call.name.ends_with(".recompute"));
}

TEST(StepPlanTest, MixedPrecisionCastsWorkingCopiesAndGradients) {
  StepConfig c = tiny_config();
  c.precision = Precision::fp16;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  auto [names, kinds] = count_calls(*r.step);
  // Every working copy in one call, every gradient in one call.
  EXPECT_EQ(names["weights.cast"], 1);
  EXPECT_EQ(names["weights.grad.cast"], 1);
  EXPECT_EQ(names["layer1.0.conv1.weight.cast"], 0);
  EXPECT_EQ(names["fc.bias.cast"], 0);
  EXPECT_EQ(names["conv1.input.cast"], 1);
  EXPECT_EQ(names["loss.logits.cast"], 1);
  EXPECT_EQ(names["bn1.weight.cast"], 0);  // batch norm keeps fp32 parameters
  EXPECT_EQ(kinds[CallKind::unscale_gradients], 1);
  EXPECT_EQ(r.step->calls().front().name, "grad_scaler.reset_found_inf");
}

TEST(StepPlanTest, InferPlansNoBackwardAndNoGradients) {
  StepConfig c = tiny_config();
  c.mode = StepMode::infer;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  for (const Call& call : r.step->calls()) {
    EXPECT_NE(call.kind, CallKind::conv_backward_data) << call.name;
    EXPECT_NE(call.kind, CallKind::batch_norm_train_forward) << call.name;
  }
  const memory::MemoryStats s = r.allocator->stats();
  EXPECT_EQ(s[Category::gradients].allocated_bytes, 0);
  EXPECT_EQ(s[Category::optimizer_state].allocated_bytes, 0);
  EXPECT_EQ(s[Category::activations].allocation_count, 0);
}

TEST(StepPlanTest, MemoryIsAccountedByCategoryAndFreedAfterTheStep) {
  StepConfig c = tiny_config();
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const std::int64_t params = r.step->model().parameter_count();
  run(r);
  const memory::MemoryStats s = r.allocator->stats();
  EXPECT_GE(s[Category::weights].allocated_bytes, params * 4);
  EXPECT_GE(s[Category::gradients].allocated_bytes, params * 4);
  EXPECT_GE(s[Category::optimizer_state].allocated_bytes, params * 4);  // SGD momentum
  EXPECT_LT(s[Category::optimizer_state].allocated_bytes, params * 4 + 1'000'000);
  EXPECT_GE(s[Category::input].allocated_bytes, 4 * 3 * 32 * 32 * 4 + 4 * 8);
  // Activations and temporaries live within the step only.
  EXPECT_EQ(s[Category::activations].allocated_bytes, 0);
  EXPECT_EQ(s[Category::temporaries].allocated_bytes, 512);  // the loss
  EXPECT_GT(s[Category::activations].allocated_bytes_peak, 0);
  // Temporaries (activation gradients, unsaved outputs) die at their last use, so a few are
  // alive at a time, while every saved activation is alive at the end of the forward pass.
  EXPECT_LT(s[Category::temporaries].allocated_bytes_peak * 2,
            s[Category::activations].allocated_bytes_peak);
  EXPECT_FALSE(s.peak.owner.empty());
}

TEST(StepPlanTest, RefusesBadConfigurationsWithOneLine) {
  auto allocator =
      memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
  auto backend = make_reference_backend().value();
  const auto fails = [&](const StepConfig& c, const std::string& needle) {
    Result<std::unique_ptr<TrainingStep>> s = TrainingStep::create(c, *backend, *allocator);
    ASSERT_FALSE(s.has_value()) << needle;
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos);
  };
  StepConfig c = tiny_config(16, 1, 3);
  fails(c, "more than 1 value per channel");
  c = tiny_config(0);
  fails(c, "image size");
  c = tiny_config();
  c.batch = 0;
  fails(c, "batch");
  c = tiny_config();
  c.sgd.lr = -1;
  fails(c, "lr");
  c = tiny_config();
  c.precision = Precision::fp16;
  c.scaler.growth_factor = 0.5;
  fails(c, "growth factor");
  c = tiny_config();
  c.streams = 3;
  fails(c, "streams must be 1 or 2");
  c = tiny_config();
  c.streams = 2;
  fails(c, "a second stream needs the planned memory plan");
  // A second stream keeps its operands, recomputed outputs among them, to the end of the backward.
  c.memory_plan = MemoryPlan::planned;
  c.recompute_block_outputs = true;
  fails(c, "recomputed block outputs need one stream");
  c = tiny_config();
  c.stream_lag = 4;
  fails(c, "it needs streams = 2");
  c.streams = 2;
  c.memory_plan = MemoryPlan::planned;
  c.stream_lag = -1;
  fails(c, "stream_lag must be >= 0, got -1");
  // A replay reads the loss scale and the step count from the counters: either optimizer.
  c = tiny_config();
  c.mode = StepMode::train;
  c.memory_plan = MemoryPlan::planned;
  c.graph = true;
  for (const OptimizerKind o : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    c.optimizer = o;
    EXPECT_TRUE(TrainingStep::create(c, *backend, *allocator).has_value());
  }
  // The library names the value and the choices; which flag it came from is the caller's to say.
  EXPECT_EQ(parse_precision("fp8").status().message(),
            "unknown precision 'fp8' (expected one of fp32, tf32, fp16, bf16, fp64)");
  EXPECT_EQ(parse_precision("bf16").value(), Precision::bf16);
  EXPECT_FALSE(parse_step_mode("eval").has_value());
  EXPECT_EQ(parse_optimizer("adamw").value(), OptimizerKind::adamw);
}

// Out of memory, the step's message suggests what this step could still change: mixed precision
// only to a step not in it, recomputing the block outputs only where the step can and does not.
TEST(StepPlanTest, OutOfMemorySuggestsWhatTheStepCanStillChange) {
  const auto message = [](const StepConfig& c, DType compute) {
    auto backend = make_reference_backend(compute).value();
    // Under a limit that the step's long-lived buffers fit and its arena does not.
    auto grown =
        memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
    std::uint64_t limit = 0;
    {
      auto fits = TrainingStep::create(c, *backend, *grown).value();
      const std::uint64_t arena = fits->arena()->bytes;
      limit = static_cast<std::uint64_t>(grown->stats().all.allocated_bytes) - arena / 2;
    }
    memory::AllocatorOptions o;
    o.mode = memory::Mode::limit;
    o.limit_bytes = limit;
    auto allocator =
        memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>(), o).value();
    Result<std::unique_ptr<TrainingStep>> s = TrainingStep::create(c, *backend, *allocator);
    EXPECT_FALSE(s.has_value());
    return s.has_value() ? std::string() : s.status().message();
  };
  StepConfig c = tiny_config();
  c.precision = Precision::fp64;
  c.layout = Layout::nhwc;
  c.memory_plan = MemoryPlan::planned;
  std::string m = message(c, DType::fp64);
  EXPECT_TRUE(
      m.ends_with("try a smaller batch, mixed precision (bf16/fp16) or recomputing the "
                  "block outputs"))
      << m;
  c.recompute_block_outputs = true;
  m = message(c, DType::fp64);
  EXPECT_TRUE(m.ends_with("try a smaller batch or mixed precision (bf16/fp16)")) << m;
  c = tiny_config();
  c.precision = Precision::fp16;
  c.memory_plan = MemoryPlan::planned;
  m = message(c, DType::fp32);
  EXPECT_TRUE(m.ends_with("try a smaller batch")) << m;
}

TEST(StepPlanTest, InputIsCheckedAndRequired) {
  StepConfig c = tiny_config();
  auto allocator =
      memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
  auto backend = make_reference_backend().value();
  auto step = TrainingStep::create(c, *backend, *allocator).value();
  EXPECT_FALSE(step->run_step().has_value());  // no input yet
  HostTensor labels = testing::labels_for(c);
  labels.set(2, 10.0);
  EXPECT_FALSE(step->set_input(testing::images_for(c), labels).is_ok());
  StepConfig other = tiny_config(16);
  EXPECT_FALSE(step->set_input(testing::images_for(other), testing::labels_for(c)).is_ok());
  EXPECT_TRUE(step->set_input(testing::images_for(c), testing::labels_for(c)).is_ok());
}

// d loss / d parameter from the backward pass against central differences of the loss, through
// the whole network, in fp64.
TEST(StepPlanTest, WholeNetworkGradientsMatchFiniteDifferences) {
  // Four images of 32x32: with fewer values per channel in layer4's batch norm (two of 1x1, say)
  // the loss is so ill-conditioned that finite differences stop converging.
  StepConfig c = tiny_config(32, 4, 3);
  c.precision = Precision::fp64;
  c.mode = StepMode::grads;
  testing::Rig r = make_rig(c, DType::fp64);
  ASSERT_TRUE(r.step);
  run(r);
  const std::vector<std::pair<std::string, std::int64_t>> probes = {
      {"conv1.weight", 17},
      {"layer1.0.conv2.weight", 5},
      {"layer2.0.downsample.0.weight", 40},
      {"layer3.1.bn1.bias", 2},
      {"layer4.1.conv2.weight", 1234},
      {"fc.weight", 4}};
  const std::size_t count = testing::kSanitized ? 3 : probes.size();
  for (std::size_t p = 0; p < count; ++p) {
    const auto& [name, index] = probes[p];
    const double analytic = r.step->gradient(name).value().get(index);
    HostTensor w = r.step->tensor(name).value();
    const double saved = w.get(index);
    const double h = 1e-7;
    w.set(index, saved + h);
    ASSERT_TRUE(r.step->set_tensor(name, w).is_ok());
    const double up = run(r);
    w.set(index, saved - h);
    ASSERT_TRUE(r.step->set_tensor(name, w).is_ok());
    const double down = run(r);
    w.set(index, saved);
    ASSERT_TRUE(r.step->set_tensor(name, w).is_ok());
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-4 * std::abs(numeric)) << name << "[" << index << "]";
  }
}

TEST(StepPlanTest, StateDictRoundTripsAcrossLayouts) {
  StepConfig c = tiny_config();
  testing::Rig a = make_rig(c);
  ASSERT_TRUE(a.step);
  run(a);  // moved weights, running statistics and counters
  Result<safetensors::File> sd = a.step->state_dict();
  ASSERT_TRUE(sd.has_value());
  EXPECT_EQ(sd->tensors.size(), a.step->model().state().size());
  const safetensors::Tensor* nbt = sd->find("bn1.num_batches_tracked");
  ASSERT_NE(nbt, nullptr);
  EXPECT_TRUE(nbt->shape.empty());
  EXPECT_EQ(nbt->dtype, DType::int64);
  EXPECT_EQ(sd->find("conv1.weight")->shape, (std::vector<std::int64_t>{16, 3, 7, 7}));
  // Through bytes, into an NHWC step with other initial weights.
  const std::vector<std::byte> bytes = safetensors::serialize(*sd).value();
  const safetensors::File parsed = safetensors::parse(bytes).value();
  c.layout = Layout::nhwc;
  c.seed = 99;
  c.mode = StepMode::grads;
  testing::Rig b = make_rig(c);
  ASSERT_TRUE(b.step);
  const Status loaded = b.step->load_state_dict(parsed);
  ASSERT_TRUE(loaded.is_ok()) << loaded.message();
  for (const char* name : {"conv1.weight", "layer2.1.bn2.running_var", "fc.bias"}) {
    const HostTensor x = a.step->tensor(name).value();
    const HostTensor y = b.step->tensor(name).value().to_layout(Layout::nchw);
    for (std::int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.get(i), y.get(i)) << name << i;
  }
  EXPECT_EQ(b.step->tensor("layer1.1.bn1.num_batches_tracked")->get(0), 1.0);
  // The NCHW step's next forward runs on exactly the weights it saved: the same loss.
  EXPECT_NEAR(run(a), run(b), 1e-5);
}

TEST(StepPlanTest, StateDictErrorsNameTheTensor) {
  StepConfig c = tiny_config();
  c.mode = StepMode::infer;
  testing::Rig r = make_rig(c);
  ASSERT_TRUE(r.step);
  const safetensors::File good = r.step->state_dict().value();
  const auto fails = [&](const safetensors::File& f, const std::string& needle) {
    const Status s = r.step->load_state_dict(f);
    ASSERT_FALSE(s.is_ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  safetensors::File missing = good;
  missing.tensors.pop_back();
  fails(missing, "missing tensor 'fc.bias'");
  safetensors::File extra = good;
  extra.tensors.push_back({"fc.extra", DType::fp32, {1}, std::vector<std::byte>(4)});
  fails(extra, "unexpected tensor 'fc.extra'");
  safetensors::File misshapen = good;
  for (auto& t : misshapen.tensors) {
    if (t.name == "layer1.0.conv2.weight") t.shape = {64, 64, 1, 9};
  }
  fails(misshapen, "'layer1.0.conv2.weight' has shape [64, 64, 1, 9]");
  safetensors::File wrong_type = good;
  wrong_type.tensors[1].dtype = DType::int32;
  fails(wrong_type, "'bn1.weight' has dtype I32");
}

}  // namespace
}  // namespace dlprobe::engine
