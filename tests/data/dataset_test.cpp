#include "dlprobe/data/dataset.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/temp_folder.h"

namespace dlprobe::data {
namespace {

void touch(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << "x";
}

TEST(Dataset, ImageFolderClassesAreSortedAndLabelsAreTheirIndices) {
  testing::TempFolder dir;
  touch(dir / "zebra/b.jpg");
  touch(dir / "zebra/a.JPEG");
  touch(dir / "ant/nested/c.jpeg");
  touch(dir / "ant/notes.txt");
  std::filesystem::create_directories(dir / "empty_class");
  auto listed = list_dataset(dir.path());
  ASSERT_TRUE(listed) << listed.status().message();
  EXPECT_EQ(listed->classes, (std::vector<std::string>{"ant", "empty_class", "zebra"}));
  ASSERT_EQ(listed->samples.size(), 3u);
  EXPECT_EQ(listed->samples[0].path, dir / "ant/nested/c.jpeg");
  EXPECT_EQ(listed->samples[0].label, 0);
  EXPECT_EQ(listed->samples[1].path, dir / "zebra/a.JPEG");
  EXPECT_EQ(listed->samples[1].label, 2);
  EXPECT_EQ(listed->samples[2].path, dir / "zebra/b.jpg");
  EXPECT_EQ(listed->samples[2].label, 2);
}

TEST(Dataset, FlatFolderHasOneClassOfItsJpegFiles) {
  testing::TempFolder dir;
  touch(dir / "b.jpg");
  touch(dir / "a.jpeg");
  touch(dir / "c.png");
  auto listed = list_dataset(dir.path());
  ASSERT_TRUE(listed) << listed.status().message();
  EXPECT_TRUE(listed->classes.empty());
  ASSERT_EQ(listed->samples.size(), 2u);
  EXPECT_EQ(listed->samples[0].path, dir / "a.jpeg");
  EXPECT_EQ(listed->samples[1].path, dir / "b.jpg");
  EXPECT_EQ(listed->samples[1].label, 0);
}

// Links to folders are followed, each folder once: links to the class's own folder (a loop) add
// nothing, and a link to another folder adds its files.
TEST(Dataset, FolderLinksAreFollowedOnce) {
  testing::TempFolder dir;
  touch(dir / "data/cat/a.jpg");
  touch(dir / "elsewhere/b.jpg");
  for (const char* name : {"l1", "l2", "l3"}) {
    std::filesystem::create_directory_symlink(".", dir / "data/cat" / name);
  }
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "data/cat/more");
  auto listed = list_dataset(dir / "data");
  ASSERT_TRUE(listed) << listed.status().message();
  ASSERT_EQ(listed->samples.size(), 2u);
  EXPECT_EQ(listed->samples[0].path, dir / "data/cat/a.jpg");
  EXPECT_EQ(listed->samples[1].path, dir / "data/cat/more/b.jpg");
}

TEST(Dataset, EmptyOrMissingFolderIsOneLineNamingIt) {
  testing::TempFolder dir;
  touch(dir / "only.txt");
  auto empty = list_dataset(dir.path());
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.status().message().find(dir.path().string()), std::string::npos);
  EXPECT_EQ(empty.status().message().find('\n'), std::string::npos);

  std::filesystem::create_directories(dir / "classes/a");
  auto no_files = list_dataset(dir / "classes");
  ASSERT_FALSE(no_files);
  EXPECT_NE(no_files.status().message().find("class folders"), std::string::npos);

  auto missing = list_dataset(dir / "missing");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), Errc::not_found);
  EXPECT_NE(missing.status().message().find((dir / "missing").string()), std::string::npos);

  auto file = list_dataset(dir / "only.txt");
  ASSERT_FALSE(file);
  EXPECT_EQ(file.status().code(), Errc::invalid_argument);
}

}  // namespace
}  // namespace dlprobe::data
