#include "dlprobe/data/make_dataset.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "common/temp_folder.h"
#include "dlprobe/data/dataset.h"
#include "dlprobe/data/decoder.h"

namespace dlprobe::data {
namespace {

std::vector<std::uint8_t> bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(MakeDataset, WritesDecodableImageNetLikeJpegsInClassFolders) {
  testing::TempFolder dir;
  MakeDatasetOptions o;
  o.images = 12;
  o.classes = 3;
  o.seed = 4;
  auto made = make_dataset(dir / "a", o);
  ASSERT_TRUE(made) << made.status().message();
  EXPECT_EQ(made->images, 12);
  // Photograph-like compression at quality 90 (ImageNet: 0.35 to 0.45 bytes per pixel).
  EXPECT_GT(made->bytes_per_pixel(), 0.3);
  EXPECT_LT(made->bytes_per_pixel(), 0.5);
  EXPECT_GT(made->mean_width * made->mean_height, 60000);
  EXPECT_LT(made->mean_width * made->mean_height, 300000);
  auto listed = list_dataset(dir / "a");
  ASSERT_TRUE(listed) << listed.status().message();
  EXPECT_EQ(listed->classes, (std::vector<std::string>{"class_0000", "class_0001", "class_0002"}));
  ASSERT_EQ(listed->samples.size(), 12u);
  auto decoder = make_host_decoder();
  ASSERT_TRUE(decoder);
  std::uint64_t bytes = 0;
  std::uint64_t pixels = 0;
  std::set<std::pair<int, int>> sizes;
  for (const Sample& s : listed->samples) {
    const auto file = bytes_of(s.path);
    bytes += file.size();
    Image image;
    ASSERT_FALSE((*decoder)->decode(file, {}, image)) << s.path;
    pixels += static_cast<std::uint64_t>(image.width) * static_cast<std::uint64_t>(image.height);
    sizes.insert({image.width, image.height});
    // Neither flat nor white noise: neighbouring pixels are close, the image spans a range.
    double step = 0;
    int low = 255, high = 0;
    for (std::size_t i = 3; i < image.rgb.size(); ++i) {
      step += std::abs(int(image.rgb[i]) - int(image.rgb[i - 3]));
      low = std::min(low, int(image.rgb[i]));
      high = std::max(high, int(image.rgb[i]));
    }
    step /= static_cast<double>(image.rgb.size());
    EXPECT_GT(step, 2.0) << s.path;
    EXPECT_LT(step, 30.0) << s.path;
    EXPECT_GT(high - low, 100) << s.path;
  }
  EXPECT_EQ(bytes, made->bytes);
  EXPECT_EQ(pixels, made->pixels);
  EXPECT_GT(sizes.size(), 8u);

  // The same options make the same files; another seed other files.
  ASSERT_TRUE(make_dataset(dir / "b", o));
  EXPECT_EQ(bytes_of(dir / "a/class_0001/img_00000004.jpg"),
            bytes_of(dir / "b/class_0001/img_00000004.jpg"));
  o.seed = 5;
  ASSERT_TRUE(make_dataset(dir / "c", o));
  EXPECT_NE(bytes_of(dir / "a/class_0001/img_00000004.jpg"),
            bytes_of(dir / "c/class_0001/img_00000004.jpg"));
}

TEST(MakeDataset, RefusesAFolderThatHoldsSomething) {
  testing::TempFolder dir;
  std::ofstream(dir / "earlier.txt") << "x";
  auto made = make_dataset(dir.path(), {});
  ASSERT_FALSE(made);
  EXPECT_NE(made.status().message().find(dir.path().string() + ": not empty"), std::string::npos);
  MakeDatasetOptions o;
  o.images = 0;
  EXPECT_FALSE(make_dataset(dir / "new", o));
}

}  // namespace
}  // namespace dlprobe::data
