// The GPU-decode feed's scheduling (several decoder threads, tickets in the loader's order, device
// buffers released only after the next batch was set, errors) with fake decoders over host
// memory: a step on the reference backend takes a "device" batch from host memory as it is.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <vector>

#include "common/temp_folder.h"
#include "dlprobe/bench/input_feed.h"
#include "dlprobe/data/augment.h"
#include "dlprobe/data/make_dataset.h"
#include "step/step_test_util.h"

namespace dlprobe::bench {
namespace {

// What the fake decoders saw, across their threads.
struct Seen {
  std::mutex mu;
  std::vector<std::vector<std::uint64_t>> batches;  // per decoder, the batch indices in turn
};

// Decodes nothing: fills its buffer of the turn with the batch's index and delivers every file,
// filled up to `fill_to`; fails at batch `fail_at`.
class FakeDecoder final : public data::GpuDecoder {
 public:
  FakeDecoder(Seen& seen, std::size_t id, std::uint64_t fail_at, std::size_t sample_bytes,
              int max_batch)
      : seen_(seen), id_(id), fail_at_(fail_at) {
    for (auto& b : buffers_) b.resize(sample_bytes * static_cast<std::size_t>(max_batch) / 4);
  }
  const std::string& name() const override { return name_; }
  Result<data::GpuBatchResult> process(const data::BatchView& batch,
                                       const std::vector<data::Sample>& /*samples*/,
                                       const data::LoaderOptions& /*options*/,
                                       data::Stage /*stage*/, int fill_to) override {
    {
      std::lock_guard lock(seen_.mu);
      seen_.batches[id_].push_back(batch.index);
    }
    if (batch.index == fail_at_) return invalid_argument("fake failure");
    if (batch.files.size() != static_cast<std::size_t>(batch.count)) {
      return invalid_argument("the batch holds no files");
    }
    data::GpuBatchResult r;
    for (int i = 0; i < std::max(batch.count, fill_to); ++i) r.positions.push_back(i % batch.count);
    r.delivered = static_cast<int>(r.positions.size());
    turn_ = 1 - turn_;
    std::fill(buffers_[turn_].begin(), buffers_[turn_].end(), static_cast<float>(batch.index));
    return r;
  }
  const void* device_batch() const override { return buffers_[turn_].data(); }

 private:
  Seen& seen_;
  std::size_t id_;
  std::uint64_t fail_at_;
  std::string name_ = "fake";
  std::vector<float> buffers_[2];
  int turn_ = 0;
};

struct Fixture {
  testing::TempFolder dir;
  engine::testing::Rig rig;
  JpegInput input;
  Seen seen;

  Fixture() : rig(engine::testing::make_rig(engine::testing::tiny_config(32, 4, 10))) {
    data::MakeDatasetOptions m;
    m.images = 24;
    m.classes = 3;
    EXPECT_TRUE(data::make_dataset(dir / "set", m));
    input.dataset = data::list_dataset(dir / "set").value();
    input.threads = 2;
    seen.batches.resize(8);
  }

  Result<std::unique_ptr<InputFeed>> open(std::uint64_t fail_at) {
    data::AugmentOptions a;
    a.size = 32;
    const std::size_t sample = data::sample_bytes(a);
    std::size_t made = 0;
    return open_gpu_feed(
        input, *rig.step, 0, [&, fail_at, sample](const data::GpuDecoderOptions& o) {
          return Result<std::unique_ptr<data::GpuDecoder>>(
              std::make_unique<FakeDecoder>(seen, made++, fail_at, sample, o.max_batch));
        });
  }
};

TEST(GpuFeed, DeliversEveryBatchOnceInTheLoadersOrder) {
  Fixture f;
  ASSERT_TRUE(f.rig.step);
  {
    auto feed = f.open(/*fail_at=*/1'000'000);
    ASSERT_TRUE(feed) << feed.status().message();
    for (int i = 0; i < 20; ++i) {
      auto times = (*feed)->feed(*f.rig.step);
      ASSERT_TRUE(times) << times.status().message();
      ASSERT_TRUE(f.rig.step->run_step());
    }
  }  // the feed stops its threads here, some of them waiting for a free buffer
  std::set<std::uint64_t> all;
  std::size_t count = 0;
  for (const auto& mine : f.seen.batches) {
    // Each decoder took its batches in the loader's order.
    EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    all.insert(mine.begin(), mine.end());
    count += mine.size();
  }
  EXPECT_EQ(all.size(), count) << "a batch went to two decoders";
  // The 20 fed, in order from 0, and at most a few made ahead.
  ASSERT_GE(all.size(), 20u);
  EXPECT_EQ(*all.rbegin() + 1, all.size()) << "a batch of the loader was skipped";
  EXPECT_LE(all.size(), 20u + 4u);
}

TEST(GpuFeed, ADecodersErrorComesAtItsBatchAndStays) {
  Fixture f;
  ASSERT_TRUE(f.rig.step);
  auto feed = f.open(/*fail_at=*/3);
  ASSERT_TRUE(feed) << feed.status().message();
  for (int i = 0; i < 3; ++i) {
    auto times = (*feed)->feed(*f.rig.step);
    ASSERT_TRUE(times) << i << ": " << times.status().message();
  }
  for (int again = 0; again < 2; ++again) {
    auto failed = (*feed)->feed(*f.rig.step);
    ASSERT_FALSE(failed);
    EXPECT_EQ(failed.status().message(), "fake failure");
  }
}

TEST(GpuFeed, ADecoderThatCannotStartIsTheOpensError) {
  Fixture f;
  ASSERT_TRUE(f.rig.step);
  auto feed = open_gpu_feed(f.input, *f.rig.step, 0, [](const data::GpuDecoderOptions&) {
    return Result<std::unique_ptr<data::GpuDecoder>>(error(Errc::unavailable, "no nvJPEG"));
  });
  ASSERT_FALSE(feed);
  EXPECT_EQ(feed.status().message(), "no nvJPEG");
}

}  // namespace
}  // namespace dlprobe::bench
