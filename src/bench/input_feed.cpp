#include "dlprobe/bench/input_feed.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "dlprobe/core/clock.h"
#include "dlprobe/data/gpu_decoder.h"
#include "dlprobe/data/throughput.h"

namespace dlprobe::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The labels of `count` delivered samples, repeated in turn to fill `batch`.
HostTensor filled_labels(std::span<const int> labels, std::int64_t batch) {
  HostTensor out(*TensorDesc::make(Shape{batch}, DType::int64));
  auto* at = static_cast<std::int64_t*>(out.data());
  for (std::int64_t i = 0; i < batch; ++i) {
    at[i] = labels[static_cast<std::size_t>(i) % labels.size()];
  }
  return out;
}

class FeedBase : public InputFeed {
 public:
  explicit FeedBase(std::string input) : input_(std::move(input)) {}
  const std::string& input() const override { return input_; }
  const std::string& decoder() const override { return decoder_; }
  int threads() const override { return loader_->options().threads; }
  std::vector<data::SkippedFile> skipped() const override {
    std::vector<data::SkippedFile> all = loader_->skipped();
    all.insert(all.end(), decoded_skipped_.begin(), decoded_skipped_.end());
    return all;
  }

 protected:
  // The next batch with at least one image; the loader is endless, so nullopt never comes.
  Result<data::BatchView> next_batch() {
    for (std::size_t tries = 0;; ++tries) {
      DLPROBE_ASSIGN_OR_RETURN(auto batch, loader_->next());
      if (!batch) return error(Errc::internal, "an endless loader ended");
      if (batch->count > 0) return *batch;
      // Every file of a whole epoch's worth of batches gave no image: nothing to train on.
      if (tries > 2 * loader_->dataset().samples.size()) {
        return invalid_argument(
            fmt::format("{}: no file gives an image", loader_->dataset().root.string()));
      }
    }
  }

  std::unique_ptr<data::Loader> loader_;
  std::string input_;
  std::string decoder_;
  std::vector<data::SkippedFile> decoded_skipped_;
};

// Decode and augment on the worker threads; the batch goes up with set_input().
class HostFeed final : public FeedBase {
 public:
  using FeedBase::FeedBase;
  Status open(const JpegInput& in, const engine::TrainingStep& step, int threads) {
    const engine::StepConfig& c = step.config();
    images_ = HostTensor(step.input_desc().with_dtype(DType::fp32));
    data::LoaderOptions o;
    o.threads = threads;
    o.batch_size = static_cast<int>(c.batch);
    o.seed = in.seed;
    o.epochs = 0;
    o.stage = data::Stage::augment;
    o.augment.size = static_cast<int>(c.model.image_size);
    o.augment.layout = step.input_desc().layout() == Layout::nhwc ? data::SampleLayout::nhwc
                                                                  : data::SampleLayout::nchw;
    DLPROBE_ASSIGN_OR_RETURN(loader_, data::Loader::start(in.dataset, o));
    decoder_ = "libjpeg-turbo";
    return Status::ok();
  }

  Result<double> feed(engine::TrainingStep& step) override {
    const auto start = Clock::now();
    DLPROBE_ASSIGN_OR_RETURN(data::BatchView batch, next_batch());
    // The loader's buffer holds `count` samples; a batch short of skipped files repeats them.
    const std::size_t sample = batch.data.size() / static_cast<std::size_t>(batch.count);
    auto* to = static_cast<std::byte*>(images_.data());
    const std::int64_t n = step.config().batch;
    for (std::int64_t i = 0; i < n; ++i) {
      std::memcpy(to + static_cast<std::size_t>(i) * sample,
                  batch.data.data() + (static_cast<std::size_t>(i) % batch.count) * sample, sample);
    }
    const double waited = seconds_since(start);
    DLPROBE_RETURN_IF_ERROR(step.set_input(images_, filled_labels(batch.labels, n)));
    return waited;
  }

 private:
  HostTensor images_;
};

// Read and check headers on the worker threads; decode and augment on the GPU.
class GpuFeed final : public FeedBase {
 public:
  using FeedBase::FeedBase;
  Status open(const JpegInput& in, const engine::TrainingStep& step, int threads, int device) {
    const engine::StepConfig& c = step.config();
    const TensorDesc desc = step.input_desc();
    if (desc.dtype() != DType::fp32) {
      return invalid_argument(
          fmt::format("GPU decode gives fp32 input; this step takes {}", dtype_name(desc.dtype())));
    }
    options_.threads = threads;
    options_.batch_size = static_cast<int>(c.batch);
    options_.seed = in.seed;
    options_.epochs = 0;
    options_.dct_scaling = false;
    options_.augment.size = static_cast<int>(c.model.image_size);
    options_.augment.layout =
        desc.layout() == Layout::nhwc ? data::SampleLayout::nhwc : data::SampleLayout::nchw;
    data::LoaderOptions read = options_;
    read.stage = data::Stage::read;
    read.keep_files = true;
    data::GpuDecoderOptions g;
    g.device = device;
    g.hardware = in.hardware;
    g.max_batch = options_.batch_size;
    DLPROBE_ASSIGN_OR_RETURN(gpu_, data::GpuDecoder::open(g));
    DLPROBE_ASSIGN_OR_RETURN(loader_, data::Loader::start(in.dataset, read));
    decoder_ = gpu_->name();
    return Status::ok();
  }

  Result<double> feed(engine::TrainingStep& step) override {
    const auto start = Clock::now();
    const auto n = static_cast<int>(step.config().batch);
    for (;;) {
      DLPROBE_ASSIGN_OR_RETURN(data::BatchView batch, next_batch());
      DLPROBE_ASSIGN_OR_RETURN(
          data::GpuBatchResult done,
          gpu_->process(batch, loader_->dataset().samples, options_, data::Stage::augment, n));
      decoded_skipped_.insert(decoded_skipped_.end(), done.skipped.begin(), done.skipped.end());
      if (done.delivered == 0) continue;
      labels_.clear();
      for (int p : done.positions) labels_.push_back(batch.labels[static_cast<std::size_t>(p)]);
      const double waited = seconds_since(start);
      DLPROBE_RETURN_IF_ERROR(
          step.set_device_input(gpu_->device_batch(), filled_labels(labels_, n)));
      return waited;
    }
  }

 private:
  data::LoaderOptions options_;
  std::unique_ptr<data::GpuDecoder> gpu_;
  std::vector<int> labels_;
};

}  // namespace

std::string input_setting(const JpegInput& input, const device::Device& device) {
  return device.kind == DeviceKind::cuda && input.gpu_decode ? "jpeg-gpu" : "jpeg-cpu";
}

Result<std::unique_ptr<InputFeed>> open_jpeg_feed(const JpegInput& in,
                                                  const engine::TrainingStep& step,
                                                  const device::Device& device) {
  const engine::StepConfig& c = step.config();
  const auto classes = static_cast<std::int64_t>(in.dataset.classes.size());
  if (classes > c.model.classes) {
    return invalid_argument(fmt::format("{}: {} classes, more than the model's {} (--classes)",
                                        in.dataset.root.string(), classes, c.model.classes));
  }
  if (in.threads < 0 || in.threads > 1024) {
    return invalid_argument(fmt::format("data threads: {} (1 to 1024)", in.threads));
  }
  const int threads = in.threads > 0 ? in.threads : data::usable_cores();
  const std::string setting = input_setting(in, device);
  if (setting == "jpeg-gpu") {
    auto feed = std::make_unique<GpuFeed>(setting);
    DLPROBE_RETURN_IF_ERROR(feed->open(in, step, threads, device.index));
    return std::unique_ptr<InputFeed>(std::move(feed));
  }
  auto feed = std::make_unique<HostFeed>(setting);
  DLPROBE_RETURN_IF_ERROR(feed->open(in, step, threads));
  return std::unique_ptr<InputFeed>(std::move(feed));
}

}  // namespace dlprobe::bench
