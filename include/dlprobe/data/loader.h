// The host input pipeline: N worker threads read, decode and augment the samples of a Dataset into
// batches, delivered in order through a bounded queue (prefetch), the same bytes for the same seed
// whatever the thread count. Files that give no image are counted and skipped with their path (or,
// when strict, stop the run with a one-line error).
//
// The seam for the device path: a batch's memory comes from a BatchAllocator (host memory by
// default; pinned memory for a copy to the GPU by DMA), and each worker decodes through a Decoder
// made by a DecoderFactory (libjpeg-turbo on the host by default).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/data/augment.h"
#include "dlprobe/data/dataset.h"
#include "dlprobe/data/decoder.h"

namespace dlprobe::data {

// How far each sample goes: the file read alone, read and decoded at full size, or the whole host
// pipeline (read, decode at the DCT scale the crop needs, crop, flip, resize, normalise).
enum class Stage { read, decode, augment };
std::string_view stage_name(Stage stage);
// "read", "decode", "augment" (the whole host pipeline).
Result<Stage> parse_stage(std::string_view name);

// Memory for one batch of `bytes`, released when the last shared_ptr goes.
using BatchAllocator = std::function<Result<std::shared_ptr<std::byte>>(std::size_t bytes)>;
// Ordinary host memory, 64-byte aligned.
BatchAllocator host_batch_allocator();

struct LoaderOptions {
  int threads = 1;
  int batch_size = 64;
  int prefetch = 2;  // batches in flight per worker, as DataLoader's prefetch_factor
  std::uint64_t seed = 0;
  bool shuffle = true;       // each epoch's order a permutation drawn from (seed, epoch)
  std::uint64_t epochs = 1;  // 0: endless, until the Loader is destroyed
  Stage stage = Stage::augment;
  // Decode at the smallest DCT scale (1/8 .. 1) at which the crop still covers the output size.
  bool dct_scaling = true;
  // Keep decoded full-size images in memory up to this many bytes (0: no cache). With the cache,
  // images are decoded at full size: the next epoch's crop may need every pixel.
  std::uint64_t cache_bytes = 0;
  bool strict = false;  // the first file that gives no image ends the run with its error
  // With Stage::read: keep each file's bytes and its header's facts in the batch (files()), for a
  // decoder downstream (the GPU's); a file whose header is refused is skipped as any other.
  bool keep_files = false;
  std::uint64_t max_file_bytes = 256ull << 20;
  DecodeLimits limits;
  AugmentOptions augment;
};
// Errc::invalid_argument naming the option that is out of range.
Status validate(const LoaderOptions& options);

// A file as read, with its header's facts, for a decoder after the loader.
struct EncodedFile {
  std::vector<std::uint8_t> bytes;
  JpegInfo info;
};

struct SkippedFile {
  std::filesystem::path path;
  DecodeFailure failure = DecodeFailure::corrupt;
  std::string message;
};

// A delivered batch, valid until the next call to Loader::next().
struct BatchView {
  std::uint64_t index = 0;  // in delivery order, from 0, across epochs
  std::uint64_t epoch = 0;
  int count = 0;                         // samples in it: the batch size less files skipped
  std::span<const int> labels;           // count labels
  std::span<const std::size_t> samples;  // count indices into Dataset::samples
  // count samples of sample_bytes() each (Stage::augment only; empty otherwise).
  std::span<const std::byte> data;
  std::uint64_t bytes_read = 0;  // file bytes read for it (0 for samples from the cache)
  // count files (LoaderOptions::keep_files only; empty otherwise).
  std::span<const EncodedFile> files;
};

class Loader {
 public:
  // Starts the workers; the first batch is being made when this returns. `decoders` empty:
  // libjpeg-turbo's, within options.limits.
  static Result<std::unique_ptr<Loader>> start(Dataset dataset, LoaderOptions options,
                                               DecoderFactory decoders = {},
                                               BatchAllocator memory = host_batch_allocator());
  // Stops the workers (a batch in the making is finished first).
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch in order; nullopt after the last epoch; the error of a file when strict, or of
  // a worker that could not start.
  Result<std::optional<BatchView>> next();

  // The files skipped so far, in no particular order.
  std::vector<SkippedFile> skipped() const;
  const Dataset& dataset() const;
  const LoaderOptions& options() const;

  struct State;

 private:
  explicit Loader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// One sample through the host pipeline into `out` (sample_bytes(options.augment)): the draw of
// (options.seed, epoch, index), the decode at the scale the crop needs, the crop, flip, resize and
// normalisation. `scratch` keeps the decoded image's memory between calls. The Loader's workers
// call this; so may anything that brings its own buffer.
std::optional<DecodeError> augment_sample(Decoder& decoder, std::span<const std::uint8_t> file,
                                          const LoaderOptions& options, std::uint64_t epoch,
                                          std::uint64_t index, Image& scratch,
                                          std::span<std::byte> out);
// The same from an image already decoded at full size (from the cache).
void augment_decoded(const Image& image, const LoaderOptions& options, std::uint64_t epoch,
                     std::uint64_t index, std::span<std::byte> out);

}  // namespace dlprobe::data
