// safetensors by hand over nlohmann-json: the format is a length, a JSON header and raw bytes, and
// Debian ships no C++ safetensors library; the checks follow the reference implementation's
// (huggingface/safetensors) validation rules.
#include "dlprobe/engine/safetensors.h"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "dlprobe/core/files.h"

namespace dlprobe::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "tensor bytes are copied as they are: safetensors data is little-endian");

// The reference implementation refuses larger headers, so a corrupt length cannot make us read
// (or allocate) gigabytes of "JSON".
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct Code {
  DType dtype;
  std::string_view code;
};
constexpr Code kCodes[] = {{DType::fp64, "F64"},  {DType::fp32, "F32"},  {DType::fp16, "F16"},
                           {DType::bf16, "BF16"}, {DType::int64, "I64"}, {DType::int32, "I32"}};

Status bad(std::string message) {
  return invalid_argument("safetensors: " + std::move(message));
}

// numel * element size, or nullopt on overflow or a negative dimension.
std::optional<std::uint64_t> byte_size(const std::vector<std::int64_t>& shape, DType dtype) {
  std::uint64_t n = dtype_size(dtype);
  for (const std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > std::numeric_limits<std::uint64_t>::max() / u) return std::nullopt;
    n *= u;
  }
  return n;
}

struct Entry {
  Tensor tensor;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

Result<Entry> parse_entry(const std::string& name, const nlohmann::json& j) {
  if (!j.is_object()) return bad(fmt::format("entry '{}' is not an object", name));
  const auto dtype = j.find("dtype");
  const auto shape = j.find("shape");
  const auto offsets = j.find("data_offsets");
  if (dtype == j.end() || shape == j.end() || offsets == j.end()) {
    return bad(fmt::format("tensor '{}' lacks dtype, shape or data_offsets", name));
  }
  if (!dtype->is_string()) return bad(fmt::format("tensor '{}': dtype is not a string", name));
  Entry e;
  e.tensor.name = name;
  DLPROBE_ASSIGN_OR_RETURN(e.tensor.dtype, parse_dtype_code(dtype->get<std::string>()));
  if (!shape->is_array()) return bad(fmt::format("tensor '{}': shape is not an array", name));
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned()) {
      return bad(fmt::format("tensor '{}': shape {} holds a non-integer or negative dimension",
                             name, shape->dump()));
    }
    const auto v = d.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return bad(fmt::format("tensor '{}': dimension {} is too large", name, v));
    }
    e.tensor.shape.push_back(static_cast<std::int64_t>(v));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return bad(fmt::format("tensor '{}': data_offsets must be two non-negative integers", name));
  }
  e.begin = (*offsets)[0].get<std::uint64_t>();
  e.end = (*offsets)[1].get<std::uint64_t>();
  if (e.end < e.begin) {
    return bad(fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name,
                           e.begin, e.end));
  }
  const auto bytes = byte_size(e.tensor.shape, e.tensor.dtype);
  if (!bytes || *bytes != e.end - e.begin) {
    return bad(fmt::format("tensor '{}': data_offsets [{}, {}] hold {} bytes, {} {} needs {}", name,
                           e.begin, e.end, e.end - e.begin, dtype->get<std::string>(),
                           shape->dump(), bytes ? fmt::format("{}", *bytes) : "too many"));
  }
  return e;
}

}  // namespace

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

const Tensor* File::find(std::string_view name) const {
  for (const Tensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<DType> parse_dtype_code(std::string_view code) {
  for (const Code& c : kCodes) {
    if (c.code == code) return c.dtype;
  }
  return bad(
      fmt::format("unsupported dtype '{}' (expected F64, F32, F16, BF16, I64 or I32)", code));
}

std::string_view dtype_code(DType dtype) {
  for (const Code& c : kCodes) {
    if (c.dtype == dtype) return c.code;
  }
  return "?";
}

Result<File> parse(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) {
    return bad(
        fmt::format("file of {} bytes is too short for the 8-byte header length", bytes.size()));
  }
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const std::uint64_t rest = bytes.size() - 8;
  if (header_len > kMaxHeaderBytes) {
    return bad(
        fmt::format("header length {} exceeds the {} byte limit", header_len, kMaxHeaderBytes));
  }
  if (header_len > rest) {
    return bad(fmt::format("header length {} runs past the end of the file ({} bytes after it)",
                           header_len, rest));
  }
  const auto* begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const nlohmann::json header =
      nlohmann::json::parse(begin, begin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return bad("header is not valid JSON");
  if (!header.is_object()) return bad("header is not a JSON object");

  File file;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          return bad(fmt::format("__metadata__ value of '{}' is not a string", mk));
        file.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    DLPROBE_ASSIGN_OR_RETURN(Entry e, parse_entry(key, value));
    entries.push_back(std::move(e));
  }
  // The data area must be covered exactly: tensors back to back from 0, no gaps, no overlap.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const std::uint64_t data_len = rest - header_len;
  std::uint64_t expected = 0;
  for (const Entry& e : entries) {
    if (e.begin != expected) {
      return bad(fmt::format(
          "tensor '{}' starts at byte {} of the data, expected {} ({})", e.tensor.name, e.begin,
          expected,
          e.begin < expected ? "it overlaps the previous tensor" : "a gap no tensor covers"));
    }
    if (e.end > data_len) {
      return bad(fmt::format("tensor '{}' ends at byte {}, past the {} bytes of data",
                             e.tensor.name, e.end, data_len));
    }
    expected = e.end;
  }
  if (expected != data_len) {
    // read_file reads one byte past the header's data, so the count of what follows is unknown.
    return bad(fmt::format("more data follows the last tensor, which ends at byte {} of the data",
                           expected));
  }
  const std::byte* data = bytes.data() + 8 + header_len;
  for (Entry& e : entries) {
    e.tensor.data.assign(data + e.begin, data + e.end);
    file.tensors.push_back(std::move(e.tensor));
  }
  return file;
}

Result<std::vector<std::byte>> serialize(const File& file) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const Tensor& t : file.tensors) {
    if (t.name == "__metadata__") return bad("'__metadata__' cannot name a tensor");
    if (!names.insert(t.name).second) return bad(fmt::format("tensor '{}' appears twice", t.name));
    const auto bytes = byte_size(t.shape, t.dtype);
    if (!bytes || *bytes != t.data.size()) {
      return bad(fmt::format("tensor '{}' holds {} bytes, its {} shape needs {}", t.name,
                             t.data.size(), dtype_code(t.dtype),
                             bytes ? fmt::format("{}", *bytes) : "too many"));
    }
    header[t.name] = {{"dtype", dtype_code(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size());
  const std::uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  out.reserve(out.size() + offset);
  for (const Tensor& t : file.tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

namespace {

// Where the data area ends by the header's data_offsets (0 where the header is not one parse()
// would take: parse() then says what is wrong with it).
std::uint64_t data_end_of(const char* header, std::uint64_t len) {
  const nlohmann::json h = nlohmann::json::parse(header, header + len, nullptr, false);
  std::uint64_t end = 0;
  if (!h.is_object()) return 0;
  for (const auto& [key, value] : h.items()) {
    if (key == "__metadata__" || !value.is_object()) continue;
    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[1].is_number_unsigned()) {
      continue;
    }
    end = std::max(end, (*offsets)[1].get<std::uint64_t>());
  }
  return end;
}

}  // namespace

Result<File> read_file(const std::string& path) {
  // open_to_read: a named pipe that nothing writes to reads as empty, not waited on forever.
  DLPROBE_ASSIGN_OR_RETURN(const int fd, open_to_read(path));
  // Only as much as the header says the file holds, and one byte more to see whether anything
  // follows: an endless input (/dev/zero, a pipe that does not end) is then judged by its header
  // instead of read until memory runs out. Block reads: a character-by-character copy takes
  // seconds for a ResNet's 45-100 MB state dict in the unoptimised (sanitizer) build.
  std::vector<char> raw;
  int read_error = 0;
  bool ended = false;
  const auto read_up_to = [&](std::uint64_t total) {
    constexpr std::uint64_t kBlock = std::uint64_t{1} << 22;
    while (!ended && read_error == 0 && raw.size() < total) {
      const std::size_t have = raw.size();
      const auto want = static_cast<std::size_t>(std::min(kBlock, total - have));
      raw.resize(have + want);
      const ssize_t n = ::read(fd, raw.data() + have, want);
      raw.resize(have + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      if (n < 0 && errno != EINTR) read_error = errno;
      if (n == 0) ended = true;
    }
  };
  read_up_to(8);
  if (raw.size() == 8) {
    std::uint64_t header_len = 0;
    std::memcpy(&header_len, raw.data(), 8);
    if (header_len <= kMaxHeaderBytes) {
      read_up_to(8 + header_len);
      if (raw.size() == 8 + header_len) {
        const std::uint64_t data = data_end_of(raw.data() + 8, header_len);
        read_up_to(8 + header_len + data + 1);
      }
    }
  }
  ::close(fd);
  if (read_error != 0) {
    return error(Errc::io_error,
                 fmt::format("{}: cannot read: {}", path, std::strerror(read_error)));
  }
  Result<File> file = parse(std::as_bytes(std::span<const char>(raw)));
  if (!file.has_value()) return file.status().with_context(path);
  return file;
}

Status write_file(const std::string& path, const File& file) {
  DLPROBE_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, serialize(file));
  return write_file_atomic(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace dlprobe::safetensors
