#include "dlprobe/data/loader.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "dlprobe/core/named.h"

namespace dlprobe::data {

constexpr Named<Stage> kStageNames[] = {
    {Stage::read, "read"}, {Stage::decode, "decode"}, {Stage::augment, "decode+augment"}};

std::string_view stage_name(Stage stage) {
  return name_of(kStageNames, stage, "decode+augment");
}

Result<Stage> parse_stage(std::string_view name) {
  if (name == "read") return Stage::read;
  if (name == "decode") return Stage::decode;
  if (name == "augment" || name == "decode+augment") return Stage::augment;
  return invalid_argument(fmt::format("unknown stage '{}' (read, decode, augment)", name));
}

BatchAllocator host_batch_allocator() {
  return [](std::size_t bytes) -> Result<std::shared_ptr<std::byte>> {
    constexpr std::align_val_t kAlign{64};
    auto* p = static_cast<std::byte*>(::operator new(bytes, kAlign, std::nothrow));
    if (p == nullptr) {
      return error(Errc::out_of_memory, fmt::format("cannot allocate a batch of {} bytes", bytes));
    }
    return std::shared_ptr<std::byte>(p, [](std::byte* q) { ::operator delete(q, kAlign); });
  };
}

Status validate(const LoaderOptions& o) {
  if (o.threads < 1 || o.threads > 1024) {
    return invalid_argument(fmt::format("threads: {} (1 to 1024)", o.threads));
  }
  if (o.batch_size < 1 || o.batch_size > 65536) {
    return invalid_argument(fmt::format("batch size: {} (1 to 65536)", o.batch_size));
  }
  if (o.prefetch < 1 || o.prefetch > 64) {
    return invalid_argument(fmt::format("prefetch: {} (1 to 64)", o.prefetch));
  }
  if (o.augment.size < 1 || o.augment.size > 8192) {
    return invalid_argument(fmt::format("image size: {} (1 to 8192)", o.augment.size));
  }
  if (o.keep_files && o.stage != Stage::read) {
    return invalid_argument("keep_files: only with the read stage");
  }
  const AugmentOptions& a = o.augment;
  if (!(a.scale_min > 0 && a.scale_min <= a.scale_max && a.scale_max <= 1)) {
    return invalid_argument(
        fmt::format("crop scale: ({}, {}) (0 < min <= max <= 1)", a.scale_min, a.scale_max));
  }
  if (!(a.ratio_min > 0 && a.ratio_min <= a.ratio_max)) {
    return invalid_argument(
        fmt::format("crop ratio: ({}, {}) (0 < min <= max)", a.ratio_min, a.ratio_max));
  }
  for (float s : a.std) {
    if (!(s > 0)) return invalid_argument(fmt::format("std: {} (> 0)", s));
  }
  return Status::ok();
}

std::optional<DecodeError> augment_sample(Decoder& decoder, std::span<const std::uint8_t> file,
                                          const LoaderOptions& options, std::uint64_t epoch,
                                          std::uint64_t index, Image& scratch,
                                          std::span<std::byte> out) {
  auto inspected = decoder.inspect(file);
  if (auto* e = std::get_if<DecodeError>(&inspected)) return std::move(*e);
  const JpegInfo info = std::get<JpegInfo>(inspected);
  const SampleDraw draw =
      draw_sample(info.width, info.height, options.augment, options.seed, epoch, index);
  ScaleFactor scale;
  if (options.dct_scaling) {
    scale = smallest_covering_scale(decoder.scales(), draw.crop.width, draw.crop.height,
                                    options.augment.size, options.augment.size);
  }
  if (auto e = decoder.decode(file, scale, scratch)) return e;
  resize_normalize(scratch, scaled_region(draw.crop, info.width, info.height, scratch), draw.flip,
                   options.augment, out);
  return std::nullopt;
}

void augment_decoded(const Image& image, const LoaderOptions& options, std::uint64_t epoch,
                     std::uint64_t index, std::span<std::byte> out) {
  const SampleDraw draw =
      draw_sample(image.width, image.height, options.augment, options.seed, epoch, index);
  resize_normalize(image, scaled_region(draw.crop, image.width, image.height, image), draw.flip,
                   options.augment, out);
}

namespace {

// A file's bytes into `buffer`, whose memory is kept from file to file (core's read_whole_file
// returns a new string each time, an allocation and a copy per image on the hot path).
Status read_into(const std::filesystem::path& path, std::uint64_t max_bytes,
                 std::vector<std::uint8_t>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return error(Errc::io_error,
                 fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return error(Errc::io_error, fmt::format("{}: not a regular file", path.string()));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return invalid_argument(
        fmt::format("{}: {} bytes, more than the {} accepted", path.string(), size, max_bytes));
  }
  buffer.resize(static_cast<std::size_t>(size));
  std::size_t done = 0;
  while (done < buffer.size()) {
    const ssize_t n = ::read(fd, buffer.data() + done, buffer.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return error(Errc::io_error,
                   fmt::format("{}: cannot read: {}", path.string(), std::strerror(err)));
    }
    if (n == 0) break;  // shrank while read: what was there is the file
    done += static_cast<std::size_t>(n);
  }
  buffer.resize(done);
  ::close(fd);
  return Status::ok();
}

struct Slot {
  std::shared_ptr<std::byte> memory;
  std::vector<EncodedFile> files;  // keep_files: the first labels.size() are this batch's
  std::vector<int> labels;
  std::vector<std::size_t> samples;
  std::uint64_t index = 0;
  std::uint64_t bytes_read = 0;
  bool ready = false;
  Status status;
};

}  // namespace

struct Loader::State {
  Dataset dataset;
  LoaderOptions options;
  DecoderFactory factory;
  std::size_t sample_bytes = 0;
  std::uint64_t batches_per_epoch = 0;
  std::uint64_t total_batches = 0;

  mutable std::mutex mu;
  std::condition_variable work_cv;   // a slot came free, or stop
  std::condition_variable ready_cv;  // a batch is ready, or a worker failed
  std::vector<Slot> slots;
  std::uint64_t next_claim = 0;  // the next batch a worker takes
  std::uint64_t released = 0;    // batches the consumer is done with
  bool holding = false;          // the consumer holds batch `released`
  bool stop = false;
  Status worker_error;
  std::vector<SkippedFile> skipped;
  std::map<std::uint64_t, std::shared_ptr<const std::vector<std::uint32_t>>> orders;

  std::mutex cache_mu;
  std::vector<std::shared_ptr<const Image>> cache;
  std::uint64_t cache_used = 0;

  std::vector<std::thread> workers;

  // Epoch `epoch`'s order of the samples (nullptr: the listing's order); under `mu`.
  std::shared_ptr<const std::vector<std::uint32_t>> order(std::uint64_t epoch) {
    if (!options.shuffle) return nullptr;
    auto it = orders.find(epoch);
    if (it != orders.end()) return it->second;
    auto perm = std::make_shared<std::vector<std::uint32_t>>(dataset.samples.size());
    for (std::size_t i = 0; i < perm->size(); ++i) (*perm)[i] = static_cast<std::uint32_t>(i);
    SplitMix64 rng(options.seed ^ (0xD1B54A32D192ED03ull * (epoch + 1)));
    for (std::size_t i = perm->size(); i > 1; --i) {
      std::swap((*perm)[i - 1],
                (*perm)[static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(i)))]);
    }
    // Workers take batches in order, so an epoch two behind the newest is no longer asked for.
    while (!orders.empty() && orders.begin()->first + 1 < epoch) orders.erase(orders.begin());
    orders.emplace(epoch, perm);
    return perm;
  }

  std::shared_ptr<const Image> cached(std::size_t sample) {
    std::lock_guard lock(cache_mu);
    return cache[sample];
  }
  void keep(std::size_t sample, std::shared_ptr<const Image> image) {
    const std::uint64_t bytes = image->rgb.size();
    std::lock_guard lock(cache_mu);
    if (cache[sample] || cache_used + bytes > options.cache_bytes) return;
    cache_used += bytes;
    cache[sample] = std::move(image);
  }

  void work() {
    auto made = factory();
    if (!made) {
      std::lock_guard lock(mu);
      if (worker_error.is_ok()) worker_error = made.status().with_context("starting a decoder");
      ready_cv.notify_all();
      return;
    }
    Decoder& decoder = **made;
    Image scratch;
    std::vector<std::uint8_t> file;
    for (;;) {
      std::unique_lock lock(mu);
      work_cv.wait(lock, [&] {
        return stop || next_claim >= total_batches || next_claim < released + slots.size();
      });
      if (stop || next_claim >= total_batches) return;
      const std::uint64_t b = next_claim++;
      const auto perm = order(b / batches_per_epoch);
      lock.unlock();
      make_batch(b, perm.get(), decoder, scratch, file);
      lock.lock();
      slots[b % slots.size()].ready = true;
      ready_cv.notify_all();
    }
  }

  void make_batch(std::uint64_t b, const std::vector<std::uint32_t>* perm, Decoder& decoder,
                  Image& scratch, std::vector<std::uint8_t>& file) {
    Slot& slot = slots[b % slots.size()];
    slot.index = b;
    slot.labels.clear();
    slot.samples.clear();
    slot.bytes_read = 0;
    slot.status = Status::ok();
    const std::uint64_t epoch = b / batches_per_epoch;
    const std::size_t n = dataset.samples.size();
    const std::size_t first = static_cast<std::size_t>(b % batches_per_epoch) *
                              static_cast<std::size_t>(options.batch_size);
    const std::size_t last = std::min(first + static_cast<std::size_t>(options.batch_size), n);
    for (std::size_t pos = first; pos < last; ++pos) {
      const std::size_t sample = perm ? (*perm)[pos] : pos;
      std::span<std::byte> out;
      if (options.stage == Stage::augment) {
        out = {slot.memory.get() + slot.labels.size() * sample_bytes, sample_bytes};
      }
      // With keep_files the file is read straight into the slot's own buffer, kept for the
      // consumer.
      std::vector<std::uint8_t>& into =
          options.keep_files ? slot.files[slot.labels.size()].bytes : file;
      std::optional<DecodeError> failed =
          one_sample(sample, epoch, decoder, scratch, into, out, slot.bytes_read);
      if (!failed && options.keep_files) {
        auto inspected = decoder.inspect(into);
        if (auto* e = std::get_if<DecodeError>(&inspected)) {
          failed = std::move(*e);
        } else {
          slot.files[slot.labels.size()].info = std::get<JpegInfo>(inspected);
        }
      }
      if (failed) {
        const Sample& bad = dataset.samples[sample];
        if (options.strict) {
          slot.status =
              invalid_argument(fmt::format("{}: {} ({})", bad.path.string(), failed->message,
                                           decode_failure_name(failed->failure)));
          return;
        }
        std::lock_guard lock(mu);
        skipped.push_back({bad.path, failed->failure, failed->message});
        continue;
      }
      slot.labels.push_back(dataset.samples[sample].label);
      slot.samples.push_back(sample);
    }
  }

  // One sample to the stage asked for; what went wrong, without the file's name.
  std::optional<DecodeError> one_sample(std::size_t sample, std::uint64_t epoch, Decoder& decoder,
                                        Image& scratch, std::vector<std::uint8_t>& file,
                                        std::span<std::byte> out, std::uint64_t& bytes_read) {
    std::shared_ptr<const Image> hit;
    if (options.stage == Stage::augment && options.cache_bytes > 0) hit = cached(sample);
    if (hit) {
      augment_decoded(*hit, options, epoch, sample, out);
      return std::nullopt;
    }
    const std::filesystem::path& path = dataset.samples[sample].path;
    if (Status s = read_into(path, options.max_file_bytes, file); !s) {
      // read_into's message starts with the path, which the caller adds.
      std::string message = s.message();
      if (message.rfind(path.string() + ": ", 0) == 0) message.erase(0, path.string().size() + 2);
      return DecodeError{
          s.code() == Errc::invalid_argument ? DecodeFailure::too_large : DecodeFailure::unreadable,
          std::move(message)};
    }
    bytes_read += file.size();
    switch (options.stage) {
      case Stage::read:
        return std::nullopt;
      case Stage::decode:
        return decoder.decode(file, ScaleFactor{}, scratch);
      case Stage::augment:
        break;
    }
    if (options.cache_bytes == 0) {
      return augment_sample(decoder, file, options, epoch, sample, scratch, out);
    }
    auto image = std::make_shared<Image>();
    if (auto e = decoder.decode(file, ScaleFactor{}, *image)) return e;
    augment_decoded(*image, options, epoch, sample, out);
    keep(sample, std::move(image));
    return std::nullopt;
  }
};

Loader::Loader(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<Loader>> Loader::start(Dataset dataset, LoaderOptions options,
                                              DecoderFactory decoders, BatchAllocator memory) {
  DLPROBE_RETURN_IF_ERROR(validate(options));
  if (!decoders) decoders = host_decoder_factory(options.limits);
  if (dataset.samples.empty()) {
    return invalid_argument(fmt::format("{}: no samples", dataset.root.string()));
  }
  if (dataset.samples.size() > std::numeric_limits<std::uint32_t>::max()) {
    return invalid_argument(fmt::format("{}: more than 2^32 samples", dataset.root.string()));
  }
  auto state = std::make_unique<State>();
  state->sample_bytes = sample_bytes(options.augment);
  const std::uint64_t n = dataset.samples.size();
  const auto batch = static_cast<std::uint64_t>(options.batch_size);
  state->batches_per_epoch = (n + batch - 1) / batch;
  state->total_batches = options.epochs == 0 ? std::numeric_limits<std::uint64_t>::max()
                                             : options.epochs * state->batches_per_epoch;
  state->slots.resize(static_cast<std::size_t>(options.threads) *
                      static_cast<std::size_t>(options.prefetch));
  if (options.stage == Stage::augment) {
    for (Slot& slot : state->slots) {
      DLPROBE_ASSIGN_OR_RETURN(slot.memory, memory(state->sample_bytes * batch));
    }
  }
  if (options.keep_files) {
    for (Slot& slot : state->slots) slot.files.resize(static_cast<std::size_t>(batch));
  }
  if (options.cache_bytes > 0) state->cache.resize(dataset.samples.size());
  state->dataset = std::move(dataset);
  state->options = options;
  state->factory = std::move(decoders);
  State* s = state.get();
  for (int i = 0; i < options.threads; ++i) s->workers.emplace_back([s] { s->work(); });
  return std::unique_ptr<Loader>(new Loader(std::move(state)));
}

Loader::~Loader() {
  {
    std::lock_guard lock(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (std::thread& t : state_->workers) t.join();
}

Result<std::optional<BatchView>> Loader::next() {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  if (s.holding) {
    s.slots[s.released % s.slots.size()].ready = false;
    ++s.released;
    s.holding = false;
    s.work_cv.notify_all();
  }
  if (s.released >= s.total_batches) return std::optional<BatchView>{};
  Slot& slot = s.slots[s.released % s.slots.size()];
  s.ready_cv.wait(lock, [&] { return slot.ready || !s.worker_error.is_ok(); });
  if (!slot.ready) {
    s.stop = true;
    s.work_cv.notify_all();
    return s.worker_error;
  }
  if (!slot.status.is_ok()) {
    s.stop = true;
    s.work_cv.notify_all();
    return slot.status;
  }
  s.holding = true;
  BatchView view;
  view.index = slot.index;
  view.epoch = slot.index / s.batches_per_epoch;
  view.count = static_cast<int>(slot.labels.size());
  view.labels = slot.labels;
  view.samples = slot.samples;
  if (slot.memory) view.data = {slot.memory.get(), slot.labels.size() * s.sample_bytes};
  view.bytes_read = slot.bytes_read;
  if (s.options.keep_files) view.files = {slot.files.data(), slot.labels.size()};
  return std::optional<BatchView>(view);
}

std::vector<SkippedFile> Loader::skipped() const {
  std::lock_guard lock(state_->mu);
  return state_->skipped;
}

const Dataset& Loader::dataset() const {
  return state_->dataset;
}
const LoaderOptions& Loader::options() const {
  return state_->options;
}

}  // namespace dlprobe::data
