// The safetensors reader (safetensors::parse): any bytes give a file or an error that says why, and
// a file it accepts serializes and parses back to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "dlprobe/engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace st = dlprobe::safetensors;
  auto file = st::parse(std::as_bytes(std::span(data, size)));
  if (!file) {
    if (file.status().message().empty()) std::abort();
    return 0;
  }
  auto bytes = st::serialize(*file);
  if (!bytes) return 0;  // names the format allows but serialize refuses are the writer's choice
  auto again = st::parse(*bytes);
  if (!again || again->tensors.size() != file->tensors.size() ||
      again->metadata != file->metadata) {
    std::abort();
  }
  for (std::size_t i = 0; i < file->tensors.size(); ++i) {
    const st::Tensor& a = file->tensors[i];
    const st::Tensor& b = again->tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.data != b.data) {
      std::abort();
    }
  }
  return 0;
}
