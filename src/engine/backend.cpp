#include "dlprobe/backend.h"

#include <fmt/format.h>

namespace dlprobe {

Status Backend::mark(std::size_t index) {
  if (index >= host_marks_.size()) {
    host_marks_.resize(index + 1);
    host_marked_.resize(index + 1, false);
  }
  host_marks_[index] = std::chrono::steady_clock::now();
  host_marked_[index] = true;
  return Status::ok();
}

Result<double> Backend::elapsed_ms(std::size_t from, std::size_t to) {
  for (const std::size_t i : {from, to}) {
    if (i >= host_marked_.size() || !host_marked_[i]) {
      return invalid_argument(fmt::format("timing mark {} was never recorded", i));
    }
  }
  return std::chrono::duration<double, std::milli>(host_marks_[to] - host_marks_[from]).count();
}

}  // namespace dlprobe
