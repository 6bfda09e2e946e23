// dlprobe step as a user (or lab/peers/compare_pytorch.py) runs it: files in, the binary, files
// out, checked against a TrainingStep run in this process on the same weights and batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/run_dlprobe.h"
#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/device/availability.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/engine/reference_backend.h"
#include "dlprobe/engine/safetensors.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe {
namespace {

using CliRun = testing::ProcessResult;
using testing::error_lines;

CliRun run_cli(const std::string& args) {
  return testing::run_dlprobe(testing::split_args("step " + args));
}

safetensors::Tensor file_tensor(std::string name, const HostTensor& t) {
  safetensors::Tensor out;
  out.name = std::move(name);
  out.dtype = t.dtype();
  for (int d = 0; d < t.shape().rank; ++d) out.shape.push_back(t.shape()[d]);
  const auto* bytes = static_cast<const std::byte*>(t.data());
  out.data.assign(bytes, bytes + t.desc().bytes());
  return out;
}

HostTensor host_tensor(const safetensors::Tensor& t) {
  Shape s;
  s.rank = static_cast<int>(t.shape.size());
  for (std::size_t i = 0; i < t.shape.size(); ++i) s.dims[i] = t.shape[i];
  HostTensor h(TensorDesc::make(s, t.dtype).value());
  EXPECT_EQ(t.data.size(), h.desc().bytes()) << t.name;
  std::memcpy(h.data(), t.data.data(), std::min(t.data.size(), h.desc().bytes()));
  return h;
}

double scalar(const safetensors::File& f, std::string_view name) {
  const safetensors::Tensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return std::nan("");
  EXPECT_EQ(t->dtype, DType::fp64) << name;
  EXPECT_TRUE(t->shape.empty()) << name;
  double v = 0;
  std::memcpy(&v, t->data.data(), sizeof v);
  return v;
}

// ResNet-18 on 32x32 images, batch 4, 10 classes: the smallest real network of the family.
engine::StepConfig tiny(engine::Precision p = engine::Precision::fp32) {
  engine::StepConfig c;
  c.model = {model::Arch::resnet18, 32, 10, false, 16};  // the width comes from the weights
  c.batch = 4;
  c.precision = p;
  c.mode = engine::StepMode::grads;
  c.seed = 5;
  return c;
}

struct Rig {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<engine::TrainingStep> step;
};

Rig make_rig(const engine::StepConfig& c) {
  Rig r;
  r.allocator =
      memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>()).value();
  r.backend =
      make_reference_backend(c.precision == engine::Precision::fp64 ? DType::fp64 : DType::fp32)
          .value();
  r.step = engine::TrainingStep::create(c, *r.backend, *r.allocator).value();
  return r;
}

// The weights and the batch are the same for every test, and the step run in this process is made
// once when a test first needs it (the sanitizer build runs the reference loops several times
// slower).
class StepCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "step_cli_" + std::to_string(getpid()) + "_");
    weights_ = new std::string(*dir_ + "weights.safetensors");
    input_ = new std::string(*dir_ + "input.safetensors");
    images_ = new HostTensor(HostTensor::random(
        TensorDesc::make(Shape{4, 3, 32, 32}, DType::fp32).value(), 17, -2.0, 2.0));
    labels_ = new HostTensor(TensorDesc::make(Shape{4}, DType::int64).value());
    for (std::int64_t i = 0; i < 4; ++i) labels_->set(i, static_cast<double>((3 * i + 1) % 10));
    write_input(*input_, {file_tensor("images", *images_), file_tensor("labels", *labels_)});
    // Weights: the engine's own seeded initialisation as a state dict file (what PyTorch's
    // save_file holds: the same names, shapes and dtypes).
    const Rig init = make_rig(tiny());
    ASSERT_TRUE(safetensors::write_file(*weights_, init.step->state_dict().value()).is_ok());
  }
  static void TearDownTestSuite() {
    std::remove(weights_->c_str());
    std::remove(input_->c_str());
    delete direct_;
    direct_ = nullptr;
    delete images_;
    delete labels_;
    delete weights_;
    delete input_;
    delete dir_;
  }
  void SetUp() override {
    output_ = *dir_ + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
              "_output.safetensors";
    bad_ = *dir_ + "bad.safetensors";
  }
  void TearDown() override {
    std::remove(output_.c_str());
    std::remove(bad_.c_str());
  }

  static void write_input(const std::string& path, std::vector<safetensors::Tensor> tensors) {
    safetensors::File f;
    f.tensors = std::move(tensors);
    ASSERT_TRUE(safetensors::write_file(path, f).is_ok()) << path;
  }

  // The reference backend on the CPU, as the step run in this process; --device cpu alone runs
  // oneDNN where the build has it.
  std::string files(const std::string& extra = "",
                    const std::string& device = "cpu --backend reference") const {
    return "--device " + device + " --model resnet18 --weights " + *weights_ + " --input " +
           *input_ + " --output " + output_ + " " + extra;
  }

  // The fp32 step run here from the weights file on the batch, logits kept, and its loss.
  static engine::TrainingStep& direct_fp32() {
    if (direct_ == nullptr) {
      direct_ = new Rig(direct(engine::Precision::fp32));
      EXPECT_TRUE(direct_->step->keep_logits().is_ok());
      direct_loss_ = direct_->step->run_step().value().loss;
    }
    return *direct_->step;
  }

  // The same step planned here from the weights file, on the same batch, logits not yet kept.
  static Rig direct(engine::Precision p, Layout layout = Layout::nchw,
                    double loss_scale = 65536.0) {
    engine::StepConfig c = tiny(p);
    c.layout = layout;
    c.scaler.init_scale = loss_scale;
    Rig r = make_rig(c);
    EXPECT_TRUE(r.step->load_state_dict(safetensors::read_file(*weights_).value()).is_ok());
    EXPECT_TRUE(r.step->set_input(*images_, *labels_).is_ok());
    return r;
  }

  void expect_error(const std::string& args, const std::string& needle) const {
    const CliRun r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_EQ(error_lines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\nwanted: " << needle << "\n"
                                                        << r.output;
  }

  static std::string* dir_;
  static std::string* weights_;
  static std::string* input_;
  static HostTensor* images_;
  static HostTensor* labels_;
  static Rig* direct_;
  static double direct_loss_;
  std::string output_;
  std::string bad_;
};

std::string* StepCliTest::dir_ = nullptr;
std::string* StepCliTest::weights_ = nullptr;
std::string* StepCliTest::input_ = nullptr;
HostTensor* StepCliTest::images_ = nullptr;
HostTensor* StepCliTest::labels_ = nullptr;
Rig* StepCliTest::direct_ = nullptr;
double StepCliTest::direct_loss_ = 0.0;

TEST_F(StepCliTest, WritesWhatADirectStepComputes) {
  const CliRun cli = run_cli(files());
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const safetensors::File out = safetensors::read_file(output_).value();
  EXPECT_EQ(out.metadata.at("model"), "resnet18-w16");  // the width the weights have
  EXPECT_EQ(out.metadata.at("precision"), "fp32");
  EXPECT_EQ(out.metadata.at("mode"), "grads");
  EXPECT_EQ(out.metadata.at("device"), "cpu");

  // Same code, same inputs, a deterministic backend: the same bits.
  engine::TrainingStep& step = direct_fp32();
  EXPECT_EQ(scalar(out, "loss"), direct_loss_);
  EXPECT_EQ(scalar(out, "loss_scale"), 1.0);
  const safetensors::Tensor* logits = out.find("logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->dtype, DType::fp32);
  EXPECT_EQ(logits->shape, (std::vector<std::int64_t>{4, 10}));
  const HostTensor kept = step.logits().value();
  EXPECT_EQ(logits->data, file_tensor("logits", kept).data);
  int gradients = 0;
  for (const model::StateEntry& e : step.model().state()) {
    const safetensors::Tensor* g = out.find(e.name);
    if (!model::is_parameter(e.kind)) {
      EXPECT_EQ(g, nullptr) << e.name << " is no parameter";
      continue;
    }
    ASSERT_NE(g, nullptr) << e.name;
    const HostTensor want = step.gradient(e.name).value().to_layout(Layout::nchw);
    EXPECT_EQ(g->data, file_tensor(e.name, want).data) << e.name;
    ++gradients;
  }
  EXPECT_EQ(gradients, 62);  // resnet18: 20 convs, 20 BN (weight, bias), fc (weight, bias)
  EXPECT_EQ(out.tensors.size(), static_cast<std::size_t>(gradients) + 3);
  EXPECT_NE(cli.output.find("wrote logits, loss and 62 gradients"), std::string::npos)
      << cli.output;

  // The logits are what the loss read: their cross-entropy is the loss.
  const HostTensor l = host_tensor(*logits);
  double loss = 0;
  for (std::int64_t n = 0; n < 4; ++n) {
    double top = -INFINITY;
    for (std::int64_t k = 0; k < 10; ++k) top = std::max(top, l.get(n * 10 + k));
    double sum = 0;
    for (std::int64_t k = 0; k < 10; ++k) sum += std::exp(l.get(n * 10 + k) - top);
    loss += top + std::log(sum) - l.get(n * 10 + static_cast<std::int64_t>(labels_->get(n)));
  }
  loss /= 4;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(scalar(out, "loss"), loss, 1e-6 * std::abs(loss));
}

TEST_F(StepCliTest, LogitsOnlyWhenKeptAndNaNUntilAStepRuns) {
  Rig r = direct(engine::Precision::fp32);
  EXPECT_FALSE(r.step->logits().has_value());
  const std::size_t calls = r.step->calls().size();
  ASSERT_TRUE(r.step->keep_logits().is_ok());
  EXPECT_EQ(r.step->calls().size(), calls + 1);  // one copy after the loss read them
  ASSERT_TRUE(r.step->keep_logits().is_ok());
  EXPECT_EQ(r.step->calls().size(), calls + 1);
  const HostTensor before = r.step->logits().value();
  EXPECT_EQ(before.shape(), (Shape{4, 10}));
  for (std::int64_t i = 0; i < before.numel(); ++i) EXPECT_TRUE(std::isnan(before.get(i)));
}

// fp16 grads mode keeps the gradients multiplied by the loss scale, as after
// scaler.scale(loss).backward(); NHWC gives the same step as NCHW. Scale 1024: at GradScaler's
// 65536 this tiny model's fc gradient (16384 * (softmax - one_hot) summed over the batch)
// overflows fp16, as it would in PyTorch, and GradScaler would skip the step.
TEST_F(StepCliTest, Fp16GradientsStayScaled) {
  ASSERT_EQ(run_cli(files("--precision fp16 --layout nhwc --loss-scale 1024")).exit_code, 0);
  const safetensors::File out = safetensors::read_file(output_).value();
  EXPECT_EQ(scalar(out, "loss_scale"), 1024.0);
  EXPECT_EQ(out.metadata.at("layout"), "nhwc");
  Rig r = direct(engine::Precision::fp16, Layout::nchw, 1024.0);
  ASSERT_TRUE(r.step->run_step().has_value());
  for (const std::string name : {"fc.weight", "layer2.0.conv1.weight", "conv1.weight"}) {
    const HostTensor cli = host_tensor(*out.find(name));
    const HostTensor nchw = r.step->gradient(name).value().to_layout(Layout::nchw);
    double diff = 0;
    double norm = 0;
    for (std::int64_t i = 0; i < cli.numel(); ++i) {
      diff += std::pow(cli.get(i) - nchw.get(i), 2);
      norm += std::pow(nchw.get(i), 2);
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-2) << name;
  }
  // fc's gradient (dlogits^T features) is well conditioned: 1024 times fp32's, up to fp16's
  // rounding. Deeper layers differ from fp32 by more (BN over 4 values in layer4 at 32x32).
  const HostTensor fc = host_tensor(*out.find("fc.weight"));
  const HostTensor unscaled = direct_fp32().gradient("fc.weight").value();
  double dot = 0;
  double fp32_norm = 0;
  for (std::int64_t i = 0; i < fc.numel(); ++i) {
    dot += fc.get(i) * unscaled.get(i);
    fp32_norm += std::pow(unscaled.get(i), 2);
  }
  EXPECT_NEAR(dot / fp32_norm, 1024.0, 1024.0 * 2e-2);
}

// A loss scale too large for fp16 overflows the scaled gradients: they are written as computed,
// and stderr says so.
TEST_F(StepCliTest, OverflowingGradientsAreNamed) {
  const CliRun cli = run_cli(files("--precision fp16 --loss-scale 1e30"));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_NE(cli.output.find("gradients hold inf or NaN at loss scale 1e+30: lower --loss-scale"),
            std::string::npos)
      << cli.output;
  const CliRun fine = run_cli(files("--precision fp16 --loss-scale 1024 --overwrite"));
  ASSERT_EQ(fine.exit_code, 0) << fine.output;
  EXPECT_EQ(fine.output.find("inf or NaN"), std::string::npos) << fine.output;
}

TEST_F(StepCliTest, Fp64OnTheCpuAndTheStateAfterTheStep) {
  const std::string state = *dir_ + "state.safetensors";
  ASSERT_EQ(run_cli(files("--precision fp64 --state-output " + state)).exit_code, 0);
  const safetensors::File out = safetensors::read_file(output_).value();
  EXPECT_EQ(out.find("logits")->dtype, DType::fp64);
  EXPECT_EQ(out.find("conv1.weight")->dtype, DType::fp64);
  const safetensors::File after = safetensors::read_file(state).value();
  const safetensors::Tensor* tracked = after.find("bn1.num_batches_tracked");
  ASSERT_NE(tracked, nullptr);
  std::int64_t steps = 0;
  std::memcpy(&steps, tracked->data.data(), sizeof steps);
  EXPECT_EQ(steps, 1);
  // Batch statistics moved the running mean off its initial zeros.
  const HostTensor mean = host_tensor(*after.find("bn1.running_mean"));
  double moved = 0;
  for (std::int64_t i = 0; i < mean.numel(); ++i) moved += std::abs(mean.get(i));
  EXPECT_GT(moved, 0.0);
  std::remove(state.c_str());
}

// The CPU runs oneDNN unless the reference loops are named; its step agrees with them to fp32
// rounding.
TEST_F(StepCliTest, TheCpuRunsOneDnnWhereBuilt) {
  if (!device::backend_built(device::BackendKind::onednn)) GTEST_SKIP() << "no oneDNN here";
  const CliRun cli = run_cli(files("", "cpu"));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const safetensors::File out = safetensors::read_file(output_).value();
  EXPECT_EQ(out.metadata.at("backend"), "cpu");
  direct_fp32();
  EXPECT_NEAR(scalar(out, "loss"), direct_loss_, 1e-4 * std::abs(direct_loss_));
  expect_error(files("--precision fp64", "cpu"),
               "--precision: precision fp64 runs on the reference backend (cpu) only");
}

TEST_F(StepCliTest, InferModeWritesNoGradients) {
  const CliRun cli = run_cli(files("--mode infer"));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_EQ(cli.output.find("has no effect"), std::string::npos) << cli.output;
  const safetensors::File out = safetensors::read_file(output_).value();
  EXPECT_EQ(out.tensors.size(), 3u);
  EXPECT_NE(out.find("logits"), nullptr);
  EXPECT_EQ(out.find("conv1.weight"), nullptr);
}

// The convolution engines' choices are the CUDA backend's: given for the CPU, each is named on
// stderr and the step runs.
TEST_F(StepCliTest, CudaOnlyOptionsOnTheCpuAreNamed) {
  const std::string cache = *dir_ + "tuning.json";
  std::remove(cache.c_str());
  const CliRun cli = run_cli(
      files("--mode infer --conv-algo autotune --conv-engines any --tuning-cache " + cache));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_NE(cli.output.find("dlprobe step: --tuning-cache has no effect on the reference backend"),
            std::string::npos)
      << cli.output;
  // A refused output leaves no tuning cache behind.
  std::remove(cache.c_str());
  expect_error(files("--mode infer --tuning-cache " + cache), "--output: ");
  EXPECT_FALSE(std::filesystem::exists(cache));
  EXPECT_NE(cli.output.find("dlprobe step: --conv-algo has no effect on the reference backend"),
            std::string::npos)
      << cli.output;
  EXPECT_NE(cli.output.find("dlprobe step: --conv-engines has no effect on the reference backend"),
            std::string::npos)
      << cli.output;
}

TEST_F(StepCliTest, StepsTrainsOverTheBatchesAndWritesEachLoss) {
  // Three SGD steps over the file's 4 images in batches of 2: batch 0, 1, 0.
  const CliRun cli = run_cli(files("--mode train --steps 3 --batch 2"));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_NE(cli.output.find("3 steps over 2 batches"), std::string::npos) << cli.output;
  const safetensors::File out = safetensors::read_file(output_).value();
  const safetensors::Tensor* losses = out.find("losses");
  ASSERT_NE(losses, nullptr);
  EXPECT_EQ(losses->dtype, DType::fp64);
  ASSERT_EQ(losses->shape, (std::vector<std::int64_t>{3}));
  const HostTensor got = host_tensor(*losses);

  engine::StepConfig c = tiny();
  c.mode = engine::StepMode::train;
  c.batch = 2;
  Rig r = make_rig(c);
  ASSERT_TRUE(r.step->load_state_dict(safetensors::read_file(*weights_).value()).is_ok());
  const std::vector<engine::StepResult> want = r.step->run_steps(*images_, *labels_, 3).value();
  for (std::int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got.get(i), want[static_cast<std::size_t>(i)].loss) << "step " << i;
  }
  EXPECT_EQ(scalar(out, "loss"), want.back().loss);
  // One step, the flag not given: no losses, as before.
  ASSERT_EQ(run_cli(files("--mode train --overwrite")).exit_code, 0);
  EXPECT_EQ(safetensors::read_file(output_).value().find("losses"), nullptr);

  expect_error(files("--mode train --steps 0 --overwrite"),
               "--steps: 0 is out of range (accepts 1 to 1000000)");
  expect_error(files("--steps 2 --overwrite"), "more than one step needs --mode train");
  expect_error(files("--mode train --batch 3 --overwrite"), "does not divide the 4 images");
  // Counts are read in base 10, as every other count (CLI11 alone would read 010 as eight).
  const CliRun leading_zero = run_cli(files("--mode train --steps 010 --batch 2 --overwrite"));
  ASSERT_EQ(leading_zero.exit_code, 0) << leading_zero.output;
  EXPECT_NE(leading_zero.output.find("10 steps over 2 batches"), std::string::npos)
      << leading_zero.output;
  expect_error(files("--mode train --steps 0x3 --overwrite"),
               "--steps: '0x3' is not a whole number");
  expect_error(files("--mode train --batch 0x2 --overwrite"),
               "--batch: '0x2' is not a whole number");
}

TEST_F(StepCliTest, RefusesBadInputWithOneLine) {
  const std::string& bad = bad_;
  const std::string with_bad_input = "--device cpu --model resnet18 --weights " + *weights_ +
                                     " --input " + bad + " --output " + output_;
  const std::string with_bad_weights = "--device cpu --model resnet18 --weights " + bad +
                                       " --input " + *input_ + " --output " + output_;
  expect_error(files("--precision fp8"), "unknown precision 'fp8'");
  // Outputs that cannot be written are refused before the step runs.
  expect_error("--device cpu --backend reference --model resnet18 --weights " + *weights_ +
                   " --input " + *input_ + " --output /nonexistent/dir/o.safetensors",
               "--output: /nonexistent/dir/o.safetensors: cannot write there");
  expect_error(files("--state-output " + ::testing::TempDir()), "--state-output: ");
  expect_error(files("--mode eval"), "unknown mode 'eval'");
  expect_error(files("--layout chwn"), "unknown layout 'chwn'");
  expect_error(files("--conv-algo fastest"), "unknown choice 'fastest'");
  expect_error(files("--conv-engines fft"), "--conv-engines: unknown choice 'fft'");
  expect_error(files("", "tpu:0"), "--device: unknown device 'tpu:0'");
  // The device is resolved first: a machine or build without a usable GPU says so before the
  // precision is judged.
  expect_error(files("--precision fp64", "cuda:0"),
               device::explain_gpus(device::gather_gpu_facts()).devices > 0
                   ? "--precision: precision fp64 runs on the reference backend (cpu) only"
                   : "--device: cuda:0: no usable GPU: ");
  expect_error(files("", "cpu --backend tpu"), "--backend: unknown backend 'tpu'");
  expect_error(files("", "cpu --backend cuda"), "--backend: backend cuda does not run on cpu");
  expect_error(files("--loss-scale 1024"), "only fp16 scales the loss");
  expect_error(files("--precision fp16 --mode infer --loss-scale 1024"),
               "--loss-scale: --mode infer has no backward pass to scale");
  for (const char* scale : {"0", "-1", "inf"}) {
    expect_error(files(std::string("--precision fp16 --loss-scale ") + scale),
                 std::string("--loss-scale: ") + scale + " is not a positive finite number");
  }
  expect_error(files("--batch 0"), "--batch: 0 is out of range (accepts 1 to 1099511627776)");
  // Each step keeps its loss: a count past the bound is refused before any memory is taken.
  expect_error(files("--mode train --steps 99999999999"),
               "--steps: 99999999999 is out of range (accepts 1 to 1000000)");
  expect_error(files("--state-output ''"), "--state-output: an empty value");
  // An output may not replace a file the step reads, --overwrite or not.
  expect_error("--device cpu --model resnet18 --weights " + *weights_ + " --input " + *input_ +
                   " --output " + *weights_ + " --overwrite",
               "--weights and --output both name " + *weights_ +
                   ": the output would replace what the command reads");
  expect_error(files("--overwrite --state-output " + *input_),
               "--input and --state-output both name " + *input_);
  expect_error("--device cpu --weights " + *weights_ + " --output " + output_, "--input");
  expect_error(with_bad_input, "cannot open");
  // A folder opens but does not read.
  expect_error("--device cpu --model resnet18 --weights " + *weights_ + " --input " +
                   ::testing::TempDir() + " --output " + output_,
               "cannot read");

  // Weights that do not fit the model name the tensor.
  expect_error("--device cpu --model resnet18 --weights " + *input_ + " --input " + *input_ +
                   " --output " + output_,
               "no 'fc.weight'");
  safetensors::File weights = safetensors::read_file(*weights_).value();
  std::erase_if(weights.tensors,
                [](const safetensors::Tensor& t) { return t.name == "layer1.1.conv1.weight"; });
  ASSERT_TRUE(safetensors::write_file(bad, weights).is_ok());
  expect_error(with_bad_weights, "missing tensor 'layer1.1.conv1.weight'");
  // Without the stem's weight the message names that one alone.
  std::erase_if(weights.tensors,
                [](const safetensors::Tensor& t) { return t.name == "conv1.weight"; });
  ASSERT_TRUE(safetensors::write_file(bad, weights).is_ok());
  expect_error(with_bad_weights,
               "no 'conv1.weight' [width, 3, 7, 7] tensor, so not a torchvision ResNet state dict");
  // A NaN or an infinity among the weights is refused, the first one named.
  safetensors::File nan_weights = safetensors::read_file(*weights_).value();
  for (safetensors::Tensor& t : nan_weights.tensors) {
    if (t.name != "fc.bias") continue;
    ASSERT_EQ(t.dtype, DType::fp32);
    const float inf = INFINITY;
    std::memcpy(t.data.data() + 3 * sizeof inf, &inf, sizeof inf);
  }
  ASSERT_TRUE(safetensors::write_file(bad, nan_weights).is_ok());
  expect_error(with_bad_weights, ": tensor 'fc.bias' holds inf at value 3, not a finite number");

  write_input(bad, {file_tensor("images", *images_)});
  expect_error(with_bad_input, "no tensor named 'labels'");
  const HostTensor wide =
      HostTensor::random(TensorDesc::make(Shape{4, 3, 32, 16}, DType::fp32).value(), 1);
  write_input(bad, {file_tensor("images", wide), file_tensor("labels", *labels_)});
  expect_error(with_bad_input, "expected a floating [N, 3, H, H] tensor");
  write_input(bad, {file_tensor("images", *images_), file_tensor("labels", *images_)});
  expect_error(with_bad_input, "'labels' is F32 [4, 3, 32, 32], expected an integer [4] tensor");
  HostTensor big = labels_->to_dtype(DType::int64).value();
  big.set(2, 10.0);
  write_input(bad, {file_tensor("images", *images_), file_tensor("labels", big)});
  expect_error(with_bad_input, "label 10 of sample 2 is outside [0, 10)");
  // Every label is checked, not only the batches that run: batch 2 runs the first two samples.
  expect_error(with_bad_input + " --batch 2", "label 10 of sample 2 is outside [0, 10)");
  // A NaN or an infinity among the pixels is refused, the first one named.
  HostTensor nan_images = *images_;
  nan_images.set(2 * 3 * 32 * 32 + 5, std::nan(""));
  nan_images.set(3 * 3 * 32 * 32, -INFINITY);
  write_input(bad, {file_tensor("images", nan_images), file_tensor("labels", *labels_)});
  expect_error(with_bad_input, "'images' holds nan at value 5 of image 2, not a finite number");
  HostTensor inf_images = *images_;
  inf_images.set(3 * 3 * 32 * 32 + 1, INFINITY);
  write_input(bad, {file_tensor("images", inf_images), file_tensor("labels", *labels_)});
  expect_error(with_bad_input, "'images' holds inf at value 1 of image 3, not a finite number");
  // One image of 16x16 leaves layer3's batch norm a single value per channel.
  const HostTensor one =
      HostTensor::random(TensorDesc::make(Shape{1, 3, 16, 16}, DType::fp32).value(), 1);
  HostTensor one_label(TensorDesc::make(Shape{1}, DType::int64).value());
  one_label.set(0, 1.0);
  write_input(bad, {file_tensor("images", one), file_tensor("labels", one_label)});
  expect_error(with_bad_input, "cannot take 16x16");
}

}  // namespace
}  // namespace dlprobe
