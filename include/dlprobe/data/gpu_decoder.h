// JPEG decoding and augmentation on the GPU: a batch of files as the loader read them (bytes and
// header facts) decoded by nvJPEG (its hardware engine where the GPU has one, else its CUDA
// decoder), each sample's random crop resized, flipped and normalised by a kernel into a batch on
// the device, in the training step's element type and layout. nvJPEG is loaded at run time; a
// build without CUDA, or a machine without nvJPEG or a GPU, gets a one-line error from open().
//
// A file nvJPEG's batched decoder does not take (progressive, CMYK, 4:1:0 on the hardware engine),
// or that does not end with JPEG's end-of-image marker (a truncated file, which the hardware
// engine would decode without an error), is decoded on the host by libjpeg-turbo and copied up; a
// batch nvJPEG fails on is decoded file by file on the host, so that a corrupt or truncated file is
// skipped with its reason, as the host pipeline skips it, and the rest of its batch still
// delivered.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/data/loader.h"

namespace dlprobe::data {

// What nvJPEG hands the augmentation: interleaved RGB, which nvJPEG converts each image to with a
// kernel launch of its own (256 a batch of 256); or the file's own Y, Cb and Cr planes, which the
// augmentation converts at the pixels it samples, libjpeg-turbo's arithmetic exactly, in its one
// launch a batch. Baseline files in 4:4:4, 4:2:2, 4:2:0 or 4:4:0 take the planes; others RGB.
// On an H200 RGB was the faster (decode and augment alone: 32,458 img/s against 25,737), and the
// planes gave samples identical to the host pipeline's, where RGB's differ by up to 0.94
// normalised units.
enum class GpuPixels { rgb, ycbcr };

struct GpuDecoderOptions {
  int device = 0;
  // Prefer nvJPEG's hardware JPEG engine (A100, H100 and later) to its CUDA decoder.
  bool hardware = true;
  GpuPixels pixels = GpuPixels::rgb;
  int max_batch = 256;
  // libnvjpeg to load (empty: the usual names; a test names one that is not there).
  std::string library;
};

// What one batch went through.
struct GpuBatchResult {
  int delivered = 0;           // samples in the device batch, in the loader's order
  int host_decoded = 0;        // files nvJPEG's batched decoder did not take
  std::vector<int> positions;  // delivered[i] came from position positions[i] of the batch
  std::vector<SkippedFile> skipped;
};

class GpuDecoder {
 public:
  static Result<std::unique_ptr<GpuDecoder>> open(const GpuDecoderOptions& options);
  virtual ~GpuDecoder() = default;

  // "nvJPEG 13.0.1 hardware engine, NVIDIA H200" and the like.
  virtual const std::string& name() const = 0;

  // The batch (from a Loader with keep_files) decoded on the GPU; with Stage::augment also
  // augmented into the device batch (options as the loader's, its draw per (seed, epoch, sample)
  // as the host pipeline's). Returns when the batch is on the device.
  // `fill_to`: a batch short of files that gave no image is filled up to this many samples by
  // augmenting its delivered samples again, in turn (their positions repeat in `positions`).
  virtual Result<GpuBatchResult> process(const BatchView& batch, const std::vector<Sample>& samples,
                                         const LoaderOptions& options, Stage stage,
                                         int fill_to = 0) = 0;

  // The device batch process() last wrote: delivered samples of sample_bytes(options.augment).
  // Two buffers take turns (a process() that delivers nothing takes none), so that it stays as it
  // is through the next process() (a training step may still copy from it while the next batch is
  // decoded).
  virtual const void* device_batch() const = 0;
};

}  // namespace dlprobe::data
