// Many steps over a data set of whole batches, cycled: a training run on a fixed image set in one
// call.
#include <fmt/format.h>

#include <cstring>

#include "dlprobe/step/training_step.h"

namespace dlprobe::engine {
namespace {

// Rows [first, first + rows) of `t` along its first dimension, contiguous in logical order.
HostTensor rows_of(const HostTensor& t, std::int64_t first, std::int64_t rows) {
  Shape s = t.shape();
  const std::int64_t per_row = t.numel() / s[0];
  s.dims[0] = rows;
  HostTensor out(TensorDesc::make(s, t.dtype()).value());
  const std::size_t row_bytes = static_cast<std::size_t>(per_row) * dtype_size(t.dtype());
  std::memcpy(out.data(), static_cast<const std::byte*>(t.data()) + first * row_bytes,
              static_cast<std::size_t>(rows) * row_bytes);
  return out;
}

}  // namespace

Result<std::vector<StepResult>> TrainingStep::run_steps(const HostTensor& images,
                                                        const HostTensor& labels,
                                                        std::int64_t steps) {
  const std::int64_t batch = config().batch;
  if (steps < 1) return invalid_argument(fmt::format("steps must be >= 1, got {}", steps));
  const std::int64_t n = images.shape().rank >= 1 ? images.shape()[0] : 0;
  if (n < batch || n % batch != 0) {
    return invalid_argument(
        fmt::format("images hold {} samples, not a whole number of batches of {}", n, batch));
  }
  if (labels.shape().rank != 1 || labels.shape()[0] != n) {
    return invalid_argument(
        fmt::format("labels must be [{}] (one per image), got [{}]", n, labels.shape().str()));
  }
  // Batches are slices along N, contiguous only in logical (NCHW) order.
  const HostTensor all = images.layout() == Layout::nchw ? images : images.to_layout(Layout::nchw);
  const std::int64_t batches = n / batch;
  std::vector<StepResult> results;
  results.reserve(static_cast<std::size_t>(steps));
  for (std::int64_t i = 0; i < steps; ++i) {
    // One batch needs setting once: set_input() would upload the same values each step.
    if (batches > 1 || i == 0) {
      const std::int64_t first = (i % batches) * batch;
      const Status s = set_input(rows_of(all, first, batch), rows_of(labels, first, batch));
      if (!s.is_ok()) {
        return batches > 1 ? s.with_context(fmt::format("batch {}", i % batches)) : s;
      }
    }
    DLPROBE_ASSIGN_OR_RETURN(StepResult r, run_step());
    results.push_back(r);
  }
  return results;
}

}  // namespace dlprobe::engine
