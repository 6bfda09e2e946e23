#include "cuda_rows.h"

#include <cstdlib>
#include <string>

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/log.h"

namespace dlprobe::testing {
namespace {

// The engine of the latest convolution honours the precision: no TF32 tensor cores under strict
// fp32, no Winograd or FFT, and (the default) no non-deterministic engine.
::testing::AssertionResult engine_fits(Backend& b, std::string_view op, Precision p) {
  if (!op.starts_with("conv2d")) return ::testing::AssertionSuccess();
  const std::string engine = static_cast<cuda::CudaBackend&>(b).last_conv_engine();
  if (p.dtype == DType::fp32 && p.math == MathMode::strict_fp32 &&
      engine.find("tensor_core") != std::string::npos) {
    return ::testing::AssertionFailure() << engine << " runs strict fp32 on tensor cores";
  }
  for (const char* banned : {"nondeterministic", "winograd", "fft", "reduced_precision"}) {
    if (engine.find(banned) != std::string::npos) {
      return ::testing::AssertionFailure() << engine << " is " << banned;
    }
  }
  return ::testing::AssertionSuccess() << "on " << engine;
}

}  // namespace

const BackendRow& cuda_row() {
  static const BackendRow row{
      .name = "cuda",
      .precisions = {kFp32, kTf32, kFp16, kBf16},
      .offers = {.fused_batch_norm_relu = true,
                 .fused_relu_backward_add = true,
                 .half_to_half_casts = true,
                 .fused_conv_batch_norm = true,
                 .gpu_sized_batch_norm = true,
                 .recomputed_max_pool = true,
                 .fused_max_pool_backward = true},
      .returns_scratch = false,
      .open = []() -> Result<OpenedBackend> {
        // DLPROBE_TEST_DEBUG=1 logs which cuDNN engine each convolution shape got.
        if (std::getenv("DLPROBE_TEST_DEBUG") != nullptr) log_set_level(LogLevel::debug);
        OpenedBackend b;
        DLPROBE_ASSIGN_OR_RETURN(auto source, memory::make_cuda_memory_source(0));
        DLPROBE_ASSIGN_OR_RETURN(b.allocator, memory::CachingAllocator::create(std::move(source)));
        DLPROBE_ASSIGN_OR_RETURN(b.backend, cuda::CudaBackend::create(0, *b.allocator, {}));
        return b;
      },
      .after_op = engine_fits};
  return row;
}

const std::vector<BackendRow>& backend_rows() {
  static const std::vector<BackendRow> rows = {cuda_row()};
  return rows;
}

}  // namespace dlprobe::testing
