// The CUDA backend of the training engine: convolutions through cuDNN's graph API, linear layers
// through cuBLASLt, every other op in dlprobe's own kernels. Built only with DLPROBE_WITH_CUDA.
//
// All work runs on one non-blocking stream the backend owns, in call order. upload() queues the
// copy (a pageable source is staged before upload returns, so it may be reused at once; a pinned
// one must stay unchanged until synchronize()), download() returns once the data is on the host,
// synchronize() waits for everything queued.
//
// Scratch memory (cuDNN and cuBLASLt workspaces, partial reductions, optimizer slot tables) comes
// from the allocator passed in, category `workspace`, owner = the op's name, and is given back as
// soon as the op is queued. That is safe because the allocator's blocks are reused in stream order:
// every user of this allocator must work on this backend's stream (the engine does), never on
// another stream or from the host directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/status.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/conv_tuning.h"

namespace dlprobe {

// Who sums a fused convolution's output (CudaBackendOptions::conv_sums).
enum class ConvSumsBy : std::uint8_t {
  epilogue,          // cuDNN, as the convolution writes its output
  pass,              // dlprobe, in a pass over the output after the convolution
  epilogue_in_fp16,  // cuDNN's epilogue for fp16 outputs, the pass for bf16 and fp32 ones
};

struct CudaBackendOptions {
  ConvEngineChoice conv_engine = ConvEngineChoice::heuristic;
  // The most scratch memory one cuDNN or cuBLASLt call may take; engines needing more are skipped.
  std::int64_t max_workspace_bytes = std::int64_t{256} << 20;
  // The same for fp32 convolutions whose engine is chosen by timing (autotune, exhaustive; the
  // heuristic choice keeps the cap above), in TF32 or in strict fp32 where transform engines may
  // compete (timed_choice.h: timed_workspace_cap). Without tensor cores the fast engines for 3x3
  // layers are FFT and Winograd ones, which cudnn.benchmark finds for PyTorch, and their
  // transformed operands grow with the activations. On an H200 at ResNet-50 bs 256, 13 of the
  // step's convolutions chose engines above 256 MiB (FFT for 10 of them, up to 1.42 GiB; layer2's
  // 3x3 forward: 0.544 ms against 1.383 ms direct), and the step went from 262 to 225 ms. In TF32
  // the step's workspace, the stem's weight gradient's, is 1.17 GiB at bs 256 (that gradient 1.96
  // against 3.36 ms on an H100).
  std::int64_t max_fp32_conv_workspace_bytes = std::int64_t{2} << 30;
  MathMode math_mode = MathMode::strict_fp32;
  // Only convolution engines that give the same bits on every run: cuDNN's non-deterministic ones
  // add partial sums with atomics, in the output's dtype when that is fp16/bf16, which costs
  // accuracy as well as reproducibility. False lets them compete for speed.
  bool deterministic = true;
  // FFT and Winograd engines may compete (as under cudnn.benchmark): faster for some fp32
  // shapes, at about ten times the rounding error of a direct sum.
  bool transform_engines = false;
  // fp16 and bf16 plain convolutions: engines that cuDNN notes for reduced-precision reductions
  // may compete, as under cudnn.benchmark (PyTorch filters no such note); cuDNN's first-layer
  // engine for images of up to four channels is one (ResNet-50's stem on an H200: 0.42 ms forward
  // and 0.40 ms weight gradient, against 0.84 and 1.11 ms for the best engines with fp32 sums).
  // False keeps every engine's sums in fp32. fp32 and TF32 convolutions always do, and so do the
  // fused graphs (batch norm inside the convolution), whose choice is cuDNN's first, not timed.
  bool reduced_precision_reductions = false;
  // Who sums a fused convolution's output for the batch norm after it (conv2d_forward_fused with
  // sum and sqsum): cuDNN's statistics epilogue, or a pass of dlprobe's over the output after a
  // convolution without it (one launch where the device takes cooperative launches). cuDNN's
  // epilogue took 27 to 34 us a convolution at ResNet-50's batch 32 on an H200 whatever the
  // shape, against 13 to 26 us for the convolution alone (docs/cuda-backend.md); in bf16 and
  // tf32 it made the step slower than batch norm apart, so those fuse batch norm only with the
  // pass.
  ConvSumsBy conv_sums = ConvSumsBy::epilogue;
  // A fused convolution with a batch norm's apply and ReLU before it (scale and bias: its
  // prologue), forward or weight gradient, takes its input from a pass of dlprobe's that writes
  // relu(x * scale + bias) to scratch memory, then runs without cuDNN's prologue.
  bool conv_prologue_pass = false;
  // Each shape's faster of the two, forward and weight gradient apart: timed on the first call
  // of the shape (both ways on its own buffers) and kept with the tuning choices, where
  // conv_engine times candidates at all (heuristic: cuDNN's prologue). bench's `--conv-prologue
  // timed`, and `auto` above its batch. Neither wins everywhere: in fp16 ResNet-50 the pass took
  // most small tensors and cuDNN's prologue most large ones, with exceptions both ways
  // (lab/README.md).
  bool conv_prologue_timed = false;
  // Or by the size of the call's input: the pass where it holds at most this many bytes, cuDNN's
  // prologue above (bench's `--conv-prologue up-to:SIZE`). At fp16 ResNet-50 on an H100 13 MB ran
  // ahead of the timed routes at batches 32 and 64, which see each call alone
  // (docs/performance.md).
  std::optional<std::uint64_t> conv_prologue_pass_up_to_bytes = std::nullopt;
  // The size rule holds for calls whose batch (the input's first dimension) is at most this;
  // larger ones take the route the two options before it give (bench's `--conv-prologue auto`:
  // timed). None: the size rule holds for every call.
  std::optional<std::int64_t> conv_prologue_size_rule_up_to_batch = std::nullopt;
  // Cooperative launches (a grid that waits for all its blocks) where the device takes them:
  // batch norm in one launch where a tensor fits the grid, and the sums pass's merge in the same
  // launch. False takes the kernels' other paths, as on a device (or under MPS) that refuses them.
  bool cooperative_launches = true;
  // The stem's max pool, ReLU and batch norm backward in one call, at the places the pool's
  // forward keeps (Backend::batch_norm_relu_max_pool_backward; bench's `--stem-backward`). False:
  // the pool's backward, then the batch norm's, as two calls.
  bool fused_stem_backward = true;
  // Where autotuned choices are looked up first and recorded (null: this backend's plans only).
  // Shared by backends and processes on the same GPU and cuDNN; keys name both.
  std::shared_ptr<ConvTuningCache> tuning = nullptr;
};

// Makes `device` current on the calling thread, which must keep it current while it uses the
// backend. The allocator must be over that device's memory and outlive the backend. Fails with
// Errc::unavailable when no usable GPU is there.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, memory::CachingAllocator& allocator,
                                                   CudaBackendOptions options = {});

}  // namespace dlprobe
