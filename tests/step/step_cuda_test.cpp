// The whole planned step on the CUDA backend against the same step on the reference backend, in
// every precision and layout. Needs a GPU (LABELS gpu).
//
// What "the same" can mean: two correct fp32 implementations of a ResNet step do not agree to
// 1e-6, because ReLU and max-pool decide on signs and ties, and batch norm over few values
// amplifies rounding; on a tiny network after one update the fp32 reference itself is several
// per cent away from the fp64 one. So each figure is compared with an exact reference (the same
// plan, the same storage dtypes, every op computed in fp64) and must be about as close to it as
// the fp32 reference is: err(cuda) <= 4 * err(fp32 reference) + bound, where err is the
// norm-wise relative error |a - b| / |b|, per tensor and as the median over tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "dlprobe/cuda_backend.h"
#include "step_test_util.h"

namespace dlprobe::engine {
namespace {

struct CudaRig {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TrainingStep> step;
};

CudaRig make_cuda_rig(const StepConfig& c) {
  CudaRig r;
  auto source = memory::make_cuda_memory_source(0);
  EXPECT_TRUE(source.has_value()) << source.status().message();
  if (!source.has_value()) return r;
  r.allocator = memory::CachingAllocator::create(std::move(source).value()).value();
  auto backend = make_cuda_backend(0, *r.allocator);
  EXPECT_TRUE(backend.has_value()) << backend.status().message();
  if (!backend.has_value()) return r;
  r.backend = std::move(backend).value();
  auto step = TrainingStep::create(c, *r.backend, *r.allocator);
  EXPECT_TRUE(step.has_value()) << step.status().message();
  if (!step.has_value()) return r;
  r.step = std::move(step).value();
  EXPECT_TRUE(r.step->set_input(testing::images_for(c), testing::labels_for(c)).is_ok());
  return r;
}

// |got - want| / |want| over all elements (Euclidean norms), in want's layout.
double norm_error(const HostTensor& got, const HostTensor& want) {
  const HostTensor g = got.to_layout(want.layout());
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double d = g.get(i) - want.get(i);
    diff += d * d;
    norm += want.get(i) * want.get(i);
  }
  if (!std::isfinite(diff)) return std::numeric_limits<double>::infinity();
  return std::sqrt(diff / std::max(norm, 1e-300));
}

HostTensor minus(const HostTensor& a, const HostTensor& b) {
  HostTensor out(TensorDesc::make(a.shape(), DType::fp64).value());
  const HostTensor bb = b.to_layout(a.layout());
  for (std::int64_t i = 0; i < a.numel(); ++i) out.set(i, a.get(i) - bb.get(i));
  return out;
}

// Bounds by precision. `tensor`: any one tensor, loose enough for one ReLU or max-pool decision
// that went the other way (on this tiny network that moves a gradient by up to ~1 %; a wiring
// bug moves it by ~100 %). `median`: the median over all tensors, where such decisions wash out.
// tf32 rounds operands to 10 bits against a strict fp32 reference, so it only gets loose bounds.
struct Bounds {
  double tensor;
  double median;
};
Bounds bounds_for(Precision p) {
  switch (p) {
    case Precision::tf32:
      return {0.3, 0.2};
    case Precision::fp16:
      return {0.3, 1e-2};
    case Precision::bf16:
      return {0.6, 2e-2};
    default:
      return {2e-2, 1e-4};
  }
}

struct Check {
  std::string what;
  double cuda = 0;  // err(cuda vs exact)
  double ref = 0;   // err(fp32 reference vs exact)
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Every check passes the per-tensor bound and the medians the median bound; the worst few are
// printed for the log.
void expect_close(std::vector<Check> checks, Precision p, const char* title) {
  const Bounds b = bounds_for(p);
  std::sort(checks.begin(), checks.end(),
            [](const Check& x, const Check& y) { return x.cuda > y.cuda; });
  std::vector<double> cuda, ref;
  for (const Check& c : checks) {
    cuda.push_back(c.cuda);
    ref.push_back(c.ref);
  }
  const double mc = median_of(cuda);
  const double mr = median_of(ref);
  std::printf(
      "%s (%s): %zu tensors, err = |x - exact| / |exact|, median cuda %.3g, fp32 "
      "reference %.3g\n",
      title, std::string(precision_name(p)).c_str(), checks.size(), mc, mr);
  for (std::size_t i = 0; i < checks.size() && i < 6; ++i) {
    std::printf("  %-36s cuda %.3g  fp32-reference %.3g\n", checks[i].what.c_str(), checks[i].cuda,
                checks[i].ref);
  }
  EXPECT_LE(mc, 4.0 * mr + b.median) << "median over tensors";
  for (const Check& c : checks) {
    EXPECT_LE(c.cuda, 4.0 * c.ref + b.tensor) << c.what << " (fp32 reference " << c.ref << ")";
  }
}

struct Rigs {
  testing::Rig exact;
  testing::Rig ref;
  CudaRig gpu;
};

Rigs make_rigs(const StepConfig& c) {
  return {testing::make_rig(c, DType::fp64), testing::make_rig(c, DType::fp32), make_cuda_rig(c)};
}

// 64x64 images and 8 per batch: layer4's batch norms see 32 values a channel, not 4, so the
// comparison is not dominated by a handful of ill-conditioned channels.
StepConfig config(Precision precision, Layout layout, StepMode mode) {
  StepConfig c = testing::tiny_config(64, 8);
  c.precision = precision;
  c.layout = layout;
  c.mode = mode;
  return c;
}

// One step in grads mode: the loss and every parameter's gradient.
void compare_gradients(Precision precision, Layout layout) {
  const StepConfig c = config(precision, layout, StepMode::grads);
  Rigs r = make_rigs(c);
  ASSERT_TRUE(r.exact.step && r.ref.step && r.gpu.step);
  const double le = testing::run(r.exact);
  const double lr = testing::run(r.ref);
  Result<StepResult> lg = r.gpu.step->run_step();
  ASSERT_TRUE(lg.has_value()) << lg.status().message();
  std::vector<Check> checks;
  checks.push_back(
      {"loss", std::abs(lg->loss - le) / std::abs(le), std::abs(lr - le) / std::abs(le)});
  for (const model::StateEntry& e : r.exact.step->model().state()) {
    Result<HostTensor> want = r.exact.step->gradient(e.name);
    if (!want.has_value()) continue;  // not a parameter
    checks.push_back({e.name, norm_error(r.gpu.step->gradient(e.name).value(), *want),
                      norm_error(r.ref.step->gradient(e.name).value(), *want)});
  }
  expect_close(std::move(checks), precision, "gradients after one step");
}

// Two training steps: the second step's loss, and each parameter's update (w2 - w0).
void compare_training(Precision precision, OptimizerKind optimizer) {
  StepConfig c = config(precision, Layout::nhwc, StepMode::train);
  c.optimizer = optimizer;
  Rigs r = make_rigs(c);
  ASSERT_TRUE(r.exact.step && r.ref.step && r.gpu.step);
  std::vector<HostTensor> w0;
  const auto& state = r.exact.step->model().state();
  for (const model::StateEntry& e : state) w0.push_back(r.exact.step->tensor(e.name).value());
  double le = 0, lr = 0;
  StepResult lg;
  for (int i = 0; i < 2; ++i) {
    Result<StepResult> e = r.exact.step->run_step();
    Result<StepResult> f = r.ref.step->run_step();
    Result<StepResult> g = r.gpu.step->run_step();
    ASSERT_TRUE(e.has_value() && f.has_value() && g.has_value()) << g.status().message();
    // Under fp16 a step with inf/NaN gradients is skipped; all three must agree on that.
    EXPECT_EQ(g->skipped, e->skipped) << "step " << i;
    le = e->loss;
    lr = f->loss;
    lg = *g;
  }
  std::vector<Check> checks;
  checks.push_back({"loss after one update", std::abs(lg.loss - le) / std::abs(le),
                    std::abs(lr - le) / std::abs(le)});
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (state[i].kind == model::StateKind::num_batches_tracked) {
      EXPECT_EQ(r.gpu.step->tensor(state[i].name)->get(0), 2.0) << state[i].name;
      continue;
    }
    const HostTensor want = minus(r.exact.step->tensor(state[i].name).value(), w0[i]);
    checks.push_back({state[i].name + " update",
                      norm_error(minus(r.gpu.step->tensor(state[i].name).value(), w0[i]), want),
                      norm_error(minus(r.ref.step->tensor(state[i].name).value(), w0[i]), want)});
  }
  expect_close(std::move(checks), precision, "two training steps");
}

TEST(StepCudaTest, Fp32GradientsNchw) {
  compare_gradients(Precision::fp32, Layout::nchw);
}
TEST(StepCudaTest, Fp32GradientsNhwc) {
  compare_gradients(Precision::fp32, Layout::nhwc);
}
TEST(StepCudaTest, Tf32GradientsNchw) {
  compare_gradients(Precision::tf32, Layout::nchw);
}
TEST(StepCudaTest, Fp16GradientsNhwc) {
  compare_gradients(Precision::fp16, Layout::nhwc);
}
TEST(StepCudaTest, Bf16GradientsNhwc) {
  compare_gradients(Precision::bf16, Layout::nhwc);
}
TEST(StepCudaTest, Fp32TrainSgd) {
  compare_training(Precision::fp32, OptimizerKind::sgd);
}
TEST(StepCudaTest, Fp16TrainSgd) {
  compare_training(Precision::fp16, OptimizerKind::sgd);
}
TEST(StepCudaTest, Fp32TrainAdamW) {
  compare_training(Precision::fp32, OptimizerKind::adamw);
}

// A planned step recorded as a CUDA graph and replayed computes what the eager step computes, to
// the bit (the same deterministic kernels on the same addresses).
TEST(StepCudaTest, GraphReplayMatchesEagerSteps) {
  for (const Precision precision : {Precision::fp32, Precision::fp16}) {
    StepConfig c = config(precision, Layout::nhwc, StepMode::grads);
    c.memory_plan = MemoryPlan::planned;
    CudaRig eager = make_cuda_rig(c);
    c.graph = true;
    CudaRig graph = make_cuda_rig(c);
    ASSERT_TRUE(eager.step && graph.step);
    for (int i = 0; i < 3; ++i) {  // eager, recorded and replayed, replayed
      Result<StepResult> a = eager.step->run_step();
      Result<StepResult> b = graph.step->run_step();
      ASSERT_TRUE(a.has_value() && b.has_value()) << b.status().message();
      EXPECT_EQ(a->loss, b->loss) << "step " << i;
    }
    for (const char* name : {"conv1.weight", "layer3.1.bn2.weight", "fc.weight"}) {
      const HostTensor ga = eager.step->gradient(name).value();
      const HostTensor gb = graph.step->gradient(name).value();
      EXPECT_EQ(norm_error(gb, ga), 0.0) << name;
    }
    EXPECT_EQ(eager.step->tensor("bn1.running_mean")->get(3),
              graph.step->tensor("bn1.running_mean")->get(3));
  }
}

TEST(StepCudaTest, InferLoss) {
  const StepConfig c = config(Precision::fp32, Layout::nhwc, StepMode::infer);
  Rigs r = make_rigs(c);
  ASSERT_TRUE(r.exact.step && r.ref.step && r.gpu.step);
  const double le = testing::run(r.exact);
  const double lr = testing::run(r.ref);
  const double lg = r.gpu.step->run_step()->loss;
  EXPECT_LE(std::abs(lg - le), 4 * std::abs(lr - le) + 1e-4 * std::abs(le));
}

}  // namespace
}  // namespace dlprobe::engine
