// The safetensors file format (what safetensors.torch.save_file writes and load_file reads):
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object: for each tensor name {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]} (offsets relative to the byte after the header), and
//             optionally "__metadata__": {string: string}
//   the data  every tensor's bytes, little-endian, row-major (C-contiguous), back to back
// Only the dtypes the engine uses are accepted: F64, F32, F16, BF16, I64, I32.
//
// The reader refuses anything the format forbids rather than guessing: a header running past the
// file, JSON that is not an object, an unknown dtype, offsets that do not match the shape or run
// past the data, tensors that overlap, and bytes of the data area that no tensor covers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/dtype.h"

namespace dlprobe::safetensors {

struct Tensor {
  std::string name;
  DType dtype = DType::fp32;
  std::vector<std::int64_t> shape;  // empty for a 0-dimensional tensor
  std::vector<std::byte> data;      // row-major
  std::int64_t numel() const;
};

struct File {
  std::vector<Tensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  // Null when absent.
  const Tensor* find(std::string_view name) const;
};

// "F32" etc. <-> DType.
Result<DType> parse_dtype_code(std::string_view code);
std::string_view dtype_code(DType dtype);

Result<File> parse(std::span<const std::byte> bytes);
// The header lists tensors by name (JSON object keys in sorted order) with offsets in the order of
// `file.tensors`, and is padded with spaces to a multiple of 8 bytes so the data starts aligned,
// as the reference implementation does. Duplicate names and data sizes that do not match the shape
// are errors.
Result<std::vector<std::byte>> serialize(const File& file);

Result<File> read_file(const std::string& path);
// serialize(), then core's write_file_atomic (a file replaced whole; "-" is standard output).
Status write_file(const std::string& path, const File& file);

}  // namespace dlprobe::safetensors
