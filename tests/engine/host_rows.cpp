#include "host_rows.h"

#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/engine/reference_backend.h"

namespace dlprobe::testing {

Result<std::unique_ptr<memory::CachingAllocator>> host_allocator() {
  return memory::CachingAllocator::create(std::make_unique<memory::HostMemorySource>());
}

// The reference backend computes fp16 and bf16 tensors in fp32 too, rounding once.
BackendRow reference_row() {
  return {
      .name = "reference",
      .precisions = {kFp32, kFp16, kBf16},
      .offers = {.fused_batch_norm_relu = true,
                 .fused_relu_backward_add = true,
                 .mixed_layouts = true,
                 .half_to_half_casts = true,
                 .fused_conv_batch_norm = true,
                 .recomputed_max_pool = true,
                 .fused_max_pool_backward = true},
      .returns_scratch = true,
      .open = []() -> Result<OpenedBackend> {
        OpenedBackend b;
        DLPROBE_ASSIGN_OR_RETURN(b.allocator, host_allocator());
        DLPROBE_ASSIGN_OR_RETURN(b.backend, make_reference_backend(DType::fp32));
        return b;
      },
  };
}

const std::vector<BackendRow>& backend_rows() {
  static const std::vector<BackendRow> rows = {
      reference_row(),
#ifdef DLPROBE_TEST_ONEDNN
      onednn_row(),
#endif
  };
  return rows;
}

}  // namespace dlprobe::testing
