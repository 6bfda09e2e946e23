// Measuring a step's memory on a device: one backend, allocator and NVML handle for many runs.
#include <fmt/format.h>

#include <algorithm>

#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/device/open_backend.h"
#include "dlprobe/memory/gpu_process_memory.h"
#include "dlprobe/memory/session.h"
#include "step_follower.h"

namespace dlprobe::memory {

struct Session::Impl {
  SessionOptions options;
  std::string label;
  // Declared before the backend, which holds a reference to it: destroyed after.
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
  DType compute = DType::fp32;              // the backend's: fp64 for fp64 steps (reference only)
  std::optional<GpuProcessMemory> process;  // NVML's view, on a GPU where NVML opens
  std::optional<std::int64_t> context;

  bool on_gpu() const { return options.device.kind == DeviceKind::cuda; }

  std::optional<ProcessReading> nvml_reading() const {
    return process ? process->read() : std::nullopt;
  }

  // The backend for a step of `precision`: the reference loops compute fp64 steps in fp64 and
  // the others in fp32, so a change between them opens the backend anew.
  Status make_backend(engine::Precision precision) {
    DLPROBE_RETURN_IF_ERROR(device::backend_supports(options.backend, precision));
    const DType want = precision == engine::Precision::fp64 ? DType::fp64 : DType::fp32;
    if (backend && want == compute) return Status::ok();
    backend.reset();
    DLPROBE_ASSIGN_OR_RETURN(backend, device::open_backend(options.device, options.backend,
                                                           *allocator, options.conv, want));
    compute = want;
    return Status::ok();
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::open(const SessionOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->label = device::device_name(options.device);
  if (options.backend == device::BackendKind::reference) impl->label = "cpu (reference)";
  if (options.backend == device::BackendKind::onednn) impl->label = "cpu (oneDNN)";
  // Before the CUDA context exists, so NVML's fallback figure starts from the right point.
  if (impl->on_gpu()) {
    Result<GpuProcessMemory> process = GpuProcessMemory::open(options.nvml);
    if (process) {
      impl->process = std::move(process).value();
    } else {
      log_warn("NVML: {}; no reconciliation with the driver's figures", process.status().message());
    }
  }

  DLPROBE_RETURN_IF_ERROR(device::backend_runs_on(options.backend, options.device));
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<MemorySource> source,
                           device::open_memory_source(options.device));
  AllocatorOptions allocator = options.allocator;
  // Measured below; the limit holds the allocator alone until then.
  if (allocator.mode == Mode::limit) allocator.overhead_bytes = 0;
  DLPROBE_ASSIGN_OR_RETURN(impl->allocator, CachingAllocator::create(std::move(source), allocator));
  DLPROBE_RETURN_IF_ERROR(impl->make_backend(engine::Precision::fp32));

  if (impl->process) {
    const Status attached = impl->process->attach(options.device.index);
    if (attached.is_ok()) {
      impl->label =
          fmt::format("{} ({})", device::device_name(options.device), impl->process->gpu_name());
    } else {
      log_warn("NVML: {}; no reconciliation with the driver's figures", attached.message());
      impl->process.reset();
    }
  }
  if (auto reading = impl->nvml_reading()) {
    impl->context = reading->bytes - impl->allocator->stats().reserved_bytes;
    if (allocator.mode == Mode::limit) {
      const Result<std::int64_t> set = update_limit_overhead(*impl->allocator, *impl->process);
      if (!set) return set.status().with_context("the CUDA context alone");
    }
  } else if (impl->on_gpu() && allocator.mode == Mode::limit) {
    log_warn("NVML cannot see this process: the limit covers the allocator only");
  }
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
  if (limited && s.process) {
    const Result<std::int64_t> set = update_limit_overhead(allocator, *s.process);
    if (!set && set.status().code() != Errc::unavailable) {
      return set.status().with_context("after the warm-up steps");
    }
  }

  Measurement m;
  m.step = step->config();  // as it ran: without a recomputation it had nothing to do
  DLPROBE_ASSIGN_OR_RETURN(m.memory, follow_step(*step, allocator));
  m.stats = allocator.stats();
  m.calibration.device = s.label;
  m.calibration.model = model::model_name(config.model);
  m.calibration.precision = std::string(engine::precision_name(config.precision));
  m.calibration.batch = config.batch;
  m.calibration.workspace_bytes = m.memory.workspace_peak_bytes;
  m.calibration.fused = s.backend->fuses_batch_norm_relu();
  m.calibration.fused_conv =
      s.backend->fuses_conv_batch_norm(engine::activation_dtype(config.precision), config.layout);
  m.calibration.recomputed_pool = s.backend->recomputes_max_pool_input();
  m.calibration.fused_pool_backward =
      std::any_of(step->calls().begin(), step->calls().end(), [](const engine::Call& c) {
        return c.kind == engine::CallKind::batch_norm_relu_max_pool_backward;
      });
  // The profile over the calls that compute (see Calibration::workspace_by_call).
  std::vector<std::int64_t> computing;
  for (std::size_t i : computing_calls(step->calls())) {
    computing.push_back(m.memory.workspace_by_call[i]);
  }
  m.calibration.calls = computing.size();
  if (!computing.empty()) {
    m.calibration.workspace_held_bytes = *std::min_element(computing.begin(), computing.end());
    for (std::size_t k = 0; k < computing.size(); ++k) {
      const std::int64_t extra = computing[k] - m.calibration.workspace_held_bytes;
      if (extra > 0) m.calibration.workspace_by_call.emplace_back(k, extra);
    }
  }
  {
    if (auto reading = s.nvml_reading()) {
      Reconciliation r;
      r.allocated_peak_bytes = m.memory.peak.allocated_bytes;
      r.workspace_peak_bytes = m.memory.workspace_peak_bytes;
      r.reserved_bytes = m.stats.reserved_bytes;
      r.context_bytes = s.context.value_or(0);
      r.nvml_process_bytes = reading->bytes;
      r.nvml_source = reading->source;
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
