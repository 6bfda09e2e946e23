// How the CUDA backend picks its convolution engines, once per shape (ignored on the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/conv_tuning.h"
#include "dlprobe/engine/cuda_backend.h"

namespace dlprobe::device {

// Which cuDNN convolution engines may run. Never those that sum in 16 bits.
enum class ConvEngines : std::uint8_t {
  any,            // also non-deterministic, FFT and Winograd ones: what cudnn.benchmark allows
  deterministic,  // the same bits on every run
  exact,          // deterministic direct sums only (no FFT / Winograd): the engine's own tests
};
// "any", "deterministic" or "exact"; the error names the value, never a flag.
Result<ConvEngines> parse_conv_engines(std::string_view text);

// "heuristic", "autotune" or "exhaustive"; the error names the value, never a flag.
Result<ConvEngineChoice> parse_conv_algo(std::string_view text);

// Who sums a convolution's output for the statistics of the batch norm after it (batch norm
// inside the convolutions): "epilogue", "pass" or "auto" (ConvSumsBy::epilogue_in_fp16: cuDNN's
// epilogue in fp16, dlprobe's pass in bf16 and tf32); the error names the value, never a flag.
Result<ConvSumsBy> parse_conv_sums(std::string_view text);

// Where a convolution after a batch norm + ReLU (batch norm inside the convolutions) gets its
// normalised input, forward and for its weight gradient.
enum class ConvPrologue : std::uint8_t {
  fused,      // cuDNN applies them as the convolution loads its input
  pass,       // dlprobe's pass writes the normalised input to scratch memory first
  up_to,      // the pass where the call's input holds at most up_to_bytes, cuDNN's above
  timed,      // each call shape's faster of the two, timed on its first call
  automatic,  // up_to kAutoPrologueUpTo at batches up to kAutoPrologueBatch, timed above
};
struct ConvPrologueChoice {
  ConvPrologue mode = ConvPrologue::automatic;
  std::uint64_t up_to_bytes = 0;  // with up_to
};
// "fused", "pass", "auto", "timed" or "up-to:SIZE" (SIZE as parse_size reads it); the error names
// the value, never a flag.
Result<ConvPrologueChoice> parse_conv_prologue(std::string_view text);

// `auto`: timing each call shape alone, on a GPU that runs nothing else, picked slower routes at
// small batches: on an H200 (fp16 ResNet-50 gradients, 2026-12-06) `up-to:13MB` ran ahead of the
// timed routes by 4.2 % at batch 32, 1.1 % at 64 and 0.6 % at 128, and 0.8 % behind at 256
// (bf16: 2.4 % and 1.8 % ahead at 32 and 64).
inline constexpr std::uint64_t kAutoPrologueUpTo = 13'000'000;
inline constexpr std::int64_t kAutoPrologueBatch = 128;
// The CUDA backend's conv_prologue_* options for a choice.
void set_prologue_routes(const ConvPrologueChoice& choice, CudaBackendOptions& cuda);

struct ConvOptions {
  ConvEngineChoice algo = ConvEngineChoice::autotune;
  ConvEngines engines = ConvEngines::any;
  std::shared_ptr<ConvTuningCache> tuning = nullptr;  // shared by the process; may be null
  ConvSumsBy sums = ConvSumsBy::epilogue_in_fp16;
  ConvPrologueChoice prologue = {};
  // The stem's max pool, ReLU and batch norm backward in one call (bench's `--stem-backward`).
  bool fused_stem_backward = true;
};

}  // namespace dlprobe::device
