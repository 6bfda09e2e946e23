#include "dlprobe/data/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "common/temp_folder.h"
#include "dlprobe/core/files.h"
#include "jpeg_files.h"

namespace dlprobe::data {
namespace {

using testing::encode;
using testing::write_bytes;

// `per_class` JPEGs in each of `classes` class folders, of varied sizes, every one different.
Dataset make_folder(const testing::TempFolder& dir, int classes, int per_class) {
  for (int k = 0; k < classes; ++k) {
    for (int i = 0; i < per_class; ++i) {
      const int width = 40 + 13 * ((k * per_class + i) % 7);
      const int height = 36 + 11 * ((k * per_class + i) % 5);
      auto rgb = testing::smooth_rgb(width, height);
      rgb[0] = static_cast<std::uint8_t>(k * per_class + i);
      write_bytes(dir / ("c" + std::to_string(k) + "/" + std::to_string(i) + ".jpg"),
                  encode(rgb, width, height, TJPF_RGB, TJSAMP_420, 90));
    }
  }
  auto listed = list_dataset(dir.path());
  EXPECT_TRUE(listed) << listed.status().message();
  return *listed;
}

LoaderOptions small_options() {
  LoaderOptions o;
  o.batch_size = 4;
  o.augment.size = 24;
  o.seed = 9;
  return o;
}

struct Delivered {
  std::vector<std::uint64_t> indices;
  std::vector<std::size_t> samples;
  std::vector<int> labels;
  std::vector<std::byte> data;
  std::uint64_t bytes_read = 0;
};

Delivered drain(const Dataset& dataset, const LoaderOptions& options) {
  auto loader = Loader::start(dataset, options);
  EXPECT_TRUE(loader) << loader.status().message();
  Delivered d;
  for (;;) {
    auto batch = (*loader)->next();
    EXPECT_TRUE(batch) << batch.status().message();
    if (!batch || !*batch) break;
    const BatchView& b = **batch;
    d.indices.push_back(b.index);
    d.samples.insert(d.samples.end(), b.samples.begin(), b.samples.end());
    d.labels.insert(d.labels.end(), b.labels.begin(), b.labels.end());
    d.data.insert(d.data.end(), b.data.begin(), b.data.end());
    d.bytes_read += b.bytes_read;
  }
  return d;
}

TEST(Loader, SameSeedSameBytesWhateverTheThreadCount) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 3, 5);
  LoaderOptions o = small_options();
  o.epochs = 2;
  const Delivered one = drain(dataset, o);
  o.threads = 3;
  o.prefetch = 1;
  const Delivered three = drain(dataset, o);
  ASSERT_EQ(one.samples.size(), 30u);
  EXPECT_EQ(one.samples, three.samples);
  EXPECT_EQ(one.labels, three.labels);
  EXPECT_TRUE(one.data == three.data);
  EXPECT_EQ(one.data.size(), 30 * sample_bytes(o.augment));
  o.seed = 10;
  const Delivered other = drain(dataset, o);
  EXPECT_FALSE(one.data == other.data);
  EXPECT_NE(one.samples, other.samples);
}

TEST(Loader, EveryEpochIsAPermutationInOrderedBatches) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 2, 5);
  LoaderOptions o = small_options();
  o.epochs = 3;
  o.threads = 2;
  const Delivered d = drain(dataset, o);
  // 10 samples in batches of 4: 4, 4, 2 per epoch.
  EXPECT_EQ(d.indices, (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_EQ(d.samples.size(), 30u);
  std::vector<std::vector<std::size_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<std::size_t> epoch(d.samples.begin() + e * 10, d.samples.begin() + e * 10 + 10);
    for (std::size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(d.labels[e * 10 + i], dataset.samples[epoch[i]].label);
    }
    epochs.push_back(epoch);
    std::sort(epoch.begin(), epoch.end());
    for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(epoch[i], i);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  o.shuffle = false;
  o.epochs = 1;
  const Delivered in_order = drain(dataset, o);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(in_order.samples[i], i);
}

TEST(Loader, SampleBytesAreAugmentSampleOfTheFile) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 1, 3);
  LoaderOptions o = small_options();
  o.shuffle = false;
  o.augment.type = SampleType::bf16;
  o.augment.layout = SampleLayout::nhwc;
  const Delivered d = drain(dataset, o);
  auto decoder = make_host_decoder();
  ASSERT_TRUE(decoder);
  Image scratch;
  const std::size_t bytes = sample_bytes(o.augment);
  for (std::size_t i = 0; i < 3; ++i) {
    std::ifstream in(dataset.samples[i].path, std::ios::binary);
    std::vector<std::uint8_t> file((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::byte> out(bytes);
    ASSERT_FALSE(augment_sample(**decoder, file, o, 0, i, scratch, out));
    EXPECT_EQ(std::memcmp(out.data(), d.data.data() + i * bytes, bytes), 0) << i;
  }
}

// The mean absolute difference of two fp32 sample buffers.
double mean_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  EXPECT_EQ(a.size(), b.size());
  const std::size_t n = std::min(a.size(), b.size()) / 4;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float x, y;
    std::memcpy(&x, a.data() + 4 * i, 4);
    std::memcpy(&y, b.data() + 4 * i, 4);
    sum += std::abs(double(x) - y);
  }
  return sum / static_cast<double>(n);
}

TEST(Loader, DctScalingGivesNearlyTheFullSizeResult) {
  testing::TempFolder dir;
  // Large smooth images whose crops are resized to 16 pixels: most decode at 1/2 .. 1/8.
  for (int i = 0; i < 6; ++i) {
    write_bytes(dir / (std::to_string(i) + ".jpg"),
                encode(testing::smooth_rgb(400 + 40 * i, 300), 400 + 40 * i, 300));
  }
  const Dataset dataset = *list_dataset(dir.path());
  LoaderOptions o = small_options();
  o.augment.size = 16;
  const Delivered scaled = drain(dataset, o);
  o.dct_scaling = false;
  const Delivered full = drain(dataset, o);
  // Normalised values span about 4.5; the two differ by the DCT's smoothing only.
  EXPECT_LT(mean_difference(scaled.data, full.data), 0.03);
  EXPECT_FALSE(scaled.data == full.data);
  // Reading the same files, but decoding less of each.
  EXPECT_EQ(scaled.bytes_read, full.bytes_read);
}

TEST(Loader, CacheGivesTheFullSizeResultAndReadsOnce) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 2, 3);
  LoaderOptions o = small_options();
  o.epochs = 3;
  o.dct_scaling = false;
  const Delivered uncached = drain(dataset, o);
  o.cache_bytes = 1 << 20;
  const Delivered cached = drain(dataset, o);
  EXPECT_TRUE(cached.data == uncached.data);
  EXPECT_EQ(uncached.bytes_read, 3 * cached.bytes_read);
  // A cache too small for one image reads every epoch.
  o.cache_bytes = 100;
  EXPECT_EQ(drain(dataset, o).bytes_read, uncached.bytes_read);
}

TEST(Loader, ReadAndDecodeStagesDeliverNoSamples) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 1, 5);
  for (Stage stage : {Stage::read, Stage::decode}) {
    LoaderOptions o = small_options();
    o.stage = stage;
    const Delivered d = drain(dataset, o);
    EXPECT_EQ(d.samples.size(), 5u);
    EXPECT_TRUE(d.data.empty());
    EXPECT_GT(d.bytes_read, 5u * 300);
  }
}

// A folder of good files and every kind of bad one; grayscale, CMYK and progressive JPEGs are
// good.
Dataset make_mixed_folder(const testing::TempFolder& dir) {
  for (const auto& bad : testing::bad_files())
    write_bytes(dir / ("bad_" + bad.name + ".jpg"), bad.bytes);
  const auto rgb = testing::smooth_rgb(48, 40);
  write_bytes(dir / "good_rgb.jpg", encode(rgb, 48, 40));
  write_bytes(dir / "good_progressive.jpg",
              encode(rgb, 48, 40, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE));
  write_bytes(dir / "good_gray.jpg",
              encode(std::vector<std::uint8_t>(48 * 40, 99), 48, 40, TJPF_GRAY, TJSAMP_GRAY));
  write_bytes(dir / "good_cmyk.jpg",
              encode(std::vector<std::uint8_t>(48 * 40 * 4, 120), 48, 40, TJPF_CMYK, TJSAMP_444));
  return *list_dataset(dir.path());
}

TEST(Loader, BadFilesAreCountedAndSkippedWithTheirPaths) {
  testing::TempFolder dir;
  const Dataset dataset = make_mixed_folder(dir);
  ASSERT_EQ(dataset.samples.size(), 9u);
  for (Stage stage : {Stage::decode, Stage::augment}) {
    LoaderOptions o = small_options();
    o.stage = stage;
    o.epochs = 2;
    o.threads = 2;
    auto loader = Loader::start(dataset, o);
    ASSERT_TRUE(loader);
    int delivered = 0;
    std::set<std::string> good;
    for (;;) {
      auto batch = (*loader)->next();
      ASSERT_TRUE(batch) << batch.status().message();
      if (!*batch) break;
      delivered += (*batch)->count;
      for (std::size_t s : (*batch)->samples) good.insert(dataset.samples[s].path.filename());
    }
    EXPECT_EQ(delivered, 8);
    EXPECT_EQ(good, (std::set<std::string>{"good_cmyk.jpg", "good_gray.jpg", "good_progressive.jpg",
                                           "good_rgb.jpg"}));
    std::map<std::string, DecodeFailure> skipped;
    const auto list = (*loader)->skipped();
    EXPECT_EQ(list.size(), 10u);
    for (const SkippedFile& f : list) {
      skipped[f.path.filename()] = f.failure;
      EXPECT_FALSE(f.message.empty());
    }
    EXPECT_EQ(skipped, (std::map<std::string, DecodeFailure>{
                           {"bad_corrupt.jpg", DecodeFailure::corrupt},
                           {"bad_empty.jpg", DecodeFailure::empty},
                           {"bad_huge.jpg", DecodeFailure::too_large},
                           {"bad_png.jpg", DecodeFailure::not_jpeg},
                           {"bad_truncated.jpg", DecodeFailure::corrupt}}));
  }
}

TEST(Loader, KeptFilesAreTheFilesBytesWithTheirHeadersAndBadHeadersAreSkipped) {
  testing::TempFolder dir;
  const Dataset dataset = make_mixed_folder(dir);
  LoaderOptions o = small_options();
  o.stage = Stage::read;
  o.keep_files = true;
  o.threads = 2;
  auto loader = Loader::start(dataset, o);
  ASSERT_TRUE(loader) << loader.status().message();
  std::set<std::string> kept;
  for (;;) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch) << batch.status().message();
    if (!*batch) break;
    ASSERT_EQ((*batch)->files.size(), static_cast<std::size_t>((*batch)->count));
    for (int i = 0; i < (*batch)->count; ++i) {
      const auto& path = dataset.samples[(*batch)->samples[static_cast<std::size_t>(i)]].path;
      const EncodedFile& f = (*batch)->files[static_cast<std::size_t>(i)];
      auto bytes = read_whole_file(path);
      ASSERT_TRUE(bytes);
      EXPECT_EQ(std::string(f.bytes.begin(), f.bytes.end()), *bytes) << path;
      const bool good = path.filename().string().starts_with("good_");
      EXPECT_EQ(f.info.width, good ? 48 : 96) << path;
      EXPECT_EQ(f.info.height, good ? 40 : 64) << path;
      kept.insert(path.filename());
    }
  }
  std::set<std::string> skipped;
  for (const SkippedFile& f : (*loader)->skipped()) skipped.insert(f.path.filename());
  EXPECT_EQ(kept.size() + skipped.size(), 9u);
  // Only the header is read: a truncated file passes here and its decoder finds it out.
  for (const char* name : {"good_cmyk.jpg", "good_gray.jpg", "good_progressive.jpg", "good_rgb.jpg",
                           "bad_truncated.jpg"}) {
    EXPECT_TRUE(kept.contains(name)) << name;
  }
  for (const char* name : {"bad_empty.jpg", "bad_huge.jpg", "bad_png.jpg"}) {
    EXPECT_TRUE(skipped.contains(name)) << name;
  }
  o.stage = Stage::decode;
  EXPECT_FALSE(Loader::start(dataset, o));
}

TEST(Loader, StrictStopsAtTheFirstBadFileNamingIt) {
  testing::TempFolder dir;
  const Dataset dataset = make_mixed_folder(dir);
  LoaderOptions o = small_options();
  o.strict = true;
  o.shuffle = false;
  auto loader = Loader::start(dataset, o);
  ASSERT_TRUE(loader);
  auto batch = (*loader)->next();
  ASSERT_FALSE(batch);
  // The listing's first file is bad_corrupt.jpg.
  EXPECT_NE(batch.status().message().find((dir / "bad_corrupt.jpg").string()), std::string::npos)
      << batch.status().message();
  EXPECT_EQ(batch.status().message().find('\n'), std::string::npos);
}

TEST(Loader, OptionsLimitsRefuseImagesOverThem) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 1, 2);  // 40x36 and 53x47 pixels
  LoaderOptions o = small_options();
  o.limits.max_pixels = 40 * 36;
  auto loader = Loader::start(dataset, o);
  ASSERT_TRUE(loader);
  std::size_t delivered = 0;
  for (auto batch = (*loader)->next(); batch && *batch; batch = (*loader)->next()) {
    delivered += (*batch)->labels.size();
  }
  EXPECT_EQ(delivered, 1u);
  ASSERT_EQ((*loader)->skipped().size(), 1u);
  EXPECT_EQ((*loader)->skipped()[0].failure, DecodeFailure::too_large);
}

TEST(Loader, UnreadableFileIsSkipped) {
  testing::TempFolder dir;
  Dataset dataset = make_folder(dir, 1, 2);
  dataset.samples.push_back({dir / "vanished.jpg", 0});
  LoaderOptions o = small_options();
  const Delivered d = drain(dataset, o);
  EXPECT_EQ(d.samples.size(), 2u);
  auto loader = Loader::start(dataset, o);
  ASSERT_TRUE(loader);
  for (auto batch = (*loader)->next(); batch && *batch; batch = (*loader)->next()) {
  }
  ASSERT_EQ((*loader)->skipped().size(), 1u);
  EXPECT_EQ((*loader)->skipped()[0].failure, DecodeFailure::unreadable);
}

TEST(Loader, EndlessRunStopsWhenDestroyed) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 1, 3);
  LoaderOptions o = small_options();
  o.epochs = 0;
  o.threads = 3;
  auto loader = Loader::start(dataset, o);
  ASSERT_TRUE(loader);
  for (int i = 0; i < 20; ++i) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch && *batch);
    EXPECT_EQ((*batch)->index, static_cast<std::uint64_t>(i));
    EXPECT_EQ((*batch)->epoch, static_cast<std::uint64_t>(i));  // one batch of 3 per epoch
  }
  const auto start = std::chrono::steady_clock::now();
  loader->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// The host decoder, counting the decodes of every instance made by one factory.
class CountingDecoder final : public Decoder {
 public:
  CountingDecoder(std::unique_ptr<Decoder> inner, std::atomic<int>& count)
      : inner_(std::move(inner)), count_(count) {}
  std::string_view name() const override { return inner_->name(); }
  std::variant<JpegInfo, DecodeError> inspect(std::span<const std::uint8_t> file) override {
    return inner_->inspect(file);
  }
  std::span<const ScaleFactor> scales() const override { return inner_->scales(); }
  std::optional<DecodeError> decode(std::span<const std::uint8_t> file, ScaleFactor scale,
                                    Image& out) override {
    ++count_;
    return inner_->decode(file, scale, out);
  }

 private:
  std::unique_ptr<Decoder> inner_;
  std::atomic<int>& count_;
};

TEST(Loader, WorkersRunAheadOnlyAsFarAsThePrefetch) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 3, 5);
  std::atomic<int> decodes{0};
  LoaderOptions o = small_options();
  o.stage = Stage::decode;
  o.epochs = 0;
  o.threads = 2;
  o.prefetch = 1;
  o.batch_size = 2;
  auto loader = Loader::start(dataset, o, [&]() -> Result<std::unique_ptr<Decoder>> {
    DLPROBE_ASSIGN_OR_RETURN(auto inner, make_host_decoder());
    return std::unique_ptr<Decoder>(std::make_unique<CountingDecoder>(std::move(inner), decodes));
  });
  ASSERT_TRUE(loader);
  for (int held = 1; held <= 3; ++held) {
    ASSERT_TRUE((*loader)->next());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // The batch held and the two slots (threads x prefetch) behind it, the held one among them:
    // batches up to held + 1, of 2 images each.
    EXPECT_EQ(decodes.load(), 2 * (held + 1)) << "holding batch " << held - 1;
  }
}

TEST(Loader, DecoderThatCannotStartIsTheError) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 1, 2);
  auto loader = Loader::start(dataset, small_options(), [] {
    return Result<std::unique_ptr<Decoder>>(error(Errc::unavailable, "no decoder here"));
  });
  ASSERT_TRUE(loader);
  auto batch = (*loader)->next();
  ASSERT_FALSE(batch);
  EXPECT_NE(batch.status().message().find("no decoder here"), std::string::npos);
}

TEST(Loader, OptionsOutOfRangeAreRefused) {
  testing::TempFolder dir;
  const Dataset dataset = make_folder(dir, 1, 1);
  LoaderOptions o = small_options();
  o.threads = 0;
  auto loader = Loader::start(dataset, o);
  ASSERT_FALSE(loader);
  EXPECT_NE(loader.status().message().find("threads"), std::string::npos);
  o = small_options();
  o.augment.scale_min = 0;
  EXPECT_FALSE(Loader::start(dataset, o));
}

}  // namespace
}  // namespace dlprobe::data
