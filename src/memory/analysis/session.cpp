// Measuring a step's memory on a device: one backend, allocator and NVML handle for many runs.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "dlprobe/log.h"
#include "dlprobe/memory_analysis.h"
#include "dlprobe/nvml.h"
#include "dlprobe/reference_backend.h"
#include "dlprobe/units.h"

#ifdef DLPROBE_HAVE_ONEDNN_BACKEND
#include "dlprobe/cpu_backend.h"
#endif
#ifdef DLPROBE_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>

#include "dlprobe/cuda_backend.h"
#endif

namespace dlprobe::memory {

Result<Device> parse_device(std::string_view text, std::string_view flag) {
  if (text == "cpu") return Device{BackendKind::reference, 0};
  if (text == "cpu:onednn") return Device{BackendKind::onednn, 0};
  if (text == "cuda") return Device{BackendKind::cuda, 0};
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() &&
        index >= 0) {
      return Device{BackendKind::cuda, index};
    }
  }
  return invalid_argument(fmt::format(
      "{}: unknown device '{}' (expected cpu, cpu:onednn, cuda or cuda:N)", flag, text));
}

std::string device_name(const Device& device) {
  switch (device.backend) {
    case BackendKind::reference:
      return "cpu";
    case BackendKind::onednn:
      return "cpu:onednn";
    case BackendKind::cuda:
      return fmt::format("cuda:{}", device.index);
  }
  return "?";
}

Result<std::int64_t> nvml_process_used_bytes(const nvml::Library& nvml, unsigned index,
                                             unsigned pid) {
  DLPROBE_ASSIGN_OR_RETURN(std::vector<nvml::ProcessMemory> processes, nvml.processes(index));
  for (const nvml::ProcessMemory& p : processes) {
    if (p.pid != pid) continue;
    if (!p.used_bytes) {
      return error(Errc::unavailable,
                   fmt::format("NVML lists process {} on GPU {} without its memory", pid, index));
    }
    return static_cast<std::int64_t>(*p.used_bytes);
  }
  return error(Errc::not_found, fmt::format("NVML does not list process {} on GPU {}", pid, index));
}

struct Session::Impl {
  SessionOptions options;
  std::string label;
  // Declared before the backend, which holds a reference to it: destroyed after.
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  DType reference_compute = DType::fp32;
  std::shared_ptr<nvml::Library> nvml;
  std::optional<unsigned> nvml_index;
  std::optional<std::uint64_t> device_used_before;  // NVML, before this process's context
  std::optional<std::int64_t> context;

  bool on_gpu() const { return options.device.backend == BackendKind::cuda; }

  // NVML's figure for this process, or the device's growth since start-up when NVML does not
  // list the pid; the second says which.
  std::optional<std::pair<std::int64_t, std::string>> nvml_reading() const {
    if (!nvml || !nvml_index) return std::nullopt;
    Result<std::int64_t> used =
        nvml_process_used_bytes(*nvml, *nvml_index, static_cast<unsigned>(getpid()));
    if (used) return std::make_pair(*used, std::string("process"));
    if (!device_used_before) return std::nullopt;
    Result<nvml::DeviceSample> sample = nvml->sample(*nvml_index);
    if (!sample || !sample->mem_used_bytes) return std::nullopt;
    return std::make_pair(static_cast<std::int64_t>(*sample->mem_used_bytes) -
                              static_cast<std::int64_t>(*device_used_before),
                          std::string("device"));
  }

  Status make_backend(engine::Precision precision) {
    const BackendKind kind = options.device.backend;
    if (kind == BackendKind::reference) {
      const DType compute = precision == engine::Precision::fp64 ? DType::fp64 : DType::fp32;
      if (backend && compute == reference_compute) return Status::ok();
      DLPROBE_ASSIGN_OR_RETURN(backend, make_reference_backend(compute));
      reference_compute = compute;
      return Status::ok();
    }
    if (precision == engine::Precision::fp64 && kind == BackendKind::cuda) {
      return error(Errc::unsupported, "precision fp64 runs on --device cpu only");
    }
    if (backend) return Status::ok();
    if (kind == BackendKind::onednn) {
#ifdef DLPROBE_HAVE_ONEDNN_BACKEND
      DLPROBE_ASSIGN_OR_RETURN(backend, make_cpu_backend(*allocator));
      return Status::ok();
#else
      return error(Errc::unavailable,
                   "cpu:onednn: this build has no oneDNN backend (configured without "
                   "DLPROBE_WITH_ONEDNN); use --device cpu");
#endif
    }
#ifdef DLPROBE_HAVE_CUDA_BACKEND
    CudaBackendOptions cuda;
    cuda.conv_engine = options.autotune ? ConvEngineChoice::autotune : ConvEngineChoice::heuristic;
    cuda.deterministic = options.deterministic;
    DLPROBE_ASSIGN_OR_RETURN(backend, make_cuda_backend(options.device.index, *allocator, cuda));
    return Status::ok();
#else
    return error(Errc::unavailable,
                 fmt::format("{}: this build has no CUDA backend (configured without "
                             "DLPROBE_WITH_CUDA); use --device cpu",
                             memory::device_name(options.device)));
#endif
  }

#ifdef DLPROBE_HAVE_CUDA_BACKEND
  // Names the GPU, and finds its NVML index (the two may number GPUs differently) by PCI bus id.
  void describe_gpu() {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, options.device.index) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    label = fmt::format("{} ({})", memory::device_name(options.device), p.name);
    if (!nvml) return;
    const std::string bus =
        fmt::format("{:08X}:{:02X}:{:02X}.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    Result<unsigned> count = nvml->device_count();
    for (unsigned i = 0; count && i < *count; ++i) {
      Result<nvml::DeviceInfo> info = nvml->device_info(i);
      if (!info) continue;
      std::string id;
      for (char c : info->pci_bus_id) {
        id += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      }
      if (id == bus) nvml_index = i;
    }
  }
#endif
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::open(const SessionOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->label = memory::device_name(options.device);
  if (options.device.backend == BackendKind::reference) impl->label = "cpu (reference)";
  if (options.device.backend == BackendKind::onednn) impl->label = "cpu (oneDNN)";
  if (impl->on_gpu()) {
    impl->nvml = options.nvml;
    if (!impl->nvml) {
      Result<std::shared_ptr<nvml::Library>> lib = nvml::Library::open();
      if (lib) {
        impl->nvml = std::move(lib).value();
      } else {
        log_warn("NVML: {}; no reconciliation with the driver's figures", lib.status().message());
      }
    }
  }
  // Every device's used memory before this process makes a context: the fallback when NVML does
  // not list our pid.
  std::vector<std::optional<std::uint64_t>> used_before;
  if (impl->nvml) {
    Result<unsigned> count = impl->nvml->device_count();
    for (unsigned i = 0; count && i < *count; ++i) {
      Result<nvml::DeviceSample> s = impl->nvml->sample(i);
      used_before.push_back(s ? s->mem_used_bytes : std::nullopt);
    }
  }

  std::unique_ptr<MemorySource> source;
  if (impl->on_gpu()) {
    DLPROBE_ASSIGN_OR_RETURN(source, make_cuda_memory_source(options.device.index));
  } else {
    source = std::make_unique<HostMemorySource>();
  }
  AllocatorOptions allocator = options.allocator;
  // Measured below; the limit holds the allocator alone until then.
  if (allocator.mode == Mode::limit) allocator.overhead_bytes = 0;
  DLPROBE_ASSIGN_OR_RETURN(impl->allocator, CachingAllocator::create(std::move(source), allocator));
  DLPROBE_RETURN_IF_ERROR(impl->make_backend(engine::Precision::fp32));

#ifdef DLPROBE_HAVE_CUDA_BACKEND
  if (impl->on_gpu()) {
    impl->describe_gpu();
    if (impl->nvml_index && *impl->nvml_index < used_before.size()) {
      impl->device_used_before = used_before[*impl->nvml_index];
    }
    if (auto reading = impl->nvml_reading()) {
      impl->context = reading->first - impl->allocator->stats().reserved_bytes;
      if (allocator.mode == Mode::limit) {
        const Status set = impl->allocator->set_overhead_bytes(
            static_cast<std::uint64_t>(std::max<std::int64_t>(*impl->context, 0)));
        if (!set.is_ok()) return set.with_context("the CUDA context alone");
      }
    } else if (allocator.mode == Mode::limit) {
      log_warn("NVML cannot see this process: the limit covers the allocator only");
    }
  }
#endif
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

std::string Session::device_name() const {
  return impl_->label;
}
CachingAllocator& Session::allocator() {
  return *impl_->allocator;
}

Result<Measurement> Session::measure(const engine::StepConfig& config, int warmup) {
  Impl& s = *impl_;
  if (warmup < 0) return invalid_argument(fmt::format("warmup must be >= 0, got {}", warmup));
  DLPROBE_RETURN_IF_ERROR(s.make_backend(config.precision));
  CachingAllocator& allocator = *s.allocator;
  std::unique_ptr<engine::TrainingStep> step;
  // Whatever happens, the next measurement starts from an empty cache, as a new process would.
  struct Cleanup {
    std::unique_ptr<engine::TrainingStep>& step;
    CachingAllocator& allocator;
    ~Cleanup() {
      step.reset();
      const Status emptied = allocator.empty_cache();
      if (!emptied.is_ok()) log_warn("emptying the allocator's cache: {}", emptied.message());
    }
  } cleanup{step, allocator};

  DLPROBE_ASSIGN_OR_RETURN(step, engine::TrainingStep::create(config, *s.backend, allocator));
  const std::int64_t n = config.batch;
  const std::int64_t hw = config.model.image_size;
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc images_desc,
                           TensorDesc::make(Shape{n, 3, hw, hw}, DType::fp32));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc labels_desc, TensorDesc::make(Shape{n}, DType::int64));
  const HostTensor images = HostTensor::random(images_desc, 1, -2.0, 2.0);
  const HostTensor labels =
      HostTensor::random(labels_desc, 2, 0.0, static_cast<double>(config.model.classes));
  DLPROBE_RETURN_IF_ERROR(step->set_input(images, labels));
  for (int i = 0; i < warmup; ++i) DLPROBE_RETURN_IF_ERROR(step->run_step().status());

  const bool limited = allocator.options().mode == Mode::limit;
  // Kernels and library buffers load on first use, so what the process holds outside the
  // allocator is measured again before the followed step, and the limit kept to it.
  if (limited && s.on_gpu()) {
    if (auto reading = s.nvml_reading()) {
      const std::int64_t outside = reading->first - allocator.stats().reserved_bytes;
      const Status set = allocator.set_overhead_bytes(
          static_cast<std::uint64_t>(std::max<std::int64_t>(outside, 0)));
      if (!set.is_ok()) return set.with_context("after the warm-up steps");
    }
  }

  Measurement m;
  m.step = config;
  DLPROBE_ASSIGN_OR_RETURN(m.memory, follow_step(*step, allocator));
  m.stats = allocator.stats();
  m.calibration.device = s.label;
  m.calibration.model = std::string(model::arch_name(config.model.arch));
  m.calibration.precision = std::string(engine::precision_name(config.precision));
  m.calibration.batch = config.batch;
  m.calibration.workspace_bytes = m.memory.workspace_peak_bytes;
  if (s.on_gpu()) {
    if (auto reading = s.nvml_reading()) {
      Reconciliation r;
      r.allocated_peak_bytes = m.memory.peak.allocated_bytes;
      r.workspace_peak_bytes = m.memory.workspace_peak_bytes;
      r.reserved_bytes = m.stats.reserved_bytes;
      r.context_bytes = s.context.value_or(0);
      r.nvml_process_bytes = reading->first;
      r.nvml_source = reading->second;
      m.calibration.outside_allocator_bytes = r.nvml_process_bytes - r.reserved_bytes;
      m.reconciliation = r;
      const AllocatorOptions& o = allocator.options();
      if (limited && static_cast<std::uint64_t>(r.nvml_process_bytes) > o.limit_bytes) {
        return error(Errc::out_of_memory,
                     fmt::format("NVML sees the process at {}, over the limit {} ({} reserved by "
                                 "the allocator, {} outside it)",
                                 format_size(static_cast<std::uint64_t>(r.nvml_process_bytes)),
                                 format_size(o.limit_bytes),
                                 format_size(static_cast<std::uint64_t>(r.reserved_bytes)),
                                 format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(
                                     r.nvml_process_bytes - r.reserved_bytes, 0)))));
      }
    }
  }
  return m;
}

}  // namespace dlprobe::memory
