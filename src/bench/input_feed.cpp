#include "dlprobe/bench/input_feed.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dlprobe/core/clock.h"
#include "dlprobe/core/parallel.h"
#include "dlprobe/data/device_staging.h"
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

// Decode and augment on the worker threads. On a CUDA device the batch goes up through
// page-locked staging on a stream of its own while the step before runs, and into the step with a
// copy on the device; on the CPU, with set_input().
class HostFeed final : public FeedBase {
 public:
  using FeedBase::FeedBase;
  Status open(const JpegInput& in, const engine::TrainingStep& step, int threads,
              const device::Device& device) {
    const engine::StepConfig& c = step.config();
    // The pipeline gives fp32; set_input converts to the step's dtype, set_device_input does not.
    const TensorDesc images = step.input_desc().with_dtype(DType::fp32);
    if (device.kind == DeviceKind::cuda) {
      if (step.input_desc().dtype() != DType::fp32) {
        return invalid_argument(
            fmt::format("the host pipeline gives fp32 input on the device; this step takes {}",
                        dtype_name(step.input_desc().dtype())));
      }
      DLPROBE_ASSIGN_OR_RETURN(staging_, data::DeviceStaging::open(device.index, images.bytes()));
    } else {
      images_ = HostTensor(images);
    }
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

  Result<FeedTimes> feed(engine::TrainingStep& step) override {
    const auto start = Clock::now();
    DLPROBE_ASSIGN_OR_RETURN(data::BatchView batch, next_batch());
    // The loader's buffer holds `count` samples; a batch short of skipped files repeats them.
    const std::size_t sample = batch.data.size() / static_cast<std::size_t>(batch.count);
    std::byte* to = staging_ ? staging_->host().data() : static_cast<std::byte*>(images_.data());
    const std::int64_t n = step.config().batch;
    for (std::int64_t i = 0; i < n; ++i) {
      std::memcpy(to + static_cast<std::size_t>(i) * sample,
                  batch.data.data() + (static_cast<std::size_t>(i) % batch.count) * sample, sample);
    }
    const void* on_device = nullptr;
    if (staging_) {
      DLPROBE_ASSIGN_OR_RETURN(on_device, staging_->upload());
    }
    FeedTimes times{.ready = seconds_since(start)};
    DLPROBE_RETURN_IF_ERROR(step.synchronize());
    const auto upload = Clock::now();
    const HostTensor labels = filled_labels(batch.labels, n);
    DLPROBE_RETURN_IF_ERROR(on_device != nullptr ? step.set_device_input(on_device, labels)
                                                 : step.set_input(images_, labels));
    times.upload = seconds_since(upload);
    return times;
  }

 private:
  std::unique_ptr<data::DeviceStaging> staging_;  // on a CUDA device
  HostTensor images_;                             // on the CPU
};

// Read and check headers on the worker threads; decode and augment on the GPU, kDecoders batches
// at once, each by its own nvJPEG decoder on its own thread and stream.
//
// Why several: with CUDA's default of 8 hardware queues one batch's decode beside a training step
// took 40.7 ms against 9 ms alone (H200, fp16 ResNet-50 bs256, a 35 ms step), and with two at once
// a batch was ready after 27.9 ms of waiting. nvJPEG's work was queued behind the step's
// (data/cuda_queues.h): with the 32 queues bench and evaluate ask for, two decoders keep up with
// the step (98.6 % of the synthetic throughput); whether one would, with 32, is not measured.
class GpuFeed final : public FeedBase {
 public:
  using FeedBase::FeedBase;
  ~GpuFeed() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status open(const JpegInput& in, const engine::TrainingStep& step, int threads, int device,
              const GpuDecoderMaker& make) {
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
    g.pixels = in.gpu_pixels;
    g.max_batch = options_.batch_size;
    device_ = device;
    for (Decoder& each : decoders_) {
      DLPROBE_ASSIGN_OR_RETURN(each.gpu, make(g));
    }
    DLPROBE_ASSIGN_OR_RETURN(loader_, data::Loader::start(in.dataset, read));
    decoder_ = decoders_[0].gpu->name();
    for (std::size_t d = 0; d < kDecoders; ++d) threads_.emplace_back([this, d] { work(d); });
    return Status::ok();
  }

  Result<FeedTimes> feed(engine::TrainingStep& step) override {
    const auto start = Clock::now();
    std::unique_lock lock(mu_);
    if (!error_.is_ok()) return error_;
    cv_.wait(lock, [&] { return done_.contains(next_feed_); });
    Done done = std::move(done_.at(next_feed_));
    done_.erase(next_feed_);
    if (!done.status.is_ok()) {
      // The workers have stopped: every later call gets the same error.
      error_ = done.status;
      return error_;
    }
    lock.unlock();
    decoded_skipped_.insert(decoded_skipped_.end(), done.skipped.begin(), done.skipped.end());
    FeedTimes times{.ready = seconds_since(start)};
    Status set = step.synchronize();
    const auto upload = Clock::now();
    if (set.is_ok()) {
      set = step.set_device_input(done.images, filled_labels(done.labels, step.config().batch));
    }
    times.upload = seconds_since(upload);
    lock.lock();
    // set_device_input waited for every step before it, so the copy from the batch fed before
    // this one has run: that decoder may write its buffer again.
    if (fed_before_) ++decoders_[*fed_before_].released;
    fed_before_ = done.decoder;
    ++next_feed_;
    lock.unlock();
    cv_.notify_all();
    if (!set.is_ok()) return set;
    return times;
  }

 private:
  static constexpr std::size_t kDecoders = 2;
  // A decoder's device batch has two buffers that take turns (GpuDecoder::device_batch).
  static constexpr std::uint64_t kBuffers = 2;

  struct Decoder {
    std::unique_ptr<data::GpuDecoder> gpu;
    std::uint64_t made = 0;      // batches it finished
    std::uint64_t released = 0;  // of those, the ones whose device buffer is free again
  };
  // A batch on the device, or why there is none.
  struct Done {
    Status status;
    std::size_t decoder = 0;
    const void* images = nullptr;
    std::vector<int> labels;
    std::vector<data::SkippedFile> skipped;
  };
  // A loader batch's files and labels, copied: the loader reuses its memory at its next batch.
  struct Taken {
    std::vector<data::EncodedFile> files;
    std::vector<int> labels;
    std::vector<std::size_t> samples;
    data::BatchView view;
  };

  void work(std::size_t d) {
    Decoder& me = decoders_[d];
    Taken taken;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || me.made - me.released < kBuffers; });
        if (stop_ || failed_) return;
      }
      std::uint64_t ticket = 0;
      Status took;
      {
        // A ticket and its batch under one lock, so that batches go to tickets in the loader's
        // order; not under mu_, so that feed() takes a finished batch while this copies one.
        std::lock_guard lock(loader_mu_);
        ticket = next_ticket_++;
        took = take(taken);
      }
      if (!took.is_ok()) {
        Done failed;
        failed.status = std::move(took);
        std::lock_guard lock(mu_);
        finish(ticket, std::move(failed));
        return;
      }
      Done done = make(d, taken);
      std::lock_guard lock(mu_);
      const bool ok = done.status.is_ok();
      if (ok) ++me.made;
      finish(ticket, std::move(done));
      if (!ok) return;
    }
  }

  // Batch `taken` on decoder d's device buffer. A batch none of whose files gave an image on the
  // GPU (its headers were fine) is skipped for the next, as many times as the dataset has samples.
  Done make(std::size_t d, Taken& taken) {
    Decoder& me = decoders_[d];
    Done done;
    done.decoder = d;
    for (std::size_t tries = 0;; ++tries) {
      auto result = me.gpu->process(taken.view, loader_->dataset().samples, options_,
                                    data::Stage::augment, options_.batch_size);
      if (!result) {
        done.status = result.status();
        return done;
      }
      done.skipped.insert(done.skipped.end(), result->skipped.begin(), result->skipped.end());
      if (result->delivered > 0) {
        done.images = me.gpu->device_batch();
        for (int p : result->positions) {
          done.labels.push_back(taken.labels[static_cast<std::size_t>(p)]);
        }
        return done;
      }
      if (tries > loader_->dataset().samples.size()) {
        done.status = invalid_argument(fmt::format(
            "{0}: no file gives an image on the GPU (see which and why with `dlprobe pipeline "
            "{0} --device cuda:{1}`, or decode on the host with --data-decode cpu)",
            loader_->dataset().root.string(), device_));
        return done;
      }
      std::lock_guard lock(loader_mu_);
      if (Status s = take(taken); !s.is_ok()) {
        done.status = std::move(s);
        return done;
      }
    }
  }

  // The next loader batch into `t`; under loader_mu_.
  Status take(Taken& t) {
    DLPROBE_ASSIGN_OR_RETURN(data::BatchView batch, next_batch());
    t.files.assign(batch.files.begin(), batch.files.end());
    t.labels.assign(batch.labels.begin(), batch.labels.end());
    t.samples.assign(batch.samples.begin(), batch.samples.end());
    t.view = batch;
    t.view.files = t.files;
    t.view.labels = t.labels;
    t.view.samples = t.samples;
    return Status::ok();
  }

  // Under mu_.
  void finish(std::uint64_t ticket, Done done) {
    if (!done.status.is_ok()) failed_ = true;
    done_.emplace(ticket, std::move(done));
    cv_.notify_all();
  }

  data::LoaderOptions options_;
  int device_ = 0;
  std::array<Decoder, kDecoders> decoders_;
  std::mutex loader_mu_;  // the loader (one consumer) and next_ticket_
  std::mutex mu_;         // the rest below
  std::condition_variable cv_;
  std::map<std::uint64_t, Done> done_;  // finished batches by ticket, until fed
  std::uint64_t next_ticket_ = 0;
  std::uint64_t next_feed_ = 0;
  std::optional<std::size_t> fed_before_;
  bool stop_ = false;
  bool failed_ = false;
  Status error_;  // the first error feed() returned
  std::vector<std::thread> threads_;
};

}  // namespace

std::string input_setting(const JpegInput& input, const device::Device& device) {
  return device.kind == DeviceKind::cuda && input.gpu_decode ? "jpeg-gpu" : "jpeg-cpu";
}

namespace {

// The loader threads `in` asks for, once its dataset fits the step's model.
Result<int> feed_threads(const JpegInput& in, const engine::TrainingStep& step) {
  const engine::StepConfig& c = step.config();
  const auto classes = static_cast<std::int64_t>(in.dataset.classes.size());
  if (classes > c.model.classes) {
    return invalid_argument(fmt::format("{}: {} classes, more than the model's {} (--classes)",
                                        in.dataset.root.string(), classes, c.model.classes));
  }
  if (in.threads < 0 || in.threads > 1024) {
    return invalid_argument(fmt::format("data threads: {} (1 to 1024)", in.threads));
  }
  return in.threads > 0 ? in.threads : usable_cores();
}

}  // namespace

Result<std::unique_ptr<InputFeed>> open_gpu_feed(const JpegInput& in,
                                                 const engine::TrainingStep& step, int device,
                                                 const GpuDecoderMaker& make) {
  DLPROBE_ASSIGN_OR_RETURN(const int threads, feed_threads(in, step));
  auto feed = std::make_unique<GpuFeed>("jpeg-gpu");
  DLPROBE_RETURN_IF_ERROR(feed->open(in, step, threads, device, make));
  return std::unique_ptr<InputFeed>(std::move(feed));
}

Result<std::unique_ptr<InputFeed>> open_jpeg_feed(const JpegInput& in,
                                                  const engine::TrainingStep& step,
                                                  const device::Device& device) {
  const std::string setting = input_setting(in, device);
  if (setting == "jpeg-gpu") return open_gpu_feed(in, step, device.index, data::GpuDecoder::open);
  DLPROBE_ASSIGN_OR_RETURN(const int threads, feed_threads(in, step));
  auto feed = std::make_unique<HostFeed>(setting);
  DLPROBE_RETURN_IF_ERROR(feed->open(in, step, threads, device));
  return std::unique_ptr<InputFeed>(std::move(feed));
}

}  // namespace dlprobe::bench
