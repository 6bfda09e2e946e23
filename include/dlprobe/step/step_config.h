// What a training step is asked to be: the model, batch, precision, mode, optimizer, loss scaling
// and memory plan of a TrainingStep, with the names these choices go by in results and the
// parsers that read them back.
#pragma once

#include <cstdint>
#include <string_view>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/dtype.h"
#include "dlprobe/engine/ops.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/models/resnet.h"

namespace dlprobe::engine {

// fp32: strict fp32 math. tf32: fp32 tensors, TF32 tensor cores allowed for conv and matmul.
// fp16 / bf16: mixed precision as torch.autocast runs it (fp32 master weights, fp16/bf16 conv, fc
// and batch-norm activations, fp32 loss), fp16 with dynamic loss scaling. fp64: everything in
// double, for gradient checks on the reference backend.
enum class Precision : std::uint8_t { fp32, tf32, fp16, bf16, fp64 };
// An error names the unknown value and the known ones; the caller says where the text came from.
Result<Precision> parse_precision(std::string_view text);
std::string_view precision_name(Precision p);
// The dtype conv, batch norm and fc activations have under `p`.
DType activation_dtype(Precision p);
// The dtype of master parameters, gradients, optimizer state, BN statistics and the loss.
DType master_dtype(Precision p);

// train: forward, backward, optimizer update. grads: forward and backward only (the benchmark
// protocol; under fp16 the gradients stay multiplied by the loss scale, as after
// scaler.scale(loss).backward()). infer: forward with BN running statistics, and the loss.
enum class StepMode : std::uint8_t { train, grads, infer };
Result<StepMode> parse_step_mode(std::string_view text);
std::string_view step_mode_name(StepMode m);

enum class OptimizerKind : std::uint8_t { sgd, adamw };
Result<OptimizerKind> parse_optimizer(std::string_view text);
std::string_view optimizer_name(OptimizerKind o);

// How the step holds its activations and temporaries.
//   dynamic  `alloc`/`free` entries of the call list take each buffer from the caching allocator
//            just before its first use and give it back after its last (as PyTorch's step does)
//   planned  one block (category arena) taken at create() and laid out by memory::plan_arena from
//            the buffers' lifetimes: every buffer has a fixed address for every step, the call
//            list has no alloc/free entries, and the peak is as low as the lifetimes allow
enum class MemoryPlan : std::uint8_t { dynamic, planned };
std::string_view memory_plan_name(MemoryPlan p);

struct StepConfig {
  model::ModelConfig model;
  std::int64_t batch = 256;
  Precision precision = Precision::fp32;
  Layout layout = Layout::nchw;
  StepMode mode = StepMode::train;
  OptimizerKind optimizer = OptimizerKind::sgd;
  SgdParams sgd{
      .lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 1e-4, .nesterov = false};
  AdamWParams adamw{};
  GradScalerOptions scaler{};  // used under fp16 only
  std::uint64_t seed = 0;      // initial weights (model::initial_state)
  // Run each batch norm with the ReLU after it (and the residual add before that ReLU) as one
  // call where the backend can (Backend::fuses_batch_norm_relu): one pass over the activation
  // instead of two or three, and the BN output never stored. The same math, rounded once.
  bool fuse = true;
  // With `fuse`, also run batch norm inside the convolutions where the backend can
  // (Backend::fuses_conv_batch_norm, training steps): a convolution that feeds a batch norm sums
  // its output for the statistics as it writes it; and a BN + ReLU whose output only the next
  // convolution reads is applied as that convolution loads its input, never stored, and
  // recomputed for the convolution's weight gradient and the ReLU's backward.
  bool fuse_conv = true;
  // Keep no residual block's output for the backward pass: where a batch norm whose statistics a
  // convolution summed takes in the residual add and ReLU (`fuse_conv`), the backward computes
  // the block's output again from what it keeps anyway (the convolution's output, the batch
  // norm's statistics and the shortcut, itself recomputed), with the forward's own call, so the
  // values are the same to the bit. In a block with a projection shortcut whose input is kept
  // (ResNet-50: layer1's and layer4's first blocks), the shortcut's convolution output is not
  // kept either: the backward runs the convolution again with the forward's own call. Under mixed
  // precision conv1's weight gradient casts the images again rather than keep their cast. One
  // more elementwise pass per block and, in ResNet-50, two 1x1 convolutions, for about a third
  // fewer activations. Training steps only. Where nothing can
  // be recomputed (no batch norm inside the convolutions) the step keeps its outputs and its
  // config() says false.
  bool recompute_block_outputs = false;
  MemoryPlan memory_plan = MemoryPlan::dynamic;
  // Record the step once as a graph (a CUDA graph) and replay it, so the host launches one graph
  // instead of every call. Needs MemoryPlan::planned (the same addresses every step); in train
  // mode the calls read the loss scale and step count from the step's counters, so one recording
  // serves every step. A backend that cannot record runs the step eagerly, with a warning.
  bool graph = false;
  // 2: each convolution's weight gradient runs on a second stream of the backend
  // (Backend::streams), beside the data gradients and batch norms that follow it, where the
  // backend has one; 1: every call in order on one. Needs MemoryPlan::planned, whose arena keeps
  // what the second stream reads until the first waits for it.
  int streams = 1;
  // With streams 2: before each call, stream 0 waits for every weight gradient it has not waited
  // for that was emitted more than this many calls earlier (0: no bound, it waits only where it
  // reads what one writes, and at the end). The bound ends the second stream's operands' lives
  // sooner, so the arena stays near one stream's, for less overlap.
  std::int64_t stream_lag = 0;
};

}  // namespace dlprobe::engine
