// Real input for `dlprobe bench --data DIR`: batches of JPEGs through the data module's pipeline
// into the training step, instead of the synthetic batch that sits on the device. On a CUDA device
// the files are read and their headers checked on worker threads and decoded and augmented on the
// GPU (nvJPEG and a kernel), and the batch copied into the step on the device; on the CPU, or with
// GPU decode off, the worker threads decode and augment (libjpeg-turbo), and on a CUDA device the
// batch goes up from page-locked memory on a stream of its own. Each batch is made (and sent up)
// while the step before runs, as a framework's prefetching, memory-pinning loader does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/data/dataset.h"
#include "dlprobe/data/gpu_decoder.h"
#include "dlprobe/data/loader.h"
#include "dlprobe/device/device.h"
#include "dlprobe/step/training_step.h"

namespace dlprobe::bench {

struct JpegInput {
  data::Dataset dataset;
  int threads = 0;         // loader worker threads; 0: every CPU this process may use
  bool gpu_decode = true;  // on a CUDA device: decode and augment there
  bool hardware = true;    // nvJPEG's hardware engine where the GPU has one
  data::GpuPixels gpu_pixels = data::GpuPixels::rgb;
  std::uint64_t seed = 0;  // of the shuffles, crops and flips
};

struct FeedTimes {
  // Seconds spent getting the batch ready (waiting for the loader's workers, decoding on the
  // GPU, or on a CUDA device sending the host's batch up on its own stream while the step before
  // runs): the time a step waits for input when the step before it has already finished.
  double ready = 0;
  // Seconds spent handing it to the step after the steps queued before had ended (their wait is
  // not counted): the copy into the step's input, through which the device is idle.
  double upload = 0;
};

class InputFeed {
 public:
  virtual ~InputFeed() = default;
  // The next batch into `step`, and what it cost.
  virtual Result<FeedTimes> feed(engine::TrainingStep& step) = 0;
  // "jpeg-gpu" or "jpeg-cpu": the configuration's input setting.
  virtual const std::string& input() const = 0;
  // "nvJPEG 13.0.1 hardware engine, NVIDIA H200" or "libjpeg-turbo".
  virtual const std::string& decoder() const = 0;
  virtual int threads() const = 0;
  // Files that gave no image so far (their batches were filled with the others).
  virtual std::vector<data::SkippedFile> skipped() const = 0;
};

// Where `input` decodes on `device`, as the configuration's input setting: "jpeg-gpu" on a CUDA
// device with GPU decode, else "jpeg-cpu".
std::string input_setting(const JpegInput& input, const device::Device& device);

// A feed for `step` (its batch, image size, classes, and the element type and layout of its
// input) on `device`. A dataset with more classes than the model's is an error; so is one that
// gives no image at all.
Result<std::unique_ptr<InputFeed>> open_jpeg_feed(const JpegInput& input,
                                                  const engine::TrainingStep& step,
                                                  const device::Device& device);

// How a GPU-decode feed makes its decoders: data::GpuDecoder::open, or a fake where no GPU is.
using GpuDecoderMaker =
    std::function<Result<std::unique_ptr<data::GpuDecoder>>(const data::GpuDecoderOptions&)>;

// open_jpeg_feed's GPU-decode feed on CUDA device `device`, its decoders made by `make`: several
// decoders, each on a thread of its own, make batches at once, delivered in the loader's order.
Result<std::unique_ptr<InputFeed>> open_gpu_feed(const JpegInput& input,
                                                 const engine::TrainingStep& step, int device,
                                                 const GpuDecoderMaker& make);

}  // namespace dlprobe::bench
