// The GPU decoder: nvJPEG's batched decode into one device buffer of interleaved RGB images, the
// host's libjpeg-turbo for what nvJPEG does not take, and the augmentation kernel.
#include "dlprobe/data/gpu_decoder.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.h"
#include "data/gpu/augment_kernel.h"
#include "data/gpu/nvjpeg_api.h"

namespace dlprobe::data {

namespace {

// Device memory that grows to the largest size asked for and is kept.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  Status reserve(std::size_t bytes) {
    if (bytes <= capacity_) return Status::ok();
    if (data_ != nullptr) {
      DLPROBE_CUDA_CHECK(cudaFree(data_));
      data_ = nullptr;
      capacity_ = 0;
    }
    // Half again as much, so that a batch of slightly larger images does not reallocate each time.
    const std::size_t grown = bytes + bytes / 2;
    DLPROBE_CUDA_CHECK(cudaMalloc(&data_, grown));
    capacity_ = grown;
    return Status::ok();
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// nvJPEG's device and pinned memory, kept once taken: its default allocators call cudaFree and
// cudaFreeHost, which wait for the whole device, so each batch made beside a training step waited
// for the step (on an H200, fp16 ResNet-50 bs256: 39 ms a batch beside the 36 ms step, against 8 ms
// alone). A block nvJPEG frees goes back to a list and serves its next request of at most that
// size; the memory is returned when the process ends. nvJPEG's allocator interface carries no
// context, so the lists are the process's.
class KeptBlocks {
 public:
  using Alloc = cudaError_t (*)(void**, std::size_t);
  int take(void** p, std::size_t bytes, Alloc alloc) {
    std::lock_guard lock(mu_);
    // The smallest free block that fits.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best != free_.end()) {
      *p = best->first;
      used_.emplace(best->first, best->second);
      free_.erase(best);
      return 0;
    }
    if (alloc(p, bytes) != cudaSuccess) {
      // Cleared, so that the next launch's check does not report this failure, which nvJPEG
      // answers by decoding on the host.
      (void)cudaGetLastError();
      return 1;
    }
    used_.emplace(*p, bytes);
    return 0;
  }
  int give(void* p) {
    if (p == nullptr) return 0;  // as cudaFree(nullptr)
    std::lock_guard lock(mu_);
    auto it = used_.find(p);
    if (it == used_.end()) return 1;
    free_.emplace_back(it->first, it->second);
    used_.erase(it);
    return 0;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<void*, std::size_t>> free_;
  std::map<void*, std::size_t> used_;
};

KeptBlocks& device_blocks() {
  static KeptBlocks* blocks = new KeptBlocks;  // never destroyed: nvJPEG may free at exit
  return *blocks;
}
KeptBlocks& pinned_blocks() {
  static KeptBlocks* blocks = new KeptBlocks;
  return *blocks;
}

nvjpeg::DeviceAllocator kDeviceAllocator{
    [](void** p, std::size_t bytes) {
      return device_blocks().take(p, bytes,
                                  [](void** q, std::size_t n) { return cudaMalloc(q, n); });
    },
    [](void* p) { return device_blocks().give(p); }};
nvjpeg::PinnedAllocator kPinnedAllocator{
    [](void** p, std::size_t bytes, unsigned) {
      return pinned_blocks().take(p, bytes,
                                  [](void** q, std::size_t n) { return cudaMallocHost(q, n); });
    },
    [](void* p) { return pinned_blocks().give(p); }};

class NvjpegDecoder final : public GpuDecoder {
 public:
  ~NvjpegDecoder() override {
    // Each destroy runs only for what was made; errors at teardown have no one to go to.
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (parse_ != nullptr) api_->stream_destroy(parse_);
    if (state_ != nullptr) api_->state_destroy(state_);
    if (handle_ != nullptr) api_->destroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status open(const GpuDecoderOptions& o) {
    DLPROBE_ASSIGN_OR_RETURN(api_, nvjpeg::load(o.library));
    int count = 0;
    DLPROBE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (o.device < 0 || o.device >= count) {
      return invalid_argument(
          fmt::format("cuda:{}: this machine has {} CUDA device(s)", o.device, count));
    }
    DLPROBE_CUDA_CHECK(cudaSetDevice(o.device));
    device_ = o.device;
    cudaDeviceProp prop{};
    DLPROBE_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
    DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The hardware engine where asked for and present; nvJPEG refuses to make a hardware handle on
    // a GPU without one, and then its CUDA decoder (the default backend) does the work.
    hardware_ = o.hardware && api_->create_ex(nvjpeg::kBackendHardware, &kDeviceAllocator,
                                              &kPinnedAllocator, 0, &handle_) == nvjpeg::kSuccess;
    if (!hardware_) {
      handle_ = nullptr;
      DLPROBE_NVJPEG_CHECK(api_->create_ex(nvjpeg::kBackendDefault, &kDeviceAllocator,
                                           &kPinnedAllocator, 0, &handle_));
    }
    // Room to spare in every buffer nvJPEG takes, so that a batch of larger images than the last
    // seldom needs a new one.
    DLPROBE_NVJPEG_CHECK(api_->set_device_padding(std::size_t{64} << 20, handle_));
    DLPROBE_NVJPEG_CHECK(api_->set_pinned_padding(std::size_t{16} << 20, handle_));
    DLPROBE_NVJPEG_CHECK(api_->state_create(handle_, &state_));
    DLPROBE_NVJPEG_CHECK(api_->stream_create(handle_, &parse_));
    DLPROBE_ASSIGN_OR_RETURN(host_, make_host_decoder());
    ycbcr_ = o.pixels == GpuPixels::ycbcr;
    name_ = fmt::format("nvJPEG {} {}{}, {}", api_->version,
                        hardware_ ? "hardware engine" : "CUDA decoder",
                        ycbcr_ ? " (YCbCr planes)" : "", prop.name);
    max_batch_ = o.max_batch;
    return Status::ok();
  }

  const std::string& name() const override { return name_; }
  const void* device_batch() const override { return batches_[turn_].data(); }

  Result<GpuBatchResult> process(const BatchView& batch, const std::vector<Sample>& samples,
                                 const LoaderOptions& options, Stage stage, int fill_to) override {
    // Any thread may call: the caller's current device need not be this one.
    DLPROBE_CUDA_CHECK(cudaSetDevice(device_));
    const auto n = static_cast<std::size_t>(batch.count);
    if (batch.files.size() != n) {
      return invalid_argument("GPU decode: the batch holds no files (a loader with keep_files)");
    }
    if (batch.count > max_batch_) {
      return invalid_argument(
          fmt::format("GPU decode: a batch of {} (at most {})", batch.count, max_batch_));
    }
    // Where each image goes in the pixel buffer, tightly pitched.
    offsets_.resize(n);
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      offsets_[i] = total;
      const JpegInfo& info = batch.files[i].info;
      total += static_cast<std::size_t>(info.width) * 3 * static_cast<std::size_t>(info.height);
    }
    DLPROBE_RETURN_IF_ERROR(pixels_.reserve(std::max<std::size_t>(total, 1)));

    // nvJPEG's batched decode for the files it takes, the host for the others.
    on_gpu_.clear();
    on_host_.clear();
    chroma_.assign(n, gpu::ChromaPlane{});
    planar_.assign(n, false);
    for (std::size_t i = 0; i < n; ++i) {
      (takes(i, batch.files[i]) ? on_gpu_ : on_host_).push_back(i);
    }
    GpuBatchResult result;
    std::vector<bool> ok(n, false);
    if (!on_gpu_.empty() && !decode_batched(batch, ok)) {
      // A batch nvJPEG fails on: the host finds which file did it.
      on_host_.insert(on_host_.end(), on_gpu_.begin(), on_gpu_.end());
      initialized_ = -1;  // nvJPEG's documented reset after a failed batch
    }
    for (std::size_t i : on_host_) {
      const EncodedFile& f = batch.files[i];
      if (auto failed = host_->decode(f.bytes, ScaleFactor{}, image_)) {
        const std::size_t sample = batch.samples[i];
        result.skipped.push_back({samples[sample].path, failed->failure, failed->message});
        continue;
      }
      if (image_.width != f.info.width || image_.height != f.info.height) {
        return error(Errc::internal,
                     "GPU decode: the host decode's size differs from the header's");
      }
      const std::size_t pitch = static_cast<std::size_t>(image_.width) * 3;
      DLPROBE_CUDA_CHECK(cudaMemcpy2DAsync(pixels_.data() + offsets_[i], pitch, image_.rgb.data(),
                                           pitch, pitch, static_cast<std::size_t>(image_.height),
                                           cudaMemcpyHostToDevice, stream_));
      ok[i] = true;
      ++result.host_decoded;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (ok[i]) result.positions.push_back(static_cast<int>(i));
    }
    const std::size_t decoded = result.positions.size();
    if (decoded > 0 && fill_to > max_batch_) {
      return invalid_argument(
          fmt::format("GPU decode: fill to {} (at most {})", fill_to, max_batch_));
    }
    for (std::size_t k = 0;
         decoded > 0 && result.positions.size() < static_cast<std::size_t>(fill_to); ++k) {
      result.positions.push_back(result.positions[k % decoded]);
    }
    result.delivered = static_cast<int>(result.positions.size());
    // Only a batch with images takes a turn of the device buffers: a caller that counts the
    // batches it was given counts the turns.
    if (stage == Stage::augment && result.delivered > 0) {
      DLPROBE_RETURN_IF_ERROR(augment(batch, options, result));
    }
    DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return result;
  }

 private:
  // Whether nvJPEG's batched decoder takes file i: the hardware engine says per file (baseline
  // only, no 4:1:0 or 4:1:1); the CUDA decoder takes baseline and progressive YCbCr. For YCbCr
  // planes, only the subsamplings ycbcr.h upsamples; chroma_[i] gets their geometry.
  bool takes(std::size_t i, const EncodedFile& f) {
    if (f.info.components != 3) return false;
    // A file that does not end with the end-of-image marker goes to libjpeg-turbo, which finds a
    // truncation: nvJPEG's hardware engine decodes a truncated file without an error, leaving the
    // missing rows grey (seen on an H200).
    const std::vector<std::uint8_t>& b = f.bytes;
    if (b.size() < 2 || b[b.size() - 2] != 0xFF || b[b.size() - 1] != 0xD9) return false;
    if (!hardware_ && !ycbcr_) return true;
    if (api_->stream_parse_header(handle_, f.bytes.data(), f.bytes.size(), parse_) !=
        nvjpeg::kSuccess) {
      return false;
    }
    int supported = -1;
    if (hardware_ &&
        (api_->decode_batched_supported(handle_, parse_, &supported) != nvjpeg::kSuccess ||
         supported != 0)) {
      return false;
    }
    return !ycbcr_ || chroma_of(i, f.info);
  }

  // The chroma planes' geometry of the file parse_ holds, into chroma_[i]; false for a
  // subsampling ycbcr.h does not upsample or planes that do not cover the image as it says.
  bool chroma_of(std::size_t i, const JpegInfo& info) {
    nvjpeg::ChromaSubsampling css = nvjpeg::kCss444;
    unsigned width = 0;
    unsigned height = 0;
    if (api_->stream_get_chroma_subsampling(parse_, &css) != nvjpeg::kSuccess ||
        api_->stream_get_component_dimensions(parse_, 1, &width, &height) != nvjpeg::kSuccess) {
      return false;
    }
    gpu::ChromaPlane& p = chroma_[i];
    switch (css) {
      case nvjpeg::kCss444:
        break;
      case nvjpeg::kCss422:
        p.shift_x = 1;
        break;
      case nvjpeg::kCss420:
        p.shift_x = 1;
        p.shift_y = 1;
        break;
      case nvjpeg::kCss440:
        p.shift_y = 1;
        break;
      default:
        return false;
    }
    p.width = static_cast<int>(width);
    p.height = static_cast<int>(height);
    p.pitch = p.width;
    return p.width == (info.width + p.shift_x) >> p.shift_x &&
           p.height == (info.height + p.shift_y) >> p.shift_y;
  }

  // nvJPEG's batched decode of on_gpu_ into the pixel buffer; false when nvJPEG failed it.
  bool decode_batched(const BatchView& batch, std::vector<bool>& ok) {
    const auto k = static_cast<int>(on_gpu_.size());
    data_.clear();
    lengths_.clear();
    images_.clear();
    for (std::size_t i : on_gpu_) {
      const EncodedFile& f = batch.files[i];
      data_.push_back(f.bytes.data());
      lengths_.push_back(f.bytes.size());
      nvjpeg::Image image{};
      auto* base = reinterpret_cast<unsigned char*>(pixels_.data() + offsets_[i]);
      const auto width = static_cast<std::size_t>(f.info.width);
      if (ycbcr_) {
        // The three planes one after another, within the image's 3 x width x height bytes.
        const gpu::ChromaPlane& p = chroma_[i];
        const std::size_t luma = width * static_cast<std::size_t>(f.info.height);
        const auto chroma = static_cast<std::size_t>(p.width) * static_cast<std::size_t>(p.height);
        image.channel[0] = base;
        image.pitch[0] = width;
        image.channel[1] = base + luma;
        image.pitch[1] = static_cast<std::size_t>(p.width);
        image.channel[2] = base + luma + chroma;
        image.pitch[2] = static_cast<std::size_t>(p.width);
      } else {
        image.channel[0] = base;
        image.pitch[0] = width * 3;
      }
      images_.push_back(image);
    }
    if (initialized_ != k) {
      if (api_->decode_batched_initialize(handle_, state_, k, 1, output()) != nvjpeg::kSuccess) {
        return false;
      }
      initialized_ = k;
      reserved_width_ = 0;
      reserved_height_ = 0;
    }
    if (hardware_) reserve_hardware(batch, k);
    if (api_->decode_batched(handle_, state_, data_.data(), lengths_.data(), images_.data(),
                             stream_) != nvjpeg::kSuccess) {
      return false;
    }
    for (std::size_t i : on_gpu_) {
      ok[i] = true;
      planar_[i] = ycbcr_;
    }
    return true;
  }

  nvjpeg::OutputFormat output() const {
    return ycbcr_ ? nvjpeg::kOutputYuv : nvjpeg::kOutputRgbInterleaved;
  }

  // The hardware engine's working memory, sized ahead for k images as large as the largest seen
  // so far (rounded up). Left to itself nvJPEG frees and takes that memory again from batch to
  // batch as their images change, and cudaFree waits for the whole device: beside a training step
  // (H200, fp16 ResNet-50 bs256) 36 frees in a run that fed 81 batches each waited for the step
  // in flight to end, and every CUDA call of the process with them (lab/gpu/slow-calls.sh). Growing
  // here happens once per new largest image, not per batch. Beyond kMaxReserve (an estimate at four
  // bytes a pixel: nvJPEG's conversion on the H200 reads RGBA) the memory is left to nvJPEG rather
  // than held for a few outsized files.
  void reserve_hardware(const BatchView& batch, int k) {
    constexpr std::size_t kMaxReserve = std::size_t{4} << 30;
    constexpr int kRound = 128;
    for (std::size_t i : on_gpu_) {
      seen_width_ = std::max(seen_width_, batch.files[i].info.width);
      seen_height_ = std::max(seen_height_, batch.files[i].info.height);
    }
    const int width = (seen_width_ + kRound - 1) / kRound * kRound;
    const int height = (seen_height_ + kRound - 1) / kRound * kRound;
    if (api_->decode_batched_pre_allocate == nullptr ||
        (width <= reserved_width_ && height <= reserved_height_)) {
      return;
    }
    const std::size_t bytes = static_cast<std::size_t>(k) * static_cast<std::size_t>(width) *
                              static_cast<std::size_t>(height) * 4;
    if (bytes > kMaxReserve) return;
    // 4:4:4, the layout that needs the most memory, so that any subsampling fits. A refusal
    // leaves the memory to nvJPEG as before: slower beside a step, not wrong.
    if (api_->decode_batched_pre_allocate(handle_, state_, k, width, height, nvjpeg::kCss444,
                                          output()) == nvjpeg::kSuccess) {
      reserved_width_ = width;
      reserved_height_ = height;
    }
  }

  Status augment(const BatchView& batch, const LoaderOptions& options,
                 const GpuBatchResult& result) {
    const std::size_t sample_size = sample_bytes(options.augment);
    turn_ = 1 - turn_;
    DeviceBuffer& into = batches_[turn_];
    DLPROBE_RETURN_IF_ERROR(into.reserve(sample_size * static_cast<std::size_t>(max_batch_)));
    jobs_host_.clear();
    for (int pos : result.positions) {
      const auto i = static_cast<std::size_t>(pos);
      const JpegInfo& info = batch.files[i].info;
      const SampleDraw draw = draw_sample(info.width, info.height, options.augment, options.seed,
                                          batch.epoch, batch.samples[i]);
      gpu::AugmentJob job;
      job.pixels = reinterpret_cast<const std::uint8_t*>(pixels_.data() + offsets_[i]);
      job.pitch = static_cast<std::int64_t>(info.width) * 3;
      if (planar_[i]) {
        const std::int64_t luma = static_cast<std::int64_t>(info.width) * info.height;
        job.pitch = info.width;
        job.ycbcr = 1;
        job.cb = chroma_[i];
        job.cb.data = job.pixels + luma;
        job.cr = chroma_[i];
        job.cr.data = job.cb.data + job.cb.pitch * job.cb.height;
      }
      job.width = info.width;
      job.height = info.height;
      job.x = draw.crop.x;
      job.y = draw.crop.y;
      job.region_width = draw.crop.width;
      job.region_height = draw.crop.height;
      job.flip = draw.flip ? 1 : 0;
      jobs_host_.push_back(job);
    }
    if (jobs_host_.empty()) return Status::ok();
    DLPROBE_RETURN_IF_ERROR(jobs_.reserve(jobs_host_.size() * sizeof(gpu::AugmentJob)));
    DLPROBE_CUDA_CHECK(cudaMemcpyAsync(jobs_.data(), jobs_host_.data(),
                                       jobs_host_.size() * sizeof(gpu::AugmentJob),
                                       cudaMemcpyHostToDevice, stream_));
    DLPROBE_CUDA_CHECK(gpu::launch_augment(
        reinterpret_cast<const gpu::AugmentJob*>(jobs_.data()), static_cast<int>(jobs_host_.size()),
        gpu::augment_params(options.augment), into.data(), stream_));
    return Status::ok();
  }

  std::shared_ptr<const nvjpeg::Api> api_;
  nvjpeg::HandleRef handle_ = nullptr;
  nvjpeg::StateRef state_ = nullptr;
  nvjpeg::StreamRef parse_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool hardware_ = false;
  bool ycbcr_ = false;    // nvJPEG writes YCbCr planes (GpuPixels::ycbcr)
  int initialized_ = -1;  // the batch size nvJPEG's batched decoder was last initialised for
  // The image size the hardware engine's memory is reserved for since the last initialisation,
  // and the largest image nvJPEG was given.
  int reserved_width_ = 0;
  int reserved_height_ = 0;
  int seen_width_ = 0;
  int seen_height_ = 0;
  int max_batch_ = 0;
  std::unique_ptr<Decoder> host_;
  std::string name_;
  DeviceBuffer pixels_;
  DeviceBuffer batches_[2];
  int turn_ = 0;
  DeviceBuffer jobs_;
  // Per batch, kept to reuse their memory.
  std::vector<std::size_t> offsets_;
  std::vector<std::size_t> on_gpu_;
  std::vector<std::size_t> on_host_;
  std::vector<gpu::ChromaPlane> chroma_;  // per file, its planes' geometry (YCbCr planes)
  std::vector<bool> planar_;              // per file, decoded to YCbCr planes
  std::vector<const unsigned char*> data_;
  std::vector<std::size_t> lengths_;
  std::vector<nvjpeg::Image> images_;
  std::vector<gpu::AugmentJob> jobs_host_;
  Image image_;
};

}  // namespace

Result<std::unique_ptr<GpuDecoder>> GpuDecoder::open(const GpuDecoderOptions& options) {
  if (options.max_batch < 1 || options.max_batch > 65536) {
    return invalid_argument(
        fmt::format("GPU decode: max batch {} (1 to 65536)", options.max_batch));
  }
  auto decoder = std::make_unique<NvjpegDecoder>();
  DLPROBE_RETURN_IF_ERROR(decoder->open(options));
  return std::unique_ptr<GpuDecoder>(std::move(decoder));
}

}  // namespace dlprobe::data
