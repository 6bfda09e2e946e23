#include "dlprobe/engine/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace dlprobe::safetensors {
namespace {

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// The file layout written out by hand: length, header, data.
std::vector<std::byte> file_with_header(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return bytes_of(out + header + data);
}

std::vector<std::byte> f32(std::initializer_list<float> values) {
  std::vector<std::byte> out(values.size() * 4);
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

TEST(SafetensorsTest, SerialisesToTheExpectedBytes) {
  File f;
  f.tensors.push_back({"b", DType::fp32, {2}, f32({1.0f, 2.0f})});
  f.tensors.push_back({"a.count", DType::int64, {}, std::vector<std::byte>(8, std::byte{0})});
  f.tensors[1].data[0] = std::byte{7};
  f.metadata["format"] = "pt";
  // Keys sorted, compact JSON, padded with spaces to a multiple of 8; data in tensor order.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a.count":{"data_offsets":[8,16],"dtype":"I64",)"
      R"("shape":[]},"b":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string data(16, '\0');
  const float one = 1.0f, two = 2.0f;
  std::memcpy(data.data(), &one, 4);
  std::memcpy(data.data() + 4, &two, 4);
  data[8] = 7;
  const std::vector<std::byte> expected = file_with_header(padded, data);
  const Result<std::vector<std::byte>> got = serialize(f);
  ASSERT_TRUE(got.has_value()) << got.status().message();
  EXPECT_EQ(*got, expected);
  EXPECT_EQ(padded.size() % 8, 0u);
}

TEST(SafetensorsTest, RoundTripsThroughBytesAndFiles) {
  File f;
  f.tensors.push_back({"conv.weight", DType::fp32, {2, 1, 1, 1}, f32({0.5f, -3.0f})});
  f.tensors.push_back({"h", DType::fp16, {3}, std::vector<std::byte>(6, std::byte{1})});
  f.tensors.push_back({"g", DType::bf16, {1}, std::vector<std::byte>(2, std::byte{2})});
  f.tensors.push_back({"d", DType::fp64, {1}, std::vector<std::byte>(8, std::byte{3})});
  f.tensors.push_back({"i", DType::int32, {1, 1}, std::vector<std::byte>(4, std::byte{4})});
  f.tensors.push_back({"empty", DType::fp32, {0, 3}, {}});
  const std::string path = ::testing::TempDir() + "roundtrip.safetensors";
  ASSERT_TRUE(write_file(path, f).is_ok());
  const Result<File> back = read_file(path);
  ASSERT_TRUE(back.has_value()) << back.status().message();
  ASSERT_EQ(back->tensors.size(), f.tensors.size());
  for (const Tensor& t : f.tensors) {
    const Tensor* u = back->find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->dtype, t.dtype);
    EXPECT_EQ(u->shape, t.shape);
    EXPECT_EQ(u->data, t.data);
  }
  EXPECT_TRUE(back->metadata.empty());
}

TEST(SafetensorsTest, ReadsAHandBuiltFile) {
  const std::string header =
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
      R"("y":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})";
  std::string data(12, '\0');
  const std::int32_t y = -5;
  const float x[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), &y, 4);
  std::memcpy(data.data() + 4, x, 8);
  const Result<File> f = parse(file_with_header(header, data));
  ASSERT_TRUE(f.has_value()) << f.status().message();
  ASSERT_EQ(f->tensors.size(), 2u);
  EXPECT_EQ(f->tensors[0].name, "y");  // data order
  float back[2];
  std::memcpy(back, f->find("x")->data.data(), 8);
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.0f);
  EXPECT_EQ(f->metadata.at("k"), "v");
}

void expect_refused(const std::vector<std::byte>& bytes, const std::string& needle) {
  const Result<File> f = parse(bytes);
  ASSERT_FALSE(f.has_value()) << needle;
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().message();
  EXPECT_EQ(f.status().message().find('\n'), std::string::npos);
}

TEST(SafetensorsTest, RefusesMalformedFiles) {
  const std::string ok = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_refused(bytes_of("abc"), "too short");
  std::vector<std::byte> truncated = file_with_header(ok, "1234");
  truncated.resize(20);
  expect_refused(truncated, "runs past the end");
  expect_refused(file_with_header("{\"x\": [", ""), "not valid JSON");
  expect_refused(file_with_header("[1, 2]", ""), "not a JSON object");
  expect_refused(file_with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})",
                                  std::string(8, '\0')),
                 "hold 8 bytes");
  expect_refused(
      file_with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "12"),
      "past the 2 bytes");
  expect_refused(file_with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                  std::string(8, '\0')),
                 "overlaps");
  expect_refused(file_with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                  std::string(8, '\0')),
                 "gap");
  expect_refused(file_with_header(ok, std::string(8, '\0')), "follows the last tensor");
  expect_refused(file_with_header(R"({"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})",
                                  std::string(1, '\0')),
                 "unsupported dtype 'F8_E4M3'");
  expect_refused(file_with_header(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                                  std::string(4, '\0')),
                 "negative");
  expect_refused(file_with_header(R"({"x":{"dtype":"F32","shape":[1]}})", ""), "lacks");
  expect_refused(file_with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",
                                  std::string(4, '\0')),
                 "end before");
  // A header length beyond any sane header is refused before it is read.
  std::vector<std::byte> huge = file_with_header(ok, "1234");
  const std::uint64_t n = std::uint64_t{1} << 40;
  std::memcpy(huge.data(), &n, 8);
  expect_refused(huge, "exceeds");
}

TEST(SafetensorsTest, SerialiseRefusesInconsistentTensors) {
  File f;
  f.tensors.push_back({"a", DType::fp32, {3}, f32({1.0f})});
  EXPECT_FALSE(serialize(f).has_value());
  File dup;
  dup.tensors.push_back({"a", DType::fp32, {1}, f32({1.0f})});
  dup.tensors.push_back({"a", DType::fp32, {1}, f32({2.0f})});
  EXPECT_FALSE(serialize(dup).has_value());
  EXPECT_FALSE(read_file("/nonexistent/x.safetensors").has_value());
}

// A file is read as far as its header says it reaches (and a byte more): an endless input is
// refused by its header at once instead of read until memory runs out, and bytes after the last
// tensor are still seen.
TEST(SafetensorsTest, ReadsNoFurtherThanTheHeaderSays) {
  const Result<File> zero = read_file("/dev/zero");
  ASSERT_FALSE(zero.has_value());
  EXPECT_NE(zero.status().message().find("/dev/zero"), std::string::npos);
  // A named pipe that nothing writes to is read as empty at once, not waited on.
  const std::string fifo = ::testing::TempDir() + "st_fifo_" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Result<File> pipe = read_file(fifo);
  ::unlink(fifo.c_str());
  ASSERT_FALSE(pipe.has_value());
  EXPECT_NE(pipe.status().message().find("file of 0 bytes is too short"), std::string::npos)
      << pipe.status().message();

  File f;
  f.tensors.push_back({"w", DType::fp32, {2}, f32({1.0f, 2.0f})});
  const std::string path = ::testing::TempDir() + "trailing.safetensors";
  ASSERT_TRUE(write_file(path, f).is_ok());
  ASSERT_TRUE(read_file(path).has_value());
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << "trailing bytes";
  }
  const Result<File> trailing = read_file(path);
  ASSERT_FALSE(trailing.has_value());
  // Read one byte past the tensors, the file cannot say how much follows; the message does not.
  EXPECT_NE(trailing.status().message().find(
                "more data follows the last tensor, which ends at byte 8 of the data"),
            std::string::npos)
      << trailing.status().message();
}

}  // namespace
}  // namespace dlprobe::safetensors
