// The GPU decode path against the host's: the augmentation kernel against resize_normalize on the
// same pixels (tight), nvJPEG's decode and the whole GPU path against the host pipeline on the
// same files (within the two decoders' difference), and bad files skipped for the same reasons.
#include "dlprobe/data/gpu_decoder.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>

#include "common/temp_folder.h"
#include "data/gpu/augment_kernel.h"
#include "dlprobe/data/make_dataset.h"
#include "jpeg_files.h"

namespace dlprobe::data {
namespace {

float to_float(SampleType type, const std::byte* p) {
  std::uint16_t h = 0;
  switch (type) {
    case SampleType::fp32: {
      float f = 0;
      std::memcpy(&f, p, 4);
      return f;
    }
    case SampleType::fp16:
      std::memcpy(&h, p, 2);
      return static_cast<float>(std::bit_cast<_Float16>(h));
    case SampleType::bf16:
      std::memcpy(&h, p, 2);
      return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
  }
  return 0;
}

std::vector<float> floats(SampleType type, const std::vector<std::byte>& bytes) {
  const std::size_t size = sample_type_size(type);
  std::vector<float> out(bytes.size() / size);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_float(type, bytes.data() + i * size);
  return out;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  return worst;
}

// The kernel's sample of `region` of `image`, as bytes.
std::vector<std::byte> kernel_sample(const Image& image, Region region, bool flip,
                                     const AugmentOptions& options) {
  void* pixels = nullptr;
  void* job_memory = nullptr;
  void* out = nullptr;
  const std::size_t bytes = sample_bytes(options);
  EXPECT_EQ(cudaMalloc(&pixels, image.rgb.size()), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&job_memory, sizeof(gpu::AugmentJob)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&out, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(pixels, image.rgb.data(), image.rgb.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  gpu::AugmentJob job;
  job.pixels = static_cast<const std::uint8_t*>(pixels);
  job.pitch = image.width * 3;
  job.width = image.width;
  job.height = image.height;
  job.x = region.x;
  job.y = region.y;
  job.region_width = region.width;
  job.region_height = region.height;
  job.flip = flip ? 1 : 0;
  EXPECT_EQ(cudaMemcpy(job_memory, &job, sizeof job, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(gpu::launch_augment(static_cast<const gpu::AugmentJob*>(job_memory), 1,
                                gpu::augment_params(options), out, nullptr),
            cudaSuccess);
  std::vector<std::byte> result(bytes);
  EXPECT_EQ(cudaMemcpy(result.data(), out, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(pixels);
  cudaFree(job_memory);
  cudaFree(out);
  return result;
}

TEST(GpuAugment, KernelGivesTheHostsSampleInEveryTypeAndLayout) {
  Image image;
  image.width = 97;
  image.height = 73;
  image.rgb = testing::smooth_rgb(image.width, image.height);
  // Some texture, so that a tap off by one pixel shows.
  for (std::size_t i = 0; i < image.rgb.size(); i += 7) image.rgb[i] ^= 0x5A;
  // A region narrower than the output (upscaled), one wider (rows first on the host), fractional.
  const Region regions[] = {{10, 7, 40, 30}, {3.5, 2.25, 90, 70}};
  for (SampleType type : {SampleType::fp32, SampleType::fp16, SampleType::bf16}) {
    for (SampleLayout layout : {SampleLayout::nchw, SampleLayout::nhwc}) {
      for (const Region& region : regions) {
        for (bool flip : {false, true}) {
          AugmentOptions o;
          o.size = 48;
          o.type = type;
          o.layout = layout;
          std::vector<std::byte> host(sample_bytes(o));
          resize_normalize(image, region, flip, o, host);
          const auto gpu = floats(type, kernel_sample(image, region, flip, o));
          const auto want = floats(type, host);
          // fp32: rounding order only; fp16 and bf16: one unit in the last place of values up to
          // about 2.6 in magnitude.
          const double tolerance = type == SampleType::fp32   ? 1e-5
                                   : type == SampleType::fp16 ? 2.5e-3
                                                              : 2e-2;
          EXPECT_LE(max_abs_difference(gpu, want), tolerance)
              << sample_type_name(type) << " " << sample_layout_name(layout) << " region x "
              << region.x << " flip " << flip;
          // The comparison can fail: the region one pixel off gives another sample.
          const Region off{region.x + 1, region.y, region.width, region.height};
          EXPECT_GT(max_abs_difference(floats(type, kernel_sample(image, off, flip, o)), want),
                    10 * tolerance);
        }
      }
    }
  }
}

struct Folder {
  testing::TempFolder dir;
  Dataset dataset;
};

// An ImageNet-like dataset from make_dataset, and one folder of every kind of bad and odd file.
std::unique_ptr<Folder> make_folder(bool with_bad) {
  auto f = std::make_unique<Folder>();
  MakeDatasetOptions m;
  m.images = 40;
  m.classes = 2;
  EXPECT_TRUE(make_dataset(f->dir / "set", m));
  if (with_bad) {
    const std::filesystem::path odd = f->dir / "set" / "class_0000";
    for (const auto& bad : testing::bad_files())
      testing::write_bytes(odd / ("bad_" + bad.name + ".jpg"), bad.bytes);
    const auto rgb = testing::smooth_rgb(48, 40);
    testing::write_bytes(
        odd / "odd_progressive.jpg",
        testing::encode(rgb, 48, 40, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE));
    testing::write_bytes(
        odd / "odd_gray.jpg",
        testing::encode(std::vector<std::uint8_t>(48 * 40, 99), 48, 40, TJPF_GRAY, TJSAMP_GRAY));
    testing::write_bytes(odd / "odd_cmyk.jpg",
                         testing::encode(std::vector<std::uint8_t>(48 * 40 * 4, 120), 48, 40,
                                         TJPF_CMYK, TJSAMP_444));
  }
  auto listed = list_dataset(f->dir / "set");
  EXPECT_TRUE(listed) << listed.status().message();
  f->dataset = *listed;
  return f;
}

LoaderOptions options_for(SampleType type) {
  LoaderOptions o;
  o.batch_size = 16;
  o.seed = 3;
  o.epochs = 1;
  o.dct_scaling = false;  // the GPU decodes at full size
  o.augment.size = 64;
  o.augment.type = type;
  return o;
}

// Every sample the host pipeline makes, by sample index.
std::map<std::size_t, std::vector<float>> host_samples(const Dataset& dataset, LoaderOptions o) {
  std::map<std::size_t, std::vector<float>> out;
  auto loader = Loader::start(dataset, o);
  EXPECT_TRUE(loader);
  const std::size_t size = sample_bytes(o.augment);
  for (auto b = (*loader)->next(); b && *b; b = (*loader)->next()) {
    for (int i = 0; i < (*b)->count; ++i) {
      std::vector<std::byte> one((*b)->data.begin() + static_cast<long>(i * size),
                                 (*b)->data.begin() + static_cast<long>((i + 1) * size));
      out[(*b)->samples[static_cast<std::size_t>(i)]] = floats(o.augment.type, one);
    }
  }
  return out;
}

// Each form nvJPEG hands the augmentation: its RGB, and the files' YCbCr planes converted in the
// kernel (the host-decoded files of the same batches stay RGB).
class GpuDecoderPixels : public ::testing::TestWithParam<GpuPixels> {};

TEST_P(GpuDecoderPixels, SamplesAgreeWithTheHostPipelineAndBadFilesAreSkippedForTheSameReasons) {
  auto folder = make_folder(true);
  const LoaderOptions o = options_for(SampleType::fp32);
  const auto host = host_samples(folder->dataset, o);
  std::map<std::string, DecodeFailure> host_skipped;
  {
    auto loader = Loader::start(folder->dataset, o);
    ASSERT_TRUE(loader);
    for (auto b = (*loader)->next(); b && *b; b = (*loader)->next()) {
    }
    for (const SkippedFile& f : (*loader)->skipped()) host_skipped[f.path.filename()] = f.failure;
  }

  GpuDecoderOptions g;
  g.pixels = GetParam();
  auto gpu = GpuDecoder::open(g);
  ASSERT_TRUE(gpu) << gpu.status().message();
  std::printf("GPU decoder: %s\n", (*gpu)->name().c_str());
  LoaderOptions read = o;
  read.stage = Stage::read;
  read.keep_files = true;
  auto loader = Loader::start(folder->dataset, read);
  ASSERT_TRUE(loader);
  std::map<std::string, DecodeFailure> gpu_skipped;
  std::size_t compared = 0;
  int host_decoded = 0;
  double sum = 0;
  double worst = 0;
  std::size_t values = 0;
  const std::size_t size = sample_bytes(o.augment);
  for (auto b = (*loader)->next(); b && *b; b = (*loader)->next()) {
    auto done = (*gpu)->process(**b, folder->dataset.samples, o, Stage::augment);
    ASSERT_TRUE(done) << done.status().message();
    host_decoded += done->host_decoded;
    for (const SkippedFile& f : done->skipped) gpu_skipped[f.path.filename()] = f.failure;
    std::vector<std::byte> bytes(static_cast<std::size_t>(done->delivered) * size);
    ASSERT_EQ(
        cudaMemcpy(bytes.data(), (*gpu)->device_batch(), bytes.size(), cudaMemcpyDeviceToHost),
        cudaSuccess);
    const auto all = floats(o.augment.type, bytes);
    for (int d = 0; d < done->delivered; ++d) {
      const std::size_t sample =
          (*b)->samples[static_cast<std::size_t>(done->positions[static_cast<std::size_t>(d)])];
      ASSERT_TRUE(host.contains(sample)) << folder->dataset.samples[sample].path;
      const std::vector<float>& want = host.at(sample);
      for (std::size_t k = 0; k < want.size(); ++k) {
        const double diff =
            std::fabs(double{all[static_cast<std::size_t>(d) * want.size() + k]} - want[k]);
        sum += diff;
        worst = std::max(worst, diff);
        ++values;
      }
      ++compared;
    }
  }
  for (const SkippedFile& f : (*loader)->skipped()) gpu_skipped[f.path.filename()] = f.failure;
  EXPECT_EQ(compared, host.size());
  EXPECT_EQ(gpu_skipped, host_skipped);
  // The progressive, grayscale and CMYK files at least go to the host's decoder.
  EXPECT_GE(host_decoded, 3);
  // nvJPEG and libjpeg-turbo differ in their inverse DCT and chroma upsampling by a level or two
  // of 255 here and there; a normalised unit is about 57 levels.
  const double mean = sum / static_cast<double>(values);
  std::printf("GPU against host: %zu samples, mean |diff| %.5f, max %.4f (normalised units)\n",
              compared, mean, worst);
  EXPECT_LT(mean, 0.03);
}

INSTANTIATE_TEST_SUITE_P(Pixels, GpuDecoderPixels,
                         ::testing::Values(GpuPixels::rgb, GpuPixels::ycbcr),
                         [](const ::testing::TestParamInfo<GpuPixels>& p) {
                           return std::string(p.param == GpuPixels::rgb ? "Rgb" : "Ycbcr");
                         });

}  // namespace
}  // namespace dlprobe::data
