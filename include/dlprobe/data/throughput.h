// How fast the host input pipeline runs on this machine: images per second for the decode alone
// and for the whole host pipeline (decode and augmentation into the batch buffer, and where asked
// the batch sent to a GPU), over a curve of
// worker thread counts, with the bytes read per second, the images per CPU-second (a core's worth,
// whatever else the machine runs) and the cores it takes to feed a training step of R images per
// second. `dlprobe pipeline` prints it; the JSON form is schema dlprobe.pipeline/1.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/data/dataset.h"
#include "dlprobe/data/gpu_decoder.h"
#include "dlprobe/data/loader.h"

namespace dlprobe::data {

inline constexpr const char* kPipelineSchema = "dlprobe.pipeline/1";

struct ThroughputPoint;

struct ThroughputOptions {
  LoaderOptions loader;      // its threads and stage are set point by point
  std::vector<int> threads;  // empty: default_thread_counts(cores)
  std::vector<Stage> stages = {Stage::decode, Stage::augment};
  std::chrono::nanoseconds min_time = std::chrono::seconds(3);  // timed per point
  std::optional<double> step_rate;  // images per second the training step takes
  // Read every file once before the first point, so that each point reads from the page cache
  // rather than the first point paying for the disk; done only when the files take at most half
  // of the memory available (a larger dataset is read from disk in training too, and reading it
  // all first would take as long as an epoch).
  bool warm_page_cache = true;
  // Decode (and augment) on this GPU: the worker threads then read the files and check their
  // headers, and each point's batches are decoded by nvJPEG and augmented on the device.
  std::optional<GpuDecoderOptions> gpu;
  // On the host path, send each augmented batch to this CUDA device (DeviceStaging: page-locked
  // memory, a stream of its own) before the next is taken: the augment stage's images then count
  // once they are on the device, as training from the host's cores gets them.
  std::optional<int> upload_device;
  // Called after each point, for progress lines.
  std::function<void(const ThroughputPoint&)> on_point;
  // Once this count (an InterruptGuard's) is not 0, no further point starts: the report holds the
  // points measured, and says it was interrupted.
  const std::atomic<int>* interrupt = nullptr;
};

// 1, 2, 4 ... up to `cores`, and `cores` itself.
std::vector<int> default_thread_counts(int cores);

struct ThroughputPoint {
  Stage stage = Stage::augment;
  int threads = 0;
  std::int64_t images = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // the process's CPU time over the timed window
  bool gpu = false;        // decoded (and augmented) on the GPU
  bool uploaded = false;   // host batches sent to the device (ThroughputOptions::upload_device)
  // On the GPU path: images nvJPEG's batched decoder did not take, decoded on the host instead.
  std::int64_t host_decoded = 0;
  double images_per_second() const {
    return seconds > 0 ? static_cast<double>(images) / seconds : 0;
  }
  double bytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
  double images_per_cpu_second() const {
    return cpu_seconds > 0 ? static_cast<double>(images) / cpu_seconds : 0;
  }
};

struct CoresNeeded {
  double step_rate = 0;
  // From the whole pipeline's images per CPU-second at its largest thread count measured.
  double cores = 0;
  double images_per_cpu_second = 0;
  int at_threads = 0;
  // The fewest threads measured whose rate reached step_rate (nullopt: none did).
  std::optional<int> reached_with_threads;
};

struct ThroughputReport {
  std::string root;
  std::int64_t images = 0;  // in the dataset
  int classes = 0;
  std::uint64_t dataset_bytes = 0;
  bool page_cache_warmed = false;  // every file read once before the points
  int cores = 0;                   // CPUs this process may use
  std::string decoder;
  std::optional<int> gpu;            // the CUDA device that decoded, if any
  std::optional<int> upload_device;  // the CUDA device the host's batches were sent to, if any
  LoaderOptions loader;
  std::vector<ThroughputPoint> points;
  std::vector<SkippedFile> skipped;  // each file once
  std::optional<CoresNeeded> cores_needed;
  bool interrupted = false;  // points after those in `points` were not measured
};

// Measures `dataset` point by point (each stage at each thread count, for at least min_time after
// one batch per thread of warm-up). `decoders` empty: libjpeg-turbo's, within
// options.loader.limits.
Result<ThroughputReport> measure_throughput(const Dataset& dataset,
                                            const ThroughputOptions& options,
                                            DecoderFactory decoders = {});

std::string render_text(const ThroughputReport& report);
nlohmann::json to_json(const ThroughputReport& report);

}  // namespace dlprobe::data
