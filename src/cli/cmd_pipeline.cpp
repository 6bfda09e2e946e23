// `dlprobe pipeline DIR`: how many images per second this machine's host input pipeline (read,
// JPEG decode, augmentation) delivers over a curve of worker threads, and the cores it takes to
// feed a training step; `dlprobe pipeline make-dataset DIR` writes an ImageNet-like JPEG dataset
// to measure it on.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/core/interrupt.h"
#include "dlprobe/core/units.h"
#include "dlprobe/data/make_dataset.h"
#include "dlprobe/data/throughput.h"
#include "dlprobe/device/device.h"

namespace dlprobe::cli {

namespace {

struct PipelineFlags {
  std::string dir;
  std::string threads;
  std::string stages = "decode,augment";
  std::string batch = "64";
  std::string size = "224";
  std::string dtype = "fp32";
  std::string layout = "nchw";
  std::string prefetch = "2";
  std::string seed = "0";
  std::string min_time = "3s";
  std::string step_rate;
  std::string cache;
  std::string max_pixels = "100000000";
  bool no_dct_scaling = false;
  bool no_flip = false;
  bool strict = false;
  std::string device = "cpu";
  std::string decode = "auto";
  bool cuda_decoder = false;
  std::string gpu_pixels = "rgb";
  std::string json;
  bool overwrite = false;
};

struct MakeFlags {
  std::string dir;
  std::string images = "1000";
  std::string classes = "10";
  std::string seed = "0";
  std::string quality = "90";
};

Result<data::ThroughputOptions> options_from(const PipelineFlags& f) {
  data::ThroughputOptions o;
  if (!f.threads.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(
        o.threads,
        parse_each<int>(f.threads, "--threads", [](const std::string& item) -> Result<int> {
          DLPROBE_ASSIGN_OR_RETURN(auto t, parse_int(item, "--threads", 1, 1024));
          return static_cast<int>(t);
        }));
  }
  DLPROBE_ASSIGN_OR_RETURN(
      o.stages, parse_each<data::Stage>(f.stages, "--stages", [](const std::string& name) {
        return for_flag("--stages", data::parse_stage(name));
      }));
  data::LoaderOptions& l = o.loader;
  DLPROBE_ASSIGN_OR_RETURN(auto batch, parse_int(f.batch, "--batch", 1, 65536));
  l.batch_size = static_cast<int>(batch);
  DLPROBE_ASSIGN_OR_RETURN(auto size, parse_int(f.size, "--size", 1, 8192));
  l.augment.size = static_cast<int>(size);
  DLPROBE_ASSIGN_OR_RETURN(l.augment.type, for_flag("--dtype", data::parse_sample_type(f.dtype)));
  DLPROBE_ASSIGN_OR_RETURN(l.augment.layout,
                           for_flag("--layout", data::parse_sample_layout(f.layout)));
  DLPROBE_ASSIGN_OR_RETURN(auto prefetch, parse_int(f.prefetch, "--prefetch", 1, 64));
  l.prefetch = static_cast<int>(prefetch);
  DLPROBE_ASSIGN_OR_RETURN(auto seed, parse_int(f.seed, "--seed", 0, INT64_MAX));
  l.seed = static_cast<std::uint64_t>(seed);
  DLPROBE_ASSIGN_OR_RETURN(o.min_time, parse_duration(f.min_time, "--min-time"));
  if (o.min_time.count() <= 0) return invalid_argument("--min-time: must be longer than 0");
  if (!f.step_rate.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto rate, parse_int(f.step_rate, "--step-rate", 1, 100'000'000));
    o.step_rate = static_cast<double>(rate);
  }
  if (!f.cache.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(l.cache_bytes, parse_size(f.cache, "--cache"));
  }
  DLPROBE_ASSIGN_OR_RETURN(auto pixels, parse_int(f.max_pixels, "--max-pixels", 1, INT64_MAX));
  l.limits.max_pixels = static_cast<std::uint64_t>(pixels);
  l.dct_scaling = !f.no_dct_scaling;
  l.augment.flip = !f.no_flip;
  l.strict = f.strict;
  DLPROBE_ASSIGN_OR_RETURN(auto where, for_flag("--device", device::parse_device(f.device)));
  if (f.decode != "auto" && f.decode != "gpu" && f.decode != "cpu") {
    return invalid_argument(
        fmt::format("--decode: unknown choice '{}' (gpu, cpu or auto)", f.decode));
  }
  const bool on_gpu = where.kind == DeviceKind::cuda && f.decode != "cpu";
  if (f.decode == "gpu" && where.kind != DeviceKind::cuda) {
    return invalid_argument("--decode gpu: needs --device cuda:N");
  }
  if (f.cuda_decoder && !on_gpu) {
    return invalid_argument("--cuda-decoder: only with --device cuda:N, decoding on the GPU");
  }
  DLPROBE_ASSIGN_OR_RETURN(const data::GpuPixels planes,
                           parse_gpu_pixels(f.gpu_pixels, "--gpu-pixels", on_gpu,
                                            "--device cuda:N with --decode gpu or auto"));
  if (on_gpu) {
    data::GpuDecoderOptions g;
    g.device = where.index;
    g.hardware = !f.cuda_decoder;
    g.pixels = planes;
    o.gpu = g;
  } else if (where.kind == DeviceKind::cuda) {
    o.upload_device = where.index;
  }
  return o;
}

int run_make_dataset(const MakeFlags& f) {
  data::MakeDatasetOptions o;
  auto images = parse_int(f.images, "--images", 1, 100'000'000);
  if (!images) return report_error(images.status());
  o.images = *images;
  auto classes = parse_int(f.classes, "--classes", 1, 100000);
  if (!classes) return report_error(classes.status());
  o.classes = static_cast<int>(*classes);
  if (o.classes > o.images) {
    return report_error(invalid_argument(
        fmt::format("--classes: {} is more than --images {} (each class holds at least one image)",
                    o.classes, o.images)));
  }
  auto seed = parse_int(f.seed, "--seed", 0, INT64_MAX);
  if (!seed) return report_error(seed.status());
  o.seed = static_cast<std::uint64_t>(*seed);
  auto quality = parse_int(f.quality, "--quality", 1, 100);
  if (!quality) return report_error(quality.status());
  o.quality = static_cast<int>(*quality);
  auto made = data::make_dataset(f.dir, o);
  if (!made) return report_error(made.status());
  std::printf(
      "wrote %s: %lld images in %d classes, %s, mean %.0f x %.0f pixels, %.3f bytes/pixel "
      "at quality %d\n",
      f.dir.c_str(), static_cast<long long>(made->images), o.classes,
      format_size(made->bytes).c_str(), made->mean_width, made->mean_height,
      made->bytes_per_pixel(), o.quality);
  return kExitOk;
}

int run_pipeline(const PipelineFlags& f) {
  if (f.dir.empty()) {
    return report_error(invalid_argument("pipeline: name the dataset folder (DIR) to measure"));
  }
  if (Status s = prepare_outputs({{"--json", f.json}}, f.overwrite); !s) return report_error(s);
  auto options = options_from(f);
  if (!options) return report_error(options.status());
  auto dataset = data::list_dataset(f.dir);
  if (!dataset) return report_error(dataset.status());
  options->on_point = [](const data::ThroughputPoint& p) {
    std::fprintf(stderr, "dlprobe: %s, %d thread(s): %s img/s\n",
                 std::string(data::stage_name(p.stage)).c_str(), p.threads,
                 format_grouped(p.images_per_second(), 1).c_str());
  };
  // Ctrl-C, SIGTERM or SIGHUP: the point being measured finishes, and the points measured are
  // printed and written.
  InterruptGuard guard;
  options->interrupt = guard.flag();
  auto report = data::measure_throughput(*dataset, *options);
  if (!report) return report_error(report.status());
  const std::string text = data::render_text(*report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (!f.json.empty()) {
    if (Status s = write_file_atomic(f.json, data::to_json(*report).dump(2) + "\n"); !s) {
      return report_error(s);
    }
  }
  if (report->interrupted) {
    std::fputs("dlprobe pipeline: interrupted; the points measured are above\n", stderr);
    return kExitFailure;
  }
  // A stage that decoded no image (every file it met skipped) measured nothing: its 0 img/s are
  // kept above, and the run fails, as a training run on such data would.
  const auto empty = std::find_if(
      report->points.begin(), report->points.end(),
      [](const data::ThroughputPoint& p) { return p.stage != data::Stage::read && p.images == 0; });
  if (empty != report->points.end() && !report->skipped.empty()) {
    const data::SkippedFile& first = report->skipped.front();
    return report_error(
        invalid_argument(fmt::format("{}: {} gave no image ({} file(s) skipped; the first, {}: {})",
                                     f.dir, data::stage_name(empty->stage), report->skipped.size(),
                                     first.path.string(), first.message)));
  }
  return kExitOk;
}

}  // namespace

Command add_pipeline_command(CLI::App& app) {
  auto flags = std::make_shared<PipelineFlags>();
  auto make = std::make_shared<MakeFlags>();
  CLI::App* sub = app.add_subcommand(
      "pipeline",
      "Measure the input pipeline (read, JPEG decode, augmentation) on a JPEG dataset, on the "
      "host's cores or on a GPU");
  sub->add_option("dir", flags->dir,
                  "Dataset folder: class subfolders of JPEGs (ImageFolder) or a folder of JPEGs");
  add_text_options<PipelineFlags>(
      *sub, *flags,
      {{"--threads", &PipelineFlags::threads,
        "Worker thread counts to measure, e.g. 1,2,4 (default: the powers of 2 up to the cores)"},
       {"--stages", &PipelineFlags::stages,
        "Stages to measure: read, decode (full size), augment (the whole host pipeline)"},
       {"--step-rate", &PipelineFlags::step_rate,
        "Images per second the training step takes: say how many cores feed it"},
       {"--cache", &PipelineFlags::cache,
        "Keep decoded images in memory up to this size (e.g. 4GiB); images then decode at full "
        "size"}});
  option(*sub, "--batch", flags->batch, "Images per batch");
  option(*sub, "--size", flags->size, "Output size (RandomResizedCrop to SIZE x SIZE)");
  option(*sub, "--dtype", flags->dtype, "Output element type: fp32, fp16 or bf16");
  option(*sub, "--layout", flags->layout, "Output layout: nchw or nhwc");
  option(*sub, "--prefetch", flags->prefetch, "Batches in flight per worker");
  option(*sub, "--seed", flags->seed, "Seed of the shuffles, crops and flips");
  option(*sub, "--min-time", flags->min_time, "Time each point for at least this long");
  option(*sub, "--max-pixels", flags->max_pixels,
         "Refuse (skip) an image whose header claims more pixels than this");
  sub->add_flag("--no-dct-scaling", flags->no_dct_scaling,
                "Decode every image at full size (by default at the smallest DCT scale that "
                "covers the crop at the output size)");
  sub->add_flag("--no-flip", flags->no_flip, "No random horizontal flip");
  sub->add_flag("--strict", flags->strict,
                "Stop at the first file that gives no image (by default it is skipped and listed)");
  option(*sub, "--device", flags->device,
         "Where the batches go: cpu, or cuda:N (decoded and augmented there by nvJPEG and a "
         "kernel, the threads reading the files; or with --decode cpu, made on the threads and "
         "copied there)");
  option(*sub, "--decode", flags->decode,
         "With --device cuda:N: gpu (nvJPEG and a kernel), cpu (libjpeg-turbo on the threads, "
         "each batch then copied to the device from page-locked memory), or auto: gpu");
  sub->add_flag("--cuda-decoder", flags->cuda_decoder,
                "On the GPU, decode with nvJPEG's CUDA decoder even where the GPU has a hardware "
                "JPEG engine");
  option(*sub, "--gpu-pixels", flags->gpu_pixels, kGpuPixelsHelp);
  sub->add_option("--json", flags->json, "Write the results as JSON (schema dlprobe.pipeline/1)");
  add_overwrite_flag(*sub, flags->overwrite);

  CLI::App* maker =
      sub->add_subcommand("make-dataset",
                          "Write an ImageNet-like JPEG dataset (sizes, aspect ratios, bytes per "
                          "pixel at quality 90) in class folders");
  maker->add_option("dir", make->dir, "Folder to write (new or empty)")->required();
  option(*maker, "--images", make->images, "Number of images");
  option(*maker, "--classes", make->classes, "Number of class folders");
  option(*maker, "--seed", make->seed, "Seed: the same seed writes the same files");
  option(*maker, "--quality", make->quality, "JPEG quality");

  Command command;
  command.app = sub;
  command.run = [flags, make, maker]() -> int {
    if (maker->parsed()) return run_make_dataset(*make);
    return run_pipeline(*flags);
  };
  return command;
}

}  // namespace dlprobe::cli
