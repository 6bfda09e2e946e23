#include "dlprobe/allocator/gpu_memory_option.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "dlprobe/core/units.h"

namespace dlprobe::memory {
namespace {

constexpr std::string_view kAccepted =
    "grow, prealloc, prealloc:FRACTION, prealloc:SIZE, limit:SIZE, planned, or planned+MODE";

Status bad(std::string_view flag, std::string_view text, std::string_view why) {
  return invalid_argument(fmt::format("{}: '{}' {} (accepts {})", flag, text, why, kAccepted));
}

// A size has a unit letter ("8GiB", "512M"); "0.5" and "50%" are fractions of the device.
bool looks_like_size(std::string_view v) {
  return std::any_of(v.begin(), v.end(),
                     [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; });
}

Status parse_allocator_mode(std::string_view part, std::string_view flag, std::string_view text,
                            AllocatorOptions& out) {
  if (part == "grow") {
    out = {};
    return Status::ok();
  }
  if (part == "prealloc") {
    out = {};
    out.mode = Mode::preallocate;
    out.preallocate_fraction = kDefaultPreallocateFraction;
    return Status::ok();
  }
  if (part.starts_with("prealloc:")) {
    const std::string_view value = part.substr(9);
    out = {};
    out.mode = Mode::preallocate;
    if (looks_like_size(value)) {
      DLPROBE_ASSIGN_OR_RETURN(out.preallocate_bytes, parse_size(value, flag));
      if (out.preallocate_bytes == 0) return bad(flag, text, "preallocates nothing");
      return Status::ok();
    }
    DLPROBE_ASSIGN_OR_RETURN(out.preallocate_fraction, parse_fraction(value, flag));
    if (out.preallocate_fraction == 0.0) return bad(flag, text, "preallocates nothing");
    return Status::ok();
  }
  if (part.starts_with("limit:")) {
    out = {};
    out.mode = Mode::limit;
    DLPROBE_ASSIGN_OR_RETURN(out.limit_bytes, parse_size(part.substr(6), flag));
    if (out.limit_bytes == 0) return bad(flag, text, "is a limit of nothing");
    return Status::ok();
  }
  return bad(flag, text, fmt::format("has an unknown mode '{}'", part));
}

}  // namespace

Result<GpuMemoryOption> parse_gpu_memory(std::string_view text, std::string_view flag) {
  GpuMemoryOption option;
  option.text = std::string(text);
  if (text.empty()) return bad(flag, text, "is empty");
  bool have_mode = false;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t plus = std::min(text.find('+', start), text.size());
    const std::string_view part = text.substr(start, plus - start);
    start = plus + 1;
    if (part == "planned") {
      if (option.planned) return bad(flag, text, "names planned twice");
      option.planned = true;
      continue;
    }
    if (part.empty()) return bad(flag, text, "has an empty part");
    if (have_mode) return bad(flag, text, "names two allocator modes");
    have_mode = true;
    DLPROBE_RETURN_IF_ERROR(parse_allocator_mode(part, flag, text, option.allocator));
  }
  return option;
}

}  // namespace dlprobe::memory
