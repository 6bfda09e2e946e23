#include "bench_common.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "dlprobe/core/units.h"
#include "dlprobe/data/cuda_queues.h"
#include "dlprobe/device/availability.h"
#include "dlprobe/device/conv_options.h"

namespace dlprobe::cli {

void add_tuning_flags(CLI::App& sub, TuningFlags& flags) {
  sub.add_option("--conv-algo", flags.algo,
                 "cuDNN engine per convolution shape: heuristic (cuDNN's first choice), autotune "
                 "(time the engines cuDNN's heuristics list, keep the fastest, as "
                 "cudnn.benchmark, or one without workspace within 3 % of it) or exhaustive "
                 "(also every other engine, within 0.4 s a shape)")
      ->capture_default_str();
  sub.add_option("--tuning-cache", flags.cache,
                 "Keep autotuned choices in this JSON file and start from those it holds for "
                 "this GPU and cuDNN (runs that share it run the same engines)");
}

Result<engine::OptimizerKind> workload_optimizer(const WorkloadFlags& flags, bool trains) {
  if (flags.optimizer_given && !trains) {
    return invalid_argument("--optimizer: only with --mode train (the optimizer's update)");
  }
  return for_flag("--optimizer", engine::parse_optimizer(flags.optimizer));
}

Result<Tuning> tuning_options(const TuningFlags& flags) {
  Tuning t;
  DLPROBE_ASSIGN_OR_RETURN(t.algo, for_flag("--conv-algo", device::parse_conv_algo(flags.algo)));
  if (is_stdout_path(flags.cache)) {
    return invalid_argument(
        "--tuning-cache -: the cache is a file read and rewritten, which standard output is not");
  }
  if (flags.cache.empty()) {
    t.cache = std::make_shared<ConvTuningCache>();
  } else {
    auto cache = ConvTuningCache::open(flags.cache);
    if (!cache) return cache.status().with_context("--tuning-cache");
    t.cache = std::move(cache).value();
  }
  return t;
}
Result<double> parse_seconds(const std::string& text, std::string_view flag) {
  DLPROBE_ASSIGN_OR_RETURN(const std::chrono::nanoseconds d, parse_duration(text, flag));
  if (d.count() < 0) return invalid_argument(fmt::format("{}: must not be negative", flag));
  return std::chrono::duration<double>(d).count();
}

void add_model_flag(CLI::App& sub, std::string& model, std::string_view more) {
  sub.add_option(
         "--model", model,
         more.empty() ? model::arch_names() : fmt::format("{} ({})", model::arch_names(), more))
      ->capture_default_str();
}

void add_recompute_flag(CLI::App& sub, std::string& recompute) {
  option(sub, "--recompute", recompute,
         "block-outputs: keep no residual block's output for the backward pass, which "
         "computes each again from what it keeps anyway (batch norm inside the convolutions: "
         "fp16, bf16 and tf32 NHWC on a GPU), nor, where a block's input is kept, its "
         "projection shortcut's convolution output, which it runs again, nor the images' "
         "reduced-precision cast; about a third fewer activations for one more elementwise pass "
         "a block (and in ResNet-50 two 1x1 convolutions); none: keep them");
}

Status parse_recompute(const std::string& text, engine::StepConfig& step) {
  if (text != "none" && text != "block-outputs") {
    return invalid_argument(
        fmt::format("--recompute: unknown choice '{}' (expected none or block-outputs)", text));
  }
  step.recompute_block_outputs = text == "block-outputs";
  return Status::ok();
}

void add_device_flags(CLI::App& sub, DeviceFlags& flags, std::string_view reference_note) {
  option(sub, "--device", flags.device,
         "auto (the first usable GPU, else the CPU; said on stderr), cpu or cuda:N");
  sub.add_option(
         "--backend", flags.backend,
         fmt::format("auto (cuda on a GPU, oneDNN on the CPU where built), cuda, onednn, or "
                     "reference (plain loops: {})",
                     reference_note))
      ->capture_default_str();
}

Result<DeviceChoice> device_choice(const DeviceFlags& flags) {
  DeviceChoice c;
  const device::GpuAvailability gpus = device::explain_gpus(device::gather_gpu_facts());
  if (flags.device != "auto") {
    DLPROBE_ASSIGN_OR_RETURN(c.device, for_flag("--device", device::parse_device(flags.device)));
  } else if (flags.backend != "auto") {
    // A named backend runs on one kind of device; its refusals below name --backend.
    c.device = flags.backend == "cuda" ? device::Device{DeviceKind::cuda, 0} : device::Device{};
  } else {
    c.device = device::default_device(gpus);
  }
  if (Status usable = device::check_device(c.device, gpus); !usable) {
    return usable.with_context(flags.device == "auto" ? "--backend cuda" : "--device");
  }
  // With --backend auto the device alone chose the backend, so a backend this build lacks is the
  // device's fault.
  DLPROBE_ASSIGN_OR_RETURN(c.backend, for_flag(flags.backend == "auto" ? "--device" : "--backend",
                                               device::parse_backend(flags.backend, c.device)));
  if (flags.device == "auto") {
    c.picked = fmt::format("device {}, {} backend; {}", device::device_name(c.device),
                           device::backend_kind_name(c.backend),
                           gpus.devices > 0 ? std::string("the first usable GPU")
                                            : fmt::format("no usable GPU: {}", gpus.why_none));
  }
  return c;
}

Result<DeviceChoice> noted_device_choice(const DeviceFlags& flags, std::string_view command) {
  DLPROBE_ASSIGN_OR_RETURN(DeviceChoice choice, device_choice(flags));
  if (!choice.picked.empty()) {
    std::fprintf(stderr, "dlprobe %.*s: %s\n", static_cast<int>(command.size()), command.data(),
                 choice.picked.c_str());
  }
  return choice;
}

std::vector<std::string> given_options(const CLI::App& sub,
                                       std::initializer_list<std::string_view> names) {
  std::vector<std::string> given;
  for (const std::string_view name : names) {
    if (sub.count(std::string(name)) > 0) given.emplace_back(name);
  }
  return given;
}

void warn_cuda_only(std::string_view command, device::BackendKind backend,
                    const std::vector<std::string>& given) {
  if (backend == device::BackendKind::cuda) return;
  for (const std::string& name : given) {
    std::fputs(fmt::format("dlprobe {}: {} has no effect on the {} backend (the CUDA backend's "
                           "option)\n",
                           command, name, device::backend_kind_name(backend))
                   .c_str(),
               stderr);
  }
}

void add_shape_flags(CLI::App& sub, ShapeFlags& flags) {
  option(sub, "--image-size", flags.image_size, "Square image side");
  option(sub, "--classes", flags.classes, "Output classes");
  option(sub, "--width", flags.width,
         "Channels of the stem, doubled by each later stage (torchvision: 64); a narrower model "
         "does a fraction of the work");
}

Status parse_shape(const ShapeFlags& flags, model::ModelConfig& model) {
  DLPROBE_ASSIGN_OR_RETURN(model.image_size,
                           parse_int(flags.image_size, "--image-size", 1, 1 << 16));
  DLPROBE_ASSIGN_OR_RETURN(model.classes, parse_int(flags.classes, "--classes", 1, 1 << 24));
  DLPROBE_ASSIGN_OR_RETURN(model.width, parse_int(flags.width, "--width", 1, 4096));
  return Status::ok();
}

namespace {

std::string eta_text(const std::optional<double>& s) {
  if (!s) return "ETA ?";
  return "ETA " + format_duration(std::chrono::nanoseconds(static_cast<std::int64_t>(*s * 1e9)));
}

}  // namespace

ProgressLine::ProgressLine(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}

void ProgressLine::clear() {
  if (drawn_) {
    std::fputs("\r\033[K", stderr);
    drawn_ = false;
  }
}

void ProgressLine::update(const bench::SweepProgress& p) {
  if (quiet_ || !tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  std::string what;
  switch (p.step.phase) {
    case bench::Progress::Phase::planning:
      what = "planning";
      break;
    case bench::Progress::Phase::warmup:
      what = fmt::format("warm-up step {}", p.step.steps);
      break;
    case bench::Progress::Phase::timing:
      what = fmt::format("window {} step {}, ~{} img/s", p.step.window + 1, p.step.steps,
                         format_grouped(p.step.images_per_s, 1));
      break;
  }
  std::string line =
      fmt::format("[{}/{}] {}: {}, {}", p.index, p.planned, p.label, what, eta_text(p.eta_s));
  // A line wider than the terminal wraps, and "\r" would then redraw only its last part.
  winsize size{};
  const std::size_t columns =
      ::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1 ? size.ws_col - 1 : 100;
  if (line.size() > columns) line.resize(columns);
  std::fputs("\r\033[K", stderr);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::finished(std::size_t index, std::size_t planned,
                            const results::Configuration& c) {
  if (quiet_) return;
  clear();
  const std::string label = results::describe(c.kind, c.settings);
  std::string result;
  if (c.statistics) {
    const stats::Summary& s = *c.statistics;
    result = fmt::format("{} img/s ({:.0f}% CI {} - {}), {} steps", format_grouped(s.throughput, 1),
                         s.ci_level * 100, format_grouped(s.throughput_ci.low, 1),
                         format_grouped(s.throughput_ci.high, 1), s.steps);
  }
  if (c.status != results::RunStatus::ok) {
    result += fmt::format("{}{}: {}", result.empty() ? "" : "; ",
                          results::run_status_name(c.status), c.error);
  }
  std::fprintf(stderr, "[%zu/%zu] %s: %s\n", index, planned, label.c_str(), result.c_str());
  std::fflush(stderr);
}

bench::SweepCallbacks ProgressLine::sweep_callbacks() {
  bench::SweepCallbacks callbacks;
  callbacks.progress = [this](const bench::SweepProgress& p) { update(p); };
  callbacks.done = [this](const std::vector<results::Configuration>& configurations,
                          std::size_t planned) {
    finished(configurations.size(), planned, configurations.back());
    return Status::ok();
  };
  return callbacks;
}

void ProgressLine::note(const std::string& text) {
  if (quiet_) return;
  clear();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

int sweep_exit_code(const Status& status, const bench::SweepOutcome& outcome, ProgressLine& line,
                    std::string_view interrupted_note, bool single) {
  if (!status) return report_error(status);
  if (outcome.interrupted) {
    line.note(std::string(interrupted_note));
    return kExitFailure;
  }
  if (single) {
    const results::Configuration& c = outcome.configurations.front();
    if (c.status != results::RunStatus::ok) return report_error(error(Errc::internal, c.error));
    return kExitOk;
  }
  return outcome.incomplete > 0 ? kExitFailure : kExitOk;
}

void add_data_flags(CLI::App& sub, DataFlags& flags) {
  option(sub, "--data", flags.dir,
         "Also train each configuration from this JPEG dataset (class folders, or a folder of "
         "JPEGs), beside the synthetic batch: img/s from JPEGs and whether the input binds");
  option(sub, "--data-threads", flags.threads,
         "Loader threads for --data (0: every CPU this process may use)");
  option(sub, "--data-decode", flags.decode,
         "Where --data decodes: gpu (nvJPEG and a kernel; the threads read), cpu (libjpeg-turbo "
         "on the threads), or auto: gpu on a CUDA device");
  option(sub, "--data-gpu-pixels", flags.gpu_pixels, kGpuPixelsHelp);
}

void prepare_data_decode(const DataFlags& flags) {
  // Before the device is resolved (which may call CUDA): `auto` may still decode on the host, where
  // more queues change nothing the step does.
  if (!flags.dir.empty() && flags.decode != "cpu") data::widen_cuda_queues();
}

Result<std::optional<bench::JpegInput>> data_input(const DataFlags& flags,
                                                   const device::Device& device) {
  if (flags.dir.empty()) {
    if (flags.threads != "0" || flags.decode != "auto" || flags.gpu_pixels != "rgb") {
      return invalid_argument(
          "--data-threads, --data-decode and --data-gpu-pixels: only with --data DIR");
    }
    return std::optional<bench::JpegInput>();
  }
  bench::JpegInput in;
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t threads,
                           parse_int(flags.threads, "--data-threads", 0, 1024));
  in.threads = static_cast<int>(threads);
  if (flags.decode == "gpu") {
    if (device.kind != DeviceKind::cuda) {
      return invalid_argument("--data-decode gpu: needs a CUDA --device");
    }
    in.gpu_decode = true;
  } else if (flags.decode == "cpu") {
    in.gpu_decode = false;
  } else if (flags.decode == "auto") {
    in.gpu_decode = device.kind == DeviceKind::cuda;
  } else {
    return invalid_argument(
        fmt::format("--data-decode: unknown choice '{}' (gpu, cpu or auto)", flags.decode));
  }
  DLPROBE_ASSIGN_OR_RETURN(in.gpu_pixels,
                           parse_gpu_pixels(flags.gpu_pixels, "--data-gpu-pixels", in.gpu_decode,
                                            "a CUDA --device with --data-decode gpu or auto"));
  DLPROBE_ASSIGN_OR_RETURN(in.dataset, for_flag("--data", data::list_dataset(flags.dir)));
  return std::optional<bench::JpegInput>(std::move(in));
}

}  // namespace dlprobe::cli
