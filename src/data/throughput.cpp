#include "dlprobe/data/throughput.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include "dlprobe/core/host_memory.h"
#include "dlprobe/core/json_optional.h"
#include "dlprobe/core/parallel.h"
#include "dlprobe/core/units.h"
#include "dlprobe/data/device_staging.h"

namespace dlprobe::data {

std::vector<int> default_thread_counts(int cores) {
  std::vector<int> counts;
  for (int t = 1; t < cores; t *= 2) counts.push_back(t);
  counts.push_back(std::max(cores, 1));
  return counts;
}

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// What one batch brought.
struct BatchCount {
  std::int64_t images = 0;
  std::uint64_t bytes = 0;
  std::int64_t host_decoded = 0;  // decoded on the host instead of the GPU
};

// `warmup` batches from `next`, then batches for at least `min_time`, counted into `point`.
template <typename Next>
Status time_point(ThroughputPoint& point, int warmup, std::chrono::nanoseconds min_time,
                  Next next) {
  for (int i = 0; i < warmup; ++i) DLPROBE_RETURN_IF_ERROR(next().status());
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds();
  for (;;) {
    DLPROBE_ASSIGN_OR_RETURN(const BatchCount c, next());
    point.images += c.images;
    point.bytes += c.bytes;
    point.host_decoded += c.host_decoded;
    if (std::chrono::steady_clock::now() - start >= min_time) break;
  }
  point.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  point.cpu_seconds = process_cpu_seconds() - cpu_start;
  return Status::ok();
}

// An endless loader with `threads` workers.
Result<std::unique_ptr<Loader>> start_loader(const Dataset& dataset, LoaderOptions loader,
                                             int threads, const DecoderFactory& decoders) {
  loader.threads = threads;
  loader.epochs = 0;
  return Loader::start(dataset, loader, decoders);
}

ThroughputPoint point_of(Stage stage, int threads) {
  ThroughputPoint point;
  point.stage = stage;
  point.threads = threads;
  return point;
}

// `staging`: where the augment stage's batches go up to the device (null: they stay on the host).
Result<ThroughputPoint> measure_point(const Dataset& dataset, LoaderOptions loader, Stage stage,
                                      int threads, std::chrono::nanoseconds min_time,
                                      const DecoderFactory& decoders, DeviceStaging* staging,
                                      std::map<std::string, SkippedFile>& skipped) {
  loader.stage = stage;
  DLPROBE_ASSIGN_OR_RETURN(auto running, start_loader(dataset, loader, threads, decoders));
  ThroughputPoint point = point_of(stage, threads);
  if (stage != Stage::augment) staging = nullptr;
  point.uploaded = staging != nullptr;
  // Warm-up: every worker past its start (a decoder made, buffers touched) before timing.
  DLPROBE_RETURN_IF_ERROR(time_point(point, threads, min_time, [&]() -> Result<BatchCount> {
    DLPROBE_ASSIGN_OR_RETURN(auto batch, running->next());
    if (!batch) return error(Errc::internal, "an endless loader ended");
    if (staging != nullptr) {
      // The batch's samples (those its files gave) into the page-locked buffer, then up.
      std::copy(batch->data.begin(), batch->data.end(), staging->host().begin());
      // Not DLPROBE_RETURN_IF_ERROR: this lambda is inside one, whose status it would shadow.
      if (auto sent = staging->upload(); !sent) return sent.status();
    }
    return BatchCount{batch->count, batch->bytes_read, 0};
  }));
  for (SkippedFile& f : running->skipped()) skipped.emplace(f.path.string(), std::move(f));
  return point;
}

// A point on the GPU: the workers read the files and check their headers; each batch is decoded
// (and augmented) on the device before the next is taken.
Result<ThroughputPoint> measure_gpu_point(const Dataset& dataset, LoaderOptions loader,
                                          GpuDecoder& gpu, Stage stage, int threads,
                                          std::chrono::nanoseconds min_time,
                                          const DecoderFactory& decoders,
                                          std::map<std::string, SkippedFile>& skipped) {
  const LoaderOptions augment = loader;
  loader.stage = Stage::read;
  loader.keep_files = true;
  DLPROBE_ASSIGN_OR_RETURN(auto running, start_loader(dataset, loader, threads, decoders));
  ThroughputPoint point = point_of(stage, threads);
  point.gpu = true;
  // Warm-up: the workers started, nvJPEG's buffers sized, the kernel loaded.
  DLPROBE_RETURN_IF_ERROR(
      time_point(point, std::max(threads, 2), min_time, [&]() -> Result<BatchCount> {
        DLPROBE_ASSIGN_OR_RETURN(auto batch, running->next());
        if (!batch) return error(Errc::internal, "an endless loader ended");
        DLPROBE_ASSIGN_OR_RETURN(auto done, gpu.process(*batch, dataset.samples, augment, stage));
        if (augment.strict && !done.skipped.empty()) {
          const SkippedFile& bad = done.skipped.front();
          return invalid_argument(fmt::format("{}: {} ({})", bad.path.string(), bad.message,
                                              decode_failure_name(bad.failure)));
        }
        for (SkippedFile& f : done.skipped) skipped.emplace(f.path.string(), std::move(f));
        return BatchCount{done.delivered, batch->bytes_read, done.host_decoded};
      }));
  for (SkippedFile& f : running->skipped()) skipped.emplace(f.path.string(), std::move(f));
  return point;
}

}  // namespace

Result<ThroughputReport> measure_throughput(const Dataset& dataset,
                                            const ThroughputOptions& options,
                                            DecoderFactory decoders) {
  DLPROBE_RETURN_IF_ERROR(validate(options.loader));
  if (!decoders) decoders = host_decoder_factory(options.loader.limits);
  ThroughputReport report;
  report.root = dataset.root.string();
  report.images = static_cast<std::int64_t>(dataset.samples.size());
  report.classes = static_cast<int>(dataset.classes.size());
  report.cores = usable_cores();
  for (const Sample& s : dataset.samples) {
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(s.path, ec);
    if (!ec) report.dataset_bytes += size;
  }
  report.loader = options.loader;
  std::vector<int> threads = options.threads;
  if (threads.empty()) threads = default_thread_counts(report.cores);
  for (int t : threads) {
    if (t < 1 || t > 1024) return invalid_argument(fmt::format("threads: {} (1 to 1024)", t));
  }
  std::unique_ptr<DeviceStaging> staging;
  if (options.upload_device) {
    if (options.gpu) {
      return invalid_argument(
          "sending batches to the device is for the host path: the GPU path makes them there");
    }
    if (std::find(options.stages.begin(), options.stages.end(), Stage::augment) ==
        options.stages.end()) {
      return invalid_argument("sending batches to the device needs the augment stage");
    }
    const std::size_t bytes =
        static_cast<std::size_t>(options.loader.batch_size) * sample_bytes(options.loader.augment);
    DLPROBE_ASSIGN_OR_RETURN(staging, DeviceStaging::open(*options.upload_device, bytes));
    report.upload_device = options.upload_device;
  }
  std::unique_ptr<GpuDecoder> gpu;
  if (options.gpu) {
    for (Stage stage : options.stages) {
      if (stage == Stage::read) return invalid_argument("the read stage has no GPU form");
    }
    if (options.loader.cache_bytes > 0) {
      return invalid_argument("the cache of decoded images is for the host path only");
    }
    GpuDecoderOptions g = *options.gpu;
    g.max_batch = options.loader.batch_size;
    DLPROBE_ASSIGN_OR_RETURN(gpu, GpuDecoder::open(g));
    report.decoder = gpu->name();
    report.gpu = g.device;
  } else {
    DLPROBE_ASSIGN_OR_RETURN(auto probe, decoders());
    report.decoder = std::string(probe->name());
  }
  std::map<std::string, SkippedFile> skipped;
  const std::optional<std::uint64_t> available = host_memory_available();
  if (options.warm_page_cache && available && report.dataset_bytes <= *available / 2) {
    report.page_cache_warmed = true;
    LoaderOptions warm = options.loader;
    warm.stage = Stage::read;
    warm.threads = std::min(report.cores, 64);
    warm.epochs = 1;
    warm.shuffle = false;
    warm.strict = false;
    DLPROBE_ASSIGN_OR_RETURN(auto reader, Loader::start(dataset, warm, decoders));
    for (;;) {
      DLPROBE_ASSIGN_OR_RETURN(auto batch, reader->next());
      if (!batch) break;
    }
  }
  const auto interrupted = [&] {
    return options.interrupt != nullptr && options.interrupt->load(std::memory_order_relaxed) > 0;
  };
  for (Stage stage : options.stages) {
    for (int t : threads) {
      if (interrupted()) {
        report.interrupted = true;
        break;
      }
      auto measured = gpu ? measure_gpu_point(dataset, options.loader, *gpu, stage, t,
                                              options.min_time, decoders, skipped)
                          : measure_point(dataset, options.loader, stage, t, options.min_time,
                                          decoders, staging.get(), skipped);
      DLPROBE_ASSIGN_OR_RETURN(auto point, std::move(measured));
      if (options.on_point) options.on_point(point);
      report.points.push_back(point);
    }
  }
  for (auto& [path, file] : skipped) report.skipped.push_back(std::move(file));

  if (options.step_rate) {
    // The whole host pipeline, or the furthest stage measured.
    const Stage furthest = *std::max_element(options.stages.begin(), options.stages.end());
    const ThroughputPoint* widest = nullptr;
    CoresNeeded need;
    need.step_rate = *options.step_rate;
    for (const ThroughputPoint& p : report.points) {
      if (p.stage != furthest) continue;
      if (widest == nullptr || p.threads > widest->threads) widest = &p;
      if (p.images_per_second() >= need.step_rate &&
          (!need.reached_with_threads || p.threads < *need.reached_with_threads)) {
        need.reached_with_threads = p.threads;
      }
    }
    if (widest != nullptr && widest->images_per_cpu_second() > 0) {
      need.images_per_cpu_second = widest->images_per_cpu_second();
      need.at_threads = widest->threads;
      need.cores = need.step_rate / need.images_per_cpu_second;
      report.cores_needed = need;
    }
  }
  return report;
}

std::string render_text(const ThroughputReport& r) {
  const AugmentOptions& a = r.loader.augment;
  std::string out = fmt::format(
      "dataset   {}: {} images, {} classes, {}, {}\n"
      "host      {} cores, decoder {}{}{}\n"
      "output    {}x{} {} {}, batch {}, DCT scaling {}, cache {}, seed {}\n\n",
      r.root, r.images, r.classes, format_size(r.dataset_bytes),
      r.page_cache_warmed ? "read once before timing" : "not read before timing", r.cores,
      r.decoder, r.gpu ? fmt::format(" (cuda:{}; the threads read the files)", *r.gpu) : "",
      r.upload_device
          ? fmt::format("; batches copied to cuda:{} from page-locked memory", *r.upload_device)
          : "",
      a.size, a.size, sample_type_name(a.type), sample_layout_name(a.layout), r.loader.batch_size,
      r.loader.dct_scaling ? "on" : "off",
      r.loader.cache_bytes ? format_size(r.loader.cache_bytes) : std::string("off"), r.loader.seed);
  out += fmt::format("{:<20}{:>8}{:>12}{:>14}{:>14}{:>12}\n", "stage", "threads", "img/s",
                     "img/s/thread", "img/CPU-s", "MB/s read");
  for (const ThroughputPoint& p : r.points) {
    const std::string stage =
        fmt::format("{}{}{}", p.gpu ? "gpu " : "", stage_name(p.stage), p.uploaded ? "+copy" : "");
    out += fmt::format("{:<20}{:>8}{:>12}{:>14}{:>14}{:>12}\n", stage, p.threads,
                       format_grouped(p.images_per_second(), 1),
                       format_grouped(p.images_per_second() / p.threads, 1),
                       format_grouped(p.images_per_cpu_second(), 1),
                       format_grouped(p.bytes_per_second() / 1e6, 1));
  }
  if (r.cores_needed) {
    const CoresNeeded& n = *r.cores_needed;
    out += fmt::format(
        "\nfeeding {} img/s takes {:.1f} cores ({} img per CPU-second at {} threads){}\n",
        format_grouped(n.step_rate, 0), n.cores, format_grouped(n.images_per_cpu_second, 1),
        n.at_threads,
        n.reached_with_threads
            ? fmt::format("; reached here with {} threads", *n.reached_with_threads)
            : std::string("; not reached on this machine"));
  }
  if (!r.skipped.empty()) {
    out += fmt::format("\nskipped {} file(s) that gave no image:\n", r.skipped.size());
    for (const SkippedFile& f : r.skipped) {
      out += fmt::format("  {}: {} ({})\n", f.path.string(), f.message,
                         decode_failure_name(f.failure));
    }
  }
  return out;
}

nlohmann::json to_json(const ThroughputReport& r) {
  const AugmentOptions& a = r.loader.augment;
  nlohmann::json points = nlohmann::json::array();
  for (const ThroughputPoint& p : r.points) {
    points.push_back({{"stage", stage_name(p.stage)},
                      {"threads", p.threads},
                      {"gpu", p.gpu},
                      {"uploaded", p.uploaded},
                      {"host_decoded", p.host_decoded},
                      {"images", p.images},
                      {"bytes_read", p.bytes},
                      {"seconds", p.seconds},
                      {"cpu_seconds", p.cpu_seconds},
                      {"images_per_second", p.images_per_second()},
                      {"images_per_second_per_thread", p.images_per_second() / p.threads},
                      {"images_per_cpu_second", p.images_per_cpu_second()},
                      {"bytes_read_per_second", p.bytes_per_second()}});
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const SkippedFile& f : r.skipped) {
    skipped.push_back({{"path", f.path.string()},
                       {"reason", decode_failure_name(f.failure)},
                       {"message", f.message}});
  }
  nlohmann::json cores_needed = nullptr;
  if (r.cores_needed) {
    const CoresNeeded& n = *r.cores_needed;
    cores_needed = {{"step_rate", n.step_rate},
                    {"cores", n.cores},
                    {"images_per_cpu_second", n.images_per_cpu_second},
                    {"at_threads", n.at_threads},
                    {"reached_with_threads", n.reached_with_threads}};
  }
  return {{"schema", kPipelineSchema},
          {"dataset",
           {{"root", r.root},
            {"images", r.images},
            {"classes", r.classes},
            {"bytes", r.dataset_bytes},
            {"page_cache_warmed", r.page_cache_warmed}}},
          {"host",
           {{"cores", r.cores},
            {"decoder", r.decoder},
            {"gpu", r.gpu},
            {"upload_device", r.upload_device}}},
          {"options",
           {{"size", a.size},
            {"dtype", sample_type_name(a.type)},
            {"layout", sample_layout_name(a.layout)},
            {"batch", r.loader.batch_size},
            {"prefetch", r.loader.prefetch},
            {"dct_scaling", r.loader.dct_scaling},
            {"cache_bytes", r.loader.cache_bytes},
            {"seed", r.loader.seed},
            {"flip", a.flip}}},
          {"points", points},
          {"cores_needed", cores_needed},
          {"skipped", skipped},
          {"interrupted", r.interrupted}};
}

}  // namespace dlprobe::data
