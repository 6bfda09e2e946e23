#include "dlprobe/engine/cpu_backend.h"
#include "host_rows.h"
#include "test_util.h"

namespace dlprobe::testing {

// fp32 always; bf16 where oneDNN runs it (AVX-512 and newer); fp16 it refuses.
BackendRow onednn_row() {
  return {
      .name = "onednn",
      .precisions = {kFp32, kBf16},
      .offers = {.fused_batch_norm_relu = true,
                 .fused_relu_backward_add = true,
                 .mixed_layouts = true},
      .returns_scratch = true,
      .open = []() -> Result<OpenedBackend> {
        OpenedBackend b;
        DLPROBE_ASSIGN_OR_RETURN(b.allocator, host_allocator());
        DLPROBE_ASSIGN_OR_RETURN(b.backend, make_cpu_backend(*b.allocator));
        return b;
      },
      // Asked of the backend itself, through a tiny ReLU.
      .unavailable = [](Backend& b, Precision p) -> std::optional<std::string> {
        if (p.dtype != DType::bf16) return std::nullopt;
        HostTensor x = HostTensor::zeros(desc({1, 1, 1, 2}, DType::bf16));
        HostTensor y(x.desc());
        if (b.relu_forward(x.view(), y.view()).is_ok()) return std::nullopt;
        return "this CPU has no AVX-512: oneDNN 2.6 runs no bf16 here";
      },
  };
}

}  // namespace dlprobe::testing
