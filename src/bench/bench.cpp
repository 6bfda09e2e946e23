#include "dlprobe/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>

#include "dlprobe/reference_backend.h"
#include "dlprobe/safetensors.h"
#include "dlprobe/units.h"

#ifdef DLPROBE_HAVE_CUDA_BACKEND
#include "core/cuda_check.h"
#include "dlprobe/cuda_backend.h"
#endif

namespace dlprobe::bench {
namespace {

struct Engine {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
};

Result<Engine> make_engine(const BenchOptions& o) {
  Engine e;
  if (o.device.kind == DeviceKind::cpu) {
    DLPROBE_ASSIGN_OR_RETURN(e.allocator, memory::CachingAllocator::create(
                                              std::make_unique<memory::HostMemorySource>()));
    DLPROBE_ASSIGN_OR_RETURN(
        e.backend, make_reference_backend(
                       o.step.precision == engine::Precision::fp64 ? DType::fp64 : DType::fp32));
    return e;
  }
#ifdef DLPROBE_HAVE_CUDA_BACKEND
  if (o.step.precision == engine::Precision::fp64) {
    return error(Errc::unsupported, "precision fp64 runs on --device cpu only");
  }
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<memory::MemorySource> source,
                           memory::make_cuda_memory_source(o.device.index));
  if (o.step.precision == engine::Precision::bf16) {
    int major = 0;
    int minor = 0;
    DLPROBE_CUDA_CHECK(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, o.device.index));
    DLPROBE_CUDA_CHECK(
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, o.device.index));
    // bf16 tensor cores (and cuDNN's bf16 convolutions) start with Ampere.
    if (major < 8) {
      return error(Errc::unsupported,
                   fmt::format("precision bf16 needs compute capability 8.0 or newer; {} has {}.{}",
                               device_name(o.device), major, minor));
    }
  }
  DLPROBE_ASSIGN_OR_RETURN(e.allocator, memory::CachingAllocator::create(std::move(source)));
  CudaBackendOptions cuda;
  cuda.conv_engine = o.conv.autotune ? ConvEngineChoice::autotune : ConvEngineChoice::heuristic;
  cuda.deterministic = o.conv.engines != ConvEngines::any;
  cuda.transform_engines = o.conv.engines == ConvEngines::any;
  cuda.math_mode =
      o.step.precision == engine::Precision::tf32 ? MathMode::tf32 : MathMode::strict_fp32;
  DLPROBE_ASSIGN_OR_RETURN(e.backend, make_cuda_backend(o.device.index, *e.allocator, cuda));
  return e;
#else
  return error(Errc::unavailable,
               fmt::format("{}: this build has no CUDA backend (configured without "
                           "DLPROBE_WITH_CUDA); use --device cpu",
                           device_name(o.device)));
#endif
}

}  // namespace

Result<Device> parse_device(std::string_view text, std::string_view flag) {
  if (text == "cpu") return Device{DeviceKind::cpu, 0};
  if (text == "cuda") return Device{DeviceKind::cuda, 0};
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() &&
        index >= 0) {
      return Device{DeviceKind::cuda, index};
    }
  }
  return invalid_argument(
      fmt::format("{}: unknown device '{}' (expected cpu, cuda or cuda:N)", flag, text));
}

Result<ConvEngines> parse_conv_engines(std::string_view text, std::string_view flag) {
  if (text == "any") return ConvEngines::any;
  if (text == "deterministic") return ConvEngines::deterministic;
  if (text == "exact") return ConvEngines::exact;
  return invalid_argument(
      fmt::format("{}: unknown choice '{}' (expected any, deterministic or exact)", flag, text));
}

std::string device_name(const Device& d) {
  return d.kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{}", d.index);
}

Result<BenchResult> run_bench(const BenchOptions& o) {
  if (o.steps < 1) return invalid_argument(fmt::format("steps must be >= 1, got {}", o.steps));
  if (o.warmup < 0) return invalid_argument(fmt::format("warmup must be >= 0, got {}", o.warmup));
  if (o.profile_steps < 0) {
    return invalid_argument(fmt::format("profile steps must be >= 0, got {}", o.profile_steps));
  }
  // A missing or unreadable weights file is reported before any memory is taken.
  safetensors::File weights;
  if (!o.weights.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(weights, safetensors::read_file(o.weights));
  }
  DLPROBE_ASSIGN_OR_RETURN(Engine e, make_engine(o));
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<engine::TrainingStep> step,
                           engine::TrainingStep::create(o.step, *e.backend, *e.allocator));
  if (!o.weights.empty()) {
    const Status loaded = step->load_state_dict(weights);
    if (!loaded.is_ok()) return loaded.with_context(o.weights);
  }
  const engine::StepConfig& c = o.step;
  const Shape image_shape{c.batch, 3, c.model.image_size, c.model.image_size};
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc image_desc, TensorDesc::make(image_shape, DType::fp32));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc label_desc, TensorDesc::make(Shape{c.batch}, DType::int64));
  const HostTensor images = HostTensor::random(image_desc, o.data_seed, -2.0, 2.0);
  const HostTensor labels =
      HostTensor::random(label_desc, o.data_seed + 1, 0.0, static_cast<double>(c.model.classes));
  DLPROBE_RETURN_IF_ERROR(step->set_input(images, labels));

  for (std::int64_t i = 0; i < o.warmup; ++i) DLPROBE_RETURN_IF_ERROR(step->run_step().status());
  DLPROBE_RETURN_IF_ERROR(e.backend->synchronize());
  e.allocator->reset_peak_stats();

  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < o.steps; ++i) DLPROBE_RETURN_IF_ERROR(step->enqueue());
  DLPROBE_ASSIGN_OR_RETURN(engine::StepResult last, step->collect());
  const auto stop = std::chrono::steady_clock::now();

  BenchResult r;
  r.backend = std::string(e.backend->name());
  r.elapsed_seconds = std::chrono::duration<double>(stop - start).count();
  r.images_per_second = static_cast<double>(c.batch * o.steps) / std::max(r.elapsed_seconds, 1e-9);
  r.last = last;
  r.memory = e.allocator->stats();
  if (o.profile_steps > 0) {
    std::vector<std::vector<double>> runs;
    for (std::int64_t i = 0; i < o.profile_steps; ++i) {
      DLPROBE_ASSIGN_OR_RETURN(std::vector<double> ms, step->profile_step());
      runs.push_back(std::move(ms));
    }
    const std::vector<engine::Call>& calls = step->calls();
    for (std::size_t k = 0; k < calls.size(); ++k) {
      std::vector<double> v;
      for (const auto& run : runs) v.push_back(run[k]);
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      r.profile.push_back({calls[k].name, calls[k].kind, v[v.size() / 2]});
    }
  }
  return r;
}

}  // namespace dlprobe::bench
