// Whole-file reads and atomic rewrites.
#include "dlprobe/core/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/temp_folder.h"

namespace dlprobe {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  testing::TempFolder dir_;
};

TEST_F(FilesTest, WriteThenReadGivesTheBytes) {
  const std::string content("line one\n\0binary\xff", 17);
  ASSERT_TRUE(write_file_atomic(dir_ / "a.bin", content).is_ok());
  auto back = read_whole_file(dir_ / "a.bin");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(*back, content);
}

TEST_F(FilesTest, RewriteReplacesAndLeavesNoTemporary) {
  ASSERT_TRUE(write_file_atomic(dir_ / "a.json", std::string(100'000, 'x')).is_ok());
  ASSERT_TRUE(write_file_atomic(dir_ / "a.json", "short").is_ok());
  EXPECT_EQ(read_whole_file(dir_ / "a.json").value(), "short");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST_F(FilesTest, LargeFileReadsWhole) {
  std::string big(300'000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(write_file_atomic(dir_ / "big", big).is_ok());
  EXPECT_EQ(read_whole_file(dir_ / "big").value(), big);
}

TEST_F(FilesTest, MissingFileIsNotFound) {
  auto r = read_whole_file(dir_ / "none");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::not_found);
  EXPECT_NE(r.status().message().find("none"), std::string::npos);
}

TEST_F(FilesTest, UnwritableFolderIsAnIoErrorNamingThePath) {
  const Status s = write_file_atomic(dir_ / "no" / "such" / "x.json", "x");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Errc::io_error);
  EXPECT_NE(s.message().find("x.json"), std::string::npos);
}

TEST_F(FilesTest, ReadingAFolderIsAnIoError) {
  auto r = read_whole_file(dir_.path());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::io_error);
}

}  // namespace
}  // namespace dlprobe
