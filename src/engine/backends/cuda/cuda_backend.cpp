#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cuda_backend_impl.h"
#include "cuda_library_check.h"
#include "dlprobe/core/log.h"
#include "timed_choice.h"

namespace dlprobe {
namespace cuda {
namespace {

// ---- argument checks: dtypes and layouts (the shapes were checked by ops.h's functions) ----

Status need(bool ok, std::string_view op, std::string_view what) {
  if (ok) return Status::ok();
  return invalid_argument(fmt::format("{}: {}", op, what));
}

bool is_activation(DType t) {
  return t == DType::fp32 || t == DType::fp16 || t == DType::bf16;
}

Status need_activation(std::string_view op, std::string_view name, const TensorView& t) {
  DLPROBE_RETURN_IF_ERROR(need(t.data != nullptr, op, fmt::format("{} has no data", name)));
  return need(is_activation(t.desc.dtype()), op,
              fmt::format("{} is {}; fp32, fp16 or bf16 expected", name, t.desc.str()));
}

Status need_fp32(std::string_view op, std::string_view name, const TensorView& t) {
  DLPROBE_RETURN_IF_ERROR(need(t.data != nullptr, op, fmt::format("{} has no data", name)));
  return need(t.desc.dtype() == DType::fp32, op,
              fmt::format("{} is {}; fp32 expected", name, t.desc.str()));
}

// Same shape, dtype and layout: the elementwise kernels walk both in storage order.
Status need_like(std::string_view op, std::string_view name, const TensorView& t,
                 const TensorView& like) {
  DLPROBE_RETURN_IF_ERROR(need(t.data != nullptr, op, fmt::format("{} has no data", name)));
  return need(t.desc == like.desc, op,
              fmt::format("{} is {}, expected {}", name, t.desc.str(), like.desc.str()));
}

// Tensors with the names that errors give them.
using NamedTensors = std::initializer_list<std::pair<std::string_view, const TensorView*>>;

// An elementwise op's operands: the first an activation, each other one like it.
Status need_elementwise(std::string_view op, NamedTensors operands) {
  const auto& [first_name, first] = *operands.begin();
  DLPROBE_RETURN_IF_ERROR(need_activation(op, first_name, *first));
  for (const auto& [name, t] : std::span(operands).subspan(1)) {
    DLPROBE_RETURN_IF_ERROR(need_like(op, name, *t, *first));
  }
  return Status::ok();
}

Status need_same_layout(std::string_view op, std::string_view name, const TensorView& t,
                        const TensorView& like) {
  return need(t.desc.layout() == like.desc.layout() && t.desc.dtype() == like.desc.dtype(), op,
              fmt::format("{} is {} but {} is expected in {} layout", name, t.desc.str(),
                          dtype_name(like.desc.dtype()), layout_name(like.desc.layout())));
}

// ---- cuDNN ----

Result<cudnnDataType_t> cudnn_type(DType t) {
  switch (t) {
    case DType::fp32:
      return CUDNN_DATA_FLOAT;
    case DType::fp16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return error(Errc::unsupported,
                   fmt::format("convolutions take fp32, fp16 or bf16, not {}", dtype_name(t)));
  }
}

// Largest power of two up to `cap` that divides the address.
std::int64_t alignment_of(const void* p, std::int64_t cap) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  if (address == 0) return cap;
  return std::min<std::int64_t>(cap, static_cast<std::int64_t>(address & (~address + 1)));
}

// cuDNN's dims are N, C, H, W whatever the memory layout; TensorDesc's strides say where each
// element is, so NHWC needs nothing more.
Result<TensorSpec> tensor_spec(std::int64_t uid, const TensorView& v) {
  DLPROBE_ASSIGN_OR_RETURN(cudnnDataType_t type, cudnn_type(v.desc.dtype()));
  TensorSpec t;
  t.uid = uid;
  t.dtype = type;
  for (int i = 0; i < 4; ++i) {
    t.dims.push_back(v.desc.dim(i));
    t.strides.push_back(v.desc.stride(i));
  }
  t.alignment = alignment_of(v.data, 16);
  return t;
}

constexpr std::int64_t kUidX = 1;
constexpr std::int64_t kUidW = 2;
constexpr std::int64_t kUidY = 3;
// The fused convolutions' per-channel tensors.
constexpr std::int64_t kUidScale = 4;
constexpr std::int64_t kUidBias = 5;
constexpr std::int64_t kUidSum = 6;
constexpr std::int64_t kUidSqsum = 7;
// The fused data gradient's addend and the ReLU output that masks it.
constexpr std::int64_t kUidAdd = 8;
constexpr std::int64_t kUidReluY = 9;

// ---- cuBLASLt ----

using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::fp16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

Result<MatrixLayout> matrix_layout(DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  auto make = [&]() -> Status {
    DLPROBE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, cuda_type(t),
                                                    static_cast<std::uint64_t>(rows),
                                                    static_cast<std::uint64_t>(cols), ld));
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(make());
  return MatrixLayout(raw);
}

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device,
                                                         memory::CachingAllocator& allocator,
                                                         const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return error(Errc::unavailable, "no CUDA device is usable");
  }
  if (device < 0 || device >= count) {
    return error(Errc::not_found,
                 fmt::format("CUDA device {} does not exist ({} found)", device, count));
  }
  if (options.max_workspace_bytes < 0 || options.max_fp32_conv_workspace_bytes < 0) {
    return invalid_argument("the CUDA backend's max workspace must not be negative");
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(allocator, options));
  auto init = [&]() -> Status {
    DLPROBE_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    DLPROBE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    // Tuning choices hold for this GPU model, cuDNN build and workspace limit only.
    b->tuning_stamp_ = fmt::format("{} sm_{}{} cudnn {} ws {}/{}", prop.name, prop.major,
                                   prop.minor, cudnnGetVersion(), options.max_workspace_bytes,
                                   options.max_fp32_conv_workspace_bytes);
    DLPROBE_CUDA_CHECK(
        cudaDeviceGetAttribute(&b->sm_count_, cudaDevAttrMultiProcessorCount, device));
    int cooperative = 0;
    DLPROBE_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
    b->cooperative_ = cooperative != 0 && options.cooperative_launches;
    b->runtime_fusion_ = prop.major >= 8;
    cudaStream_t stream = nullptr;
    DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    b->stream_.reset(stream);
    cudaStream_t side = nullptr;
    DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    b->side_stream_.reset(side);
    for (EventPtr* e : {&b->fork_, &b->join_}) {
      cudaEvent_t raw = nullptr;
      DLPROBE_CUDA_CHECK(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming));
      e->reset(raw);
    }
    // The two lines bracket the handles' creation in a --verbose log, one of start-up's parts (5 ms
    // on the H200 machine; docs/performance.md has the others).
    log_debug("cuda backend: device {} ready; creating the cuDNN and cuBLASLt handles", device);
    cudnnHandle_t cudnn = nullptr;
    DLPROBE_CUDNN_CHECK(cudnnCreate(&cudnn));
    b->cudnn_.reset(cudnn);
    DLPROBE_CUDNN_CHECK(cudnnSetStream(cudnn, stream));
    cublasLtHandle_t lt = nullptr;
    DLPROBE_CUBLAS_CHECK(cublasLtCreate(&lt));
    b->lt_.reset(lt);
    log_debug("cuda backend: cuDNN and cuBLASLt handles ready");
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    DLPROBE_CUDA_CHECK(cudaEventCreate(&start));
    b->start_.reset(start);
    DLPROBE_CUDA_CHECK(cudaEventCreate(&stop));
    b->stop_.reset(stop);
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(init());
  return b;
}

CudaBackend::~CudaBackend() {
  // Queued work may still use scratch blocks and plans; let it finish before they go.
  if (stream_) (void)cudaStreamSynchronize(stream_.get());
  if (side_stream_) (void)cudaStreamSynchronize(side_stream_.get());
}

Status CudaBackend::upload(void* dst, const void* src, std::size_t bytes) {
  DLPROBE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()));
  return Status::ok();
}

Status CudaBackend::download(void* dst, const void* src, std::size_t bytes) {
  DLPROBE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()));
  DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::ok();
}

Status CudaBackend::copy(void* dst, const void* src, std::size_t bytes) {
  DLPROBE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
  return Status::ok();
}

Status CudaBackend::synchronize() {
  DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  DLPROBE_CUDA_CHECK(cudaStreamSynchronize(side_stream_.get()));
  return Status::ok();
}

Result<std::size_t> CudaBackend::on_stream(int stream, const std::function<Status()>& run) {
  if (stream != 1 || stream_index_ == 1) return Backend::on_stream(stream, run);
  DLPROBE_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), side_stream_.get()));
  stream_index_ = 1;
  const Status ran = run();
  stream_index_ = 0;
  DLPROBE_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), stream_.get()));
  DLPROBE_RETURN_IF_ERROR(ran);
  const std::size_t ticket = next_ticket_++;
  EventPtr& done = done_[ticket % kStreamTickets];
  if (!done) {
    cudaEvent_t e = nullptr;
    DLPROBE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done.reset(e);
  }
  DLPROBE_CUDA_CHECK(cudaEventRecord(done.get(), side_stream_.get()));
  return ticket;
}

Status CudaBackend::join_through(std::size_t ticket) {
  if (ticket >= next_ticket_ || next_ticket_ - ticket > kStreamTickets) {
    return invalid_argument(
        fmt::format("join_through: ticket {} is not one of the latest {}", ticket, kStreamTickets));
  }
  DLPROBE_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), done_[ticket % kStreamTickets].get(), 0));
  return Status::ok();
}

Status CudaBackend::fork() {
  DLPROBE_CUDA_CHECK(cudaEventRecord(fork_.get(), stream_.get()));
  DLPROBE_CUDA_CHECK(cudaStreamWaitEvent(side_stream_.get(), fork_.get(), 0));
  forked_ = true;
  return Status::ok();
}

// Only after a fork: while a graph is recorded, stream 1 takes part only from its first wait on
// stream 0, and a wait on its work from before the recording is refused
// (cudaErrorStreamCaptureIsolation).
Status CudaBackend::join() {
  if (!forked_) return Status::ok();
  DLPROBE_CUDA_CHECK(cudaEventRecord(join_.get(), side_stream_.get()));
  DLPROBE_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), join_.get(), 0));
  forked_ = false;
  return Status::ok();
}

Status CudaBackend::mark(std::size_t index) {
  if (index >= marks_.size()) marks_.resize(index + 1);
  if (!marks_[index]) {
    cudaEvent_t e = nullptr;
    DLPROBE_CUDA_CHECK(cudaEventCreate(&e));
    marks_[index].reset(e);
  }
  DLPROBE_CUDA_CHECK(cudaEventRecord(marks_[index].get(), stream_.get()));
  return Status::ok();
}

Status CudaBackend::wait_for_mark(std::size_t index) {
  if (index >= marks_.size() || !marks_[index]) {
    return invalid_argument(fmt::format("timing mark {} was never recorded", index));
  }
  DLPROBE_CUDA_CHECK(cudaEventSynchronize(marks_[index].get()));
  return Status::ok();
}

Result<double> CudaBackend::elapsed_ms(std::size_t from, std::size_t to) {
  for (const std::size_t i : {from, to}) {
    if (i >= marks_.size() || !marks_[i]) {
      return invalid_argument(fmt::format("timing mark {} was never recorded", i));
    }
  }
  DLPROBE_CUDA_CHECK(cudaEventSynchronize(marks_[to].get()));
  float ms = 0;
  DLPROBE_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[from].get(), marks_[to].get()));
  return static_cast<double>(ms);
}

Result<void*> CudaBackend::workspace(std::size_t bytes, std::string_view op,
                                     std::optional<Scratch>& holder) {
  if (stream_index_ == 1) {
    // Stream 1's own pool (see ctx()): a block the allocator took back could go to a stream-0
    // call while this one still runs.
    DLPROBE_ASSIGN_OR_RETURN(Scratch ws, scratch(ctx(), bytes, op));
    return holder.emplace(std::move(ws)).data();
  }
  if (recording_ == nullptr) {
    eager_workspace_bytes_ = std::max(eager_workspace_bytes_, bytes);
    DLPROBE_ASSIGN_OR_RETURN(memory::DeviceBuffer ws,
                             allocator_.allocate_buffer(bytes, memory::Category::workspace, op));
    return holder.emplace(std::move(ws), nullptr).data();
  }
  if (bytes > recording_->workspace.size()) {
    return error(Errc::internal,
                 fmt::format("{}: needs {} bytes of workspace, more than any eager call since "
                             "the last graph was recorded",
                             op, bytes));
  }
  return recording_->workspace.data();
}

// The calls recorded are the step's, run eagerly at least once before (so plans, algorithms and
// the allocator's cache are in place). The shared workspace is the most any eager call took since
// the count was reset (the step resets it before its eager run) or the last capture: the calls
// being recorded are among them. Not the most over every cached plan: a backend that a sweep's
// configurations share holds other steps' plans, and strict fp32's FFT engines (1.4 GiB at
// ResNet-50 bs 256) would then size every later graph.
Result<std::size_t> CudaBackend::capture(const std::function<Status()>& record) {
  auto graph = std::make_unique<Graph>();
  const std::size_t ws = std::exchange(eager_workspace_bytes_, 0);
  DLPROBE_ASSIGN_OR_RETURN(
      graph->workspace,
      allocator_.allocate_buffer(ws, memory::Category::workspace, "graph workspace"));
  // What was queued before has run: a call being recorded may fill memory outside the recording
  // (the optimizer's table, kernels_optimizer.cu), in a block the caching allocator hands on from
  // that earlier work, which its stream order alone would not keep it from overwriting.
  DLPROBE_RETURN_IF_ERROR(synchronize());
  DLPROBE_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeRelaxed));
  recording_ = graph.get();
  Status recorded = record();
  // A capture ends only with every stream it reached joined into the one it began on, also when
  // the recording stopped half way.
  if (const Status joined = join(); recorded.is_ok()) recorded = joined;
  recording_ = nullptr;
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_.get(), &raw);
  const Owned<cudaGraph_t, cudaGraphDestroy> captured(raw);
  forked_ = false;
  if (!recorded.is_ok() || ended != cudaSuccess) {
    // The failed call's error stays the runtime's last error, and the eager steps that follow
    // would read it as their own launch's.
    (void)cudaGetLastError();
  }
  if (!recorded.is_ok()) return recorded.with_context("recording a CUDA graph");
  DLPROBE_CUDA_CHECK(ended);
  cudaGraphExec_t exec = nullptr;
  DLPROBE_CUDA_CHECK(cudaGraphInstantiate(&exec, captured.get(), 0));
  graph->exec.reset(exec);
  graphs_.push_back(std::move(graph));
  return graphs_.size() - 1;
}

Status CudaBackend::replay(std::size_t graph) {
  if (graph >= graphs_.size() || !graphs_[graph]) {
    return invalid_argument(fmt::format("no recorded graph {}", graph));
  }
  DLPROBE_CUDA_CHECK(cudaGraphLaunch(graphs_[graph]->exec.get(), stream_.get()));
  return Status::ok();
}

void CudaBackend::release_graph(std::size_t graph) {
  if (graph >= graphs_.size() || !graphs_[graph]) return;
  // Its workspace and scratch go back to the allocator, which may hand them out at once: no
  // queued replay may still be using them.
  if (const cudaError_t e = cudaStreamSynchronize(stream_.get()); e != cudaSuccess) {
    log_warn("releasing graph {}: cudaStreamSynchronize: {}", graph, cudaGetErrorString(e));
  }
  graphs_[graph].reset();
}

Status CudaBackend::fill(const TensorView& t, double value) {
  DLPROBE_RETURN_IF_ERROR(need(t.data != nullptr, "fill", "the tensor has no data"));
  return launch_fill(ctx(), t, value);
}

namespace {

// What cast and cast_many take of each pair: activations of one shape and layout.
Status need_castable(std::string_view op, const TensorView& src, const TensorView& dst) {
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "src", src));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "dst", dst));
  return need(src.desc.shape() == dst.desc.shape() && src.desc.layout() == dst.desc.layout(), op,
              fmt::format("{} cannot be cast into {}", src.desc.str(), dst.desc.str()));
}

}  // namespace

Status CudaBackend::cast(const TensorView& src, const TensorView& dst) {
  DLPROBE_RETURN_IF_ERROR(need_castable("cast", src, dst));
  return launch_cast(ctx(), src, dst);
}

// One launch per kCastsPerLaunch pairs where every pair has the first one's dtypes (the planner's
// weight and gradient casts); pair by pair otherwise.
Status CudaBackend::cast_many(std::span<const TensorView> src, std::span<const TensorView> dst) {
  constexpr std::string_view op = "cast_many";
  if (src.size() != dst.size()) {
    return invalid_argument(
        fmt::format("{}: {} sources and {} destinations", op, src.size(), dst.size()));
  }
  if (src.empty()) return Status::ok();
  bool uniform = true;
  for (std::size_t i = 0; i < src.size(); ++i) {
    DLPROBE_RETURN_IF_ERROR(need_castable(op, src[i], dst[i]));
    uniform = uniform && src[i].desc.dtype() == src[0].desc.dtype() &&
              dst[i].desc.dtype() == dst[0].desc.dtype();
  }
  if (!uniform) return Backend::cast_many(src, dst);
  return launch_cast_many(ctx(), src, dst);
}

// ---- convolutions ----

// The larger fp32 cap only where candidates are timed (timed_choice.h): there a large workspace
// is taken only where its configuration was timed fastest, where the heuristic choice would take
// the first engine that fits. Every convolution computes in fp32 (conv_spec), so the operands'
// dtype is what tells fp32 convolutions from fp16 and bf16 ones.
std::int64_t CudaBackend::conv_workspace_cap(const ConvSpec& spec) const {
  if (options_.conv_engine == ConvEngineChoice::heuristic) return options_.max_workspace_bytes;
  return timed_workspace_cap({.fp32_tensors = spec.x.dtype == CUDNN_DATA_FLOAT,
                              .tf32 = spec.allow_tf32,
                              .transforms = spec.allow_transforms},
                             options_.max_workspace_bytes, options_.max_fp32_conv_workspace_bytes);
}

// The plan for a shape not planned yet: the tuning cache's recorded engine where it has one that
// still builds, else a new choice (recorded in the cache when it was timed).
Result<ExecutionPlan> CudaBackend::tuned_conv_plan(const ConvSpec& spec, const std::string& key,
                                                   std::string_view op, const PlanTimer& timer) {
  const ConvEngineChoice choice = options_.conv_engine;
  const bool cached = options_.tuning && choice != ConvEngineChoice::heuristic;
  const std::string tuning_key =
      // The rule's version (timed_choice.h): choices an older rule made are tuned again.
      cached ? fmt::format("{} | {} v{} | {}", tuning_stamp_, conv_engine_choice_name(choice),
                           kTimedChoiceVersion, key)
             : std::string();
  if (cached) {
    if (auto entry = options_.tuning->find(tuning_key)) {
      auto plan = build_conv_plan_for_engine(cudnn_.get(), spec, entry->engine, entry->knobs,
                                             conv_workspace_cap(spec));
      if (plan) {
        plan->time_ms = static_cast<float>(entry->ms);
        ++conv_plans_replayed_;
        return plan;
      }
      log_warn("{}: the tuning cache's {} no longer builds ({}); tuning again", op, entry->label,
               plan.status().message());
      options_.tuning->forget(tuning_key);
    }
  }
  DLPROBE_ASSIGN_OR_RETURN(ExecutionPlan built, build_conv_plan(cudnn_.get(), spec, choice,
                                                                conv_workspace_cap(spec), timer));
  if (cached && built.time_ms > 0) {
    // A cache that cannot be written loses only the saving on the next run: say so, go on.
    if (Status s = options_.tuning->record(tuning_key, {built.engine_index,
                                                        built.knobs,
                                                        built.engine_name,
                                                        built.time_ms,
                                                        built.workspace_bytes,
                                                        {}});
        !s.is_ok()) {
      log_warn("{}", s.message());
    }
  }
  return built;
}

// cuDNN runs convolutions over images of fewer than four channels (the RGB stem of every ImageNet
// model) far below its other shapes in NHWC fp16/bf16: its first-layer kernels take four
// channels. On an H200, PyTorch's profile of ResNet-50's stem showed cuDNN's
// "image_first_layer ... c4r7s7" kernels at 0.40 ms forward and 0.40 ms weight gradient (engine
// 63 of cuDNN 9.19, which pads a three-channel image itself), where the best three-channel plans
// under fp32 sums took 1.56 and 1.13 ms. So the image and the weights are copied into
// four-channel buffers whose extra channels are zero, which leaves every output value as it was;
// the weight gradient's extra channels are dropped. Engine 63 takes the four-channel graph too,
// where reduced-precision reductions may compete: its forward took 0.41 ms there and 0.55 ms on
// three channels, where it pads them itself into 98 MiB of workspace at batch 256
// (microbench/stem_conv_gpu_bench.cpp); the copy here takes about 0.08 ms and as much memory, so
// the two ways cost about the same and the copy stays for every engine. The data gradient (never
// needed for an input image) runs unpadded, and bf16's stem runs as depth (runs_stem_as_depth).
bool CudaBackend::needs_channel_pad(const TensorView& x, const TensorView& w,
                                    const Conv2dParams& p) const {
  const DType t = x.desc.dtype();
  // copy_channels moves rows of channels: both operands must keep channels innermost.
  return x.desc.layout() == Layout::nhwc && w.desc.layout() == Layout::nhwc &&
         x.desc.dim(1) < kPaddedChannels && p.groups == 1 && (t == DType::fp16 || t == DType::bf16);
}

Status CudaBackend::padded_conv(ConvDirection direction, const TensorView& x, const TensorView& w,
                                const TensorView& y, const Conv2dParams& p, std::string_view op) {
  auto four = [&](const TensorDesc& d) {
    return TensorDesc::make(Shape{d.dim(0), kPaddedChannels, d.dim(2), d.dim(3)}, d.dtype(),
                            Layout::nhwc);
  };
  DLPROBE_ASSIGN_OR_RETURN(const TensorDesc x4_desc, four(x.desc));
  DLPROBE_ASSIGN_OR_RETURN(const TensorDesc w4_desc, four(w.desc));
  DLPROBE_ASSIGN_OR_RETURN(auto x4_buf, scratch(ctx(), x4_desc.bytes(), op));
  DLPROBE_ASSIGN_OR_RETURN(auto w4_buf, scratch(ctx(), w4_desc.bytes(), op));
  const TensorView x4{x4_desc, x4_buf.data()};
  const TensorView w4{w4_desc, w4_buf.data()};
  DLPROBE_RETURN_IF_ERROR(launch_copy_channels(ctx(), x, x4));
  if (direction == ConvDirection::forward) {
    DLPROBE_RETURN_IF_ERROR(launch_copy_channels(ctx(), w, w4));
    return conv(direction, x4, w4, y, p, op);
  }
  DLPROBE_RETURN_IF_ERROR(conv(direction, x4, w4, y, p, op));
  return launch_copy_channels(ctx(), w4, w);
}

// In bf16 cuDNN 9.19 has no first-layer engine: ResNet-50's stem took 1.88 ms forward and 1.24 ms
// for the weight gradient at batch 256 on an H100 (four channels, `--profile`; fp16's engine 63:
// 0.47 and 0.47 ms), and padding the image to eight channels gained 1.4 % of the bf16 step. As a
// 4x4, stride-1 convolution over 16 channels it took 0.74 and 0.53 ms: the bf16 step 5.3 % faster
// at batch 256, 4.4 % at 64 (2026-12-06). In fp16 engine 63 stays ahead (the step 1.0 % slower
// this way), and tf32 tied.
// Operands whose shapes do not fit the convolution go the plain way, where cuDNN says so: the
// depth tensor is sized from y, so the route itself would take them.
bool CudaBackend::runs_stem_as_depth(const TensorView& x, const TensorView& w, const TensorView& y,
                                     const Conv2dParams& p) const {
  const TensorDesc& xd = x.desc;
  return xd.dtype() == DType::bf16 && xd.layout() == Layout::nhwc &&
         w.desc.layout() == Layout::nhwc && xd.dim(1) <= 4 && w.desc.dim(1) == xd.dim(1) &&
         w.desc.dim(2) == 7 && w.desc.dim(3) == 7 && p.stride[0] == 2 && p.stride[1] == 2 &&
         p.pad[0] == 3 && p.pad[1] == 3 && p.dilation[0] == 1 && p.dilation[1] == 1 &&
         p.groups == 1 && y.desc.dim(0) == xd.dim(0) && y.desc.dim(1) == w.desc.dim(0) &&
         y.desc.dim(2) == (xd.dim(2) - 1) / 2 + 1 && y.desc.dim(3) == (xd.dim(3) - 1) / 2 + 1;
}

Status CudaBackend::stem_conv_as_depth(ConvDirection direction, const TensorView& x,
                                       const TensorView& w, const TensorView& y,
                                       std::string_view op) {
  const DType t = x.desc.dtype();
  DLPROBE_ASSIGN_OR_RETURN(const TensorDesc xd_desc,
                           TensorDesc::make(Shape{x.desc.dim(0), kStemDepthChannels,
                                                  y.desc.dim(2) + 3, y.desc.dim(3) + 3},
                                            t, Layout::nhwc));
  DLPROBE_ASSIGN_OR_RETURN(
      const TensorDesc wd_desc,
      TensorDesc::make(Shape{w.desc.dim(0), kStemDepthChannels, 4, 4}, t, Layout::nhwc));
  DLPROBE_ASSIGN_OR_RETURN(auto xd_buf, scratch(ctx(), xd_desc.bytes(), op));
  DLPROBE_ASSIGN_OR_RETURN(auto wd_buf, scratch(ctx(), wd_desc.bytes(), op));
  const TensorView xd{xd_desc, xd_buf.data()};
  const TensorView wd{wd_desc, wd_buf.data()};
  DLPROBE_RETURN_IF_ERROR(launch_stem_to_depth(ctx(), x, xd));
  const Conv2dParams unpadded{};
  if (direction == ConvDirection::forward) {
    DLPROBE_RETURN_IF_ERROR(launch_stem_weights_to_depth(ctx(), w, wd));
    return conv(direction, xd, wd, y, unpadded, op);
  }
  DLPROBE_RETURN_IF_ERROR(conv(direction, xd, wd, y, unpadded, op));
  return launch_stem_weights_from_depth(ctx(), wd, w);
}

// Times one candidate on the real buffers: an untimed run, a timed one, and unless that is more
// than twice the best so far, the mean of three more. Some candidates are many times slower than
// the best, so the cut keeps autotuning short. The untimed run comes first because a kernel's first
// launch also loads its module (CUDA loads modules lazily): timed, it made every engine but the
// first-loaded look slow and the cut dropped them. uids and ptrs must outlive the timer.
PlanTimer CudaBackend::candidate_timer(std::span<const std::int64_t> uids,
                                       std::span<void* const> ptrs, std::string_view op) {
  return [this, uids, ptrs, op](const ExecutionPlan& candidate, float best_ms) -> Result<float> {
    DLPROBE_ASSIGN_OR_RETURN(
        auto ws, allocator_.allocate_buffer(static_cast<std::size_t>(candidate.workspace_bytes),
                                            memory::Category::workspace, op));
    auto time_runs = [&](int runs) -> Result<float> {
      DLPROBE_CUDA_CHECK(cudaEventRecord(start_.get(), stream()));
      for (int i = 0; i < runs; ++i) {
        DLPROBE_RETURN_IF_ERROR(execute_plan(cudnn_.get(), candidate, uids, ptrs, ws.data()));
      }
      DLPROBE_CUDA_CHECK(cudaEventRecord(stop_.get(), stream()));
      DLPROBE_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
      float ms = 0;
      DLPROBE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
      return ms / static_cast<float>(runs);
    };
    DLPROBE_RETURN_IF_ERROR(execute_plan(cudnn_.get(), candidate, uids, ptrs, ws.data()));
    DLPROBE_ASSIGN_OR_RETURN(const float first, time_runs(1));
    if (first > 2.0F * best_ms) return first;
    return time_runs(3);
  };
}

Status CudaBackend::conv(ConvDirection direction, const TensorView& x, const TensorView& w,
                         const TensorView& y, const Conv2dParams& p, std::string_view op) {
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "x", x));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "w", w));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "y", y));
  DLPROBE_RETURN_IF_ERROR(need(x.desc.dtype() == w.desc.dtype() && x.desc.dtype() == y.desc.dtype(),
                               op,
                               fmt::format("operands {}, {}, {} differ in dtype", x.desc.str(),
                                           w.desc.str(), y.desc.str())));
  if (direction != ConvDirection::backward_data && runs_stem_as_depth(x, w, y, p)) {
    return stem_conv_as_depth(direction, x, w, y, op);
  }
  if (direction != ConvDirection::backward_data && needs_channel_pad(x, w, p)) {
    return padded_conv(direction, x, w, y, p, op);
  }
  DLPROBE_ASSIGN_OR_RETURN(ConvSpec spec, conv_spec(direction, x, w, y, p));
  // fp32 and TF32 convolutions keep fp32 sums: their inputs are 32-bit, and partial sums in 16
  // bits would cost them far more of their precision than they cost fp16 and bf16.
  spec.allow_reduced_precision = options_.reduced_precision_reductions &&
                                 (x.desc.dtype() == DType::fp16 || x.desc.dtype() == DType::bf16);
  const std::string key = conv_key(spec);
  const ExecutionPlan* plan = conv_plans_.find(key);
  if (plan == nullptr) {
    const std::int64_t uids[] = {kUidX, kUidW, kUidY};
    void* const ptrs[] = {x.data, w.data, y.data};
    DLPROBE_ASSIGN_OR_RETURN(ExecutionPlan built,
                             tuned_conv_plan(spec, key, op, candidate_timer(uids, ptrs, op)));
    log_debug("{}: {} for {}", op, built.engine_name, key);
    plan = &conv_plans_.insert(key, std::move(built));
  }
  const std::int64_t uids[] = {kUidX, kUidW, kUidY};
  void* const ptrs[] = {x.data, w.data, y.data};
  return run_conv_plan(*plan, uids, ptrs, op);
}

Status CudaBackend::conv2d_forward_fused(const TensorView& x, const TensorView& scale,
                                         const TensorView& bias, const TensorView& w,
                                         const TensorView& y, const TensorView& sum,
                                         const TensorView& sqsum, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_forward_fused";
  const bool prologue = scale.data != nullptr;
  const bool stats = sum.data != nullptr;
  DLPROBE_RETURN_IF_ERROR(
      need(prologue == (bias.data != nullptr) && stats == (sqsum.data != nullptr), op,
           "scale and bias come together, and so do sum and sqsum"));
  if (!prologue && !stats) return conv2d_forward(x, w, y, p);
  const TensorView* sums = stats ? &sum : nullptr;
  const TensorView* squares = stats ? &sqsum : nullptr;
  if (prologue) {
    return with_prologue(ConvDirection::forward, x, scale, bias, w, y, sums, squares, p, op);
  }
  return fused_conv(ConvDirection::forward, x, nullptr, nullptr, w, y, sums, squares, p, op);
}

Status CudaBackend::conv2d_forward_finalize_fused(const BatchNormFinalize& f, const TensorView& x,
                                                  const TensorView& w, const TensorView& y,
                                                  const TensorView& sum, const TensorView& sqsum,
                                                  const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_forward_finalize_fused";
  // The pass keeps every channel's scale and bias in shared memory: 48 KiB hold 6,144 channels,
  // beyond any prologue of ResNet's (512). Wider ones take the two calls.
  constexpr std::int64_t kMaxPassChannels = 48 * 1024 / (2 * sizeof(float));
  if (f.scale.data == nullptr || x.desc.rank() != 4 || x.desc.dim(1) > kMaxPassChannels) {
    return Backend::conv2d_forward_finalize_fused(f, x, w, y, sum, sqsum, p);
  }
  DLPROBE_RETURN_IF_ERROR(need_finalize_operands(op, f, x));
  DLPROBE_RETURN_IF_ERROR(need_fused_operands(op, x, w, y));
  const DType pt = conv_prologue_dtype(x.desc.dtype());
  DLPROBE_RETURN_IF_ERROR(
      need(f.scale.desc.dtype() == pt && f.gamma.desc.numel() == x.desc.dim(1), op,
           fmt::format("scale and bias: {}, one value per channel of x", dtype_name(pt))));
  const TensorView* sums = sum.data != nullptr ? &sum : nullptr;
  const TensorView* squares = sum.data != nullptr ? &sqsum : nullptr;
  const auto run = [&](PrologueRoute route, const BatchNormFinalize& fin) -> Status {
    if (route == PrologueRoute::graph) {
      DLPROBE_RETURN_IF_ERROR(launch_batch_norm_finalize(ctx(), fin));
      return fused_conv(ConvDirection::forward, x, &fin.scale, &fin.bias, w, y, sums, squares, p,
                        op);
    }
    // The pass finalizes in its own launch.
    return conv_on_scratch(
        ConvDirection::forward, x,
        [&](const TensorView& input) {
          return launch_finalize_scale_bias_relu(ctx(), fin, x, input);
        },
        w, y, sums, squares, p, op);
  };
  // Timed runs finalize into copies of the running statistics, which every finalize moves: the
  // call below moves them once. Its other outputs come from the sums alone. The copies are made in
  // the first run, which prologue_route does not time, so that both routes' times hold the calls
  // alone.
  BatchNormFinalize copy = f;
  std::optional<Scratch> mean;
  std::optional<Scratch> var;
  const auto timed = [&](PrologueRoute route) -> Status {
    if (!mean) {
      DLPROBE_ASSIGN_OR_RETURN(auto m, scratch(ctx(), f.running_mean.desc.bytes(), op));
      DLPROBE_ASSIGN_OR_RETURN(auto v, scratch(ctx(), f.running_var.desc.bytes(), op));
      mean.emplace(std::move(m));
      var.emplace(std::move(v));
      copy.running_mean.data = mean->data();
      copy.running_var.data = var->data();
      DLPROBE_CUDA_CHECK(cudaMemcpyAsync(mean->data(), f.running_mean.data,
                                         f.running_mean.desc.bytes(), cudaMemcpyDeviceToDevice,
                                         stream()));
      DLPROBE_CUDA_CHECK(cudaMemcpyAsync(var->data(), f.running_var.data,
                                         f.running_var.desc.bytes(), cudaMemcpyDeviceToDevice,
                                         stream()));
    }
    return run(route, copy);
  };
  DLPROBE_ASSIGN_OR_RETURN(
      const PrologueRoute route,
      prologue_route(ConvDirection::forward, x, w, y, sums != nullptr, p, op, timed));
  return run(route, f);
}

Status CudaBackend::conv2d_backward_weight_fused(const TensorView& x, const TensorView& scale,
                                                 const TensorView& bias, const TensorView& dy,
                                                 const TensorView& dw, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_weight_fused";
  return with_prologue(ConvDirection::backward_filter, x, scale, bias, dw, dy, nullptr, nullptr, p,
                       op);
}

Status CudaBackend::with_prologue(ConvDirection direction, const TensorView& x,
                                  const TensorView& scale, const TensorView& bias,
                                  const TensorView& w, const TensorView& y, const TensorView* sum,
                                  const TensorView* sqsum, const Conv2dParams& p,
                                  std::string_view op) {
  DLPROBE_RETURN_IF_ERROR(need_fused_operands(op, x, w, y));
  const auto run = [&](PrologueRoute route) {
    return route == PrologueRoute::graph
               ? fused_conv(direction, x, &scale, &bias, w, y, sum, sqsum, p, op)
               : conv_after_pass(direction, x, scale, bias, w, y, sum, sqsum, p, op);
  };
  DLPROBE_ASSIGN_OR_RETURN(const PrologueRoute route,
                           prologue_route(direction, x, w, y, sum != nullptr, p, op, run));
  return run(route);
}

Status CudaBackend::conv_after_pass(ConvDirection direction, const TensorView& x,
                                    const TensorView& scale, const TensorView& bias,
                                    const TensorView& w, const TensorView& y, const TensorView* sum,
                                    const TensorView* sqsum, const Conv2dParams& p,
                                    std::string_view op) {
  DLPROBE_RETURN_IF_ERROR(need_prologue_operands(op, x, scale, bias));
  return conv_on_scratch(
      direction, x,
      [&](const TensorView& input) { return launch_scale_bias_relu(ctx(), x, scale, bias, input); },
      w, y, sum, sqsum, p, op);
}

Status CudaBackend::conv_on_scratch(ConvDirection direction, const TensorView& x,
                                    const std::function<Status(const TensorView&)>& make_input,
                                    const TensorView& w, const TensorView& y, const TensorView* sum,
                                    const TensorView* sqsum, const Conv2dParams& p,
                                    std::string_view op) {
  DLPROBE_ASSIGN_OR_RETURN(auto buffer, scratch(ctx(), x.desc.bytes(), op));
  const TensorView input{x.desc, buffer.data()};
  DLPROBE_RETURN_IF_ERROR(make_input(input));
  ++prologue_passes_;
  return fused_conv(direction, input, nullptr, nullptr, w, y, sum, sqsum, p, op);
}

std::optional<CudaBackend::PrologueRoute> CudaBackend::fixed_prologue_route(
    const TensorDesc& x) const {
  if (options_.conv_prologue_pass_up_to_bytes &&
      (!options_.conv_prologue_size_rule_up_to_batch ||
       x.dim(0) <= *options_.conv_prologue_size_rule_up_to_batch)) {
    return x.bytes() <= *options_.conv_prologue_pass_up_to_bytes ? PrologueRoute::pass
                                                                 : PrologueRoute::graph;
  }
  if (!options_.conv_prologue_timed || options_.conv_engine == ConvEngineChoice::heuristic) {
    return options_.conv_prologue_pass ? PrologueRoute::pass : PrologueRoute::graph;
  }
  return std::nullopt;
}

// The prologue's route of a call not seen yet: as the options fix it, the tuning cache's record,
// or both routes timed on the call's own buffers, each after an untimed run that builds its plans
// (autotuning a plain convolution times its candidates there) and loads its kernels.
Result<CudaBackend::PrologueRoute> CudaBackend::prologue_route(
    ConvDirection direction, const TensorView& x, const TensorView& w, const TensorView& y,
    bool stats, const Conv2dParams& p, std::string_view op,
    const std::function<Status(PrologueRoute)>& run) {
  if (const std::optional<PrologueRoute> fixed = fixed_prologue_route(x.desc)) return *fixed;
  DLPROBE_ASSIGN_OR_RETURN(const ConvSpec spec, conv_spec(direction, x, w, y, p));
  std::string key = fmt::format("{}{} | {}", op, stats ? " sums" : "", conv_key(spec));
  if (const auto it = prologue_routes_.find(key); it != prologue_routes_.end()) return it->second;
  const std::string tuning_key =
      options_.tuning ? fmt::format("{} | prologue route | {}", tuning_stamp_, key) : std::string();
  if (options_.tuning) {
    if (auto entry = options_.tuning->find(tuning_key);
        entry && entry->engine >= 0 && entry->engine <= 1) {
      const auto route = static_cast<PrologueRoute>(entry->engine);
      prologue_routes_.emplace(std::move(key), route);
      return route;
    }
  }
  // Nothing may wait for the GPU while a graph records; the eager run before it times every call.
  if (recording_ != nullptr) return PrologueRoute::graph;
  // Whatever the other stream still runs would share the GPU with the timed runs.
  DLPROBE_CUDA_CHECK(cudaDeviceSynchronize());
  constexpr int kTimedRuns = 3;
  const auto time_route = [&](PrologueRoute route) -> Result<float> {
    DLPROBE_RETURN_IF_ERROR(run(route));
    DLPROBE_CUDA_CHECK(cudaEventRecord(start_.get(), stream()));
    for (int i = 0; i < kTimedRuns; ++i) DLPROBE_RETURN_IF_ERROR(run(route));
    DLPROBE_CUDA_CHECK(cudaEventRecord(stop_.get(), stream()));
    DLPROBE_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
    float total = 0;
    DLPROBE_CUDA_CHECK(cudaEventElapsedTime(&total, start_.get(), stop_.get()));
    return total / kTimedRuns;
  };
  const Result<float> graph_ms = time_route(PrologueRoute::graph);
  // The pass needs scratch memory as large as x, which a step near its memory limit may lack:
  // a route that fails loses, and only both failing fails the call.
  const Result<float> pass_ms = time_route(PrologueRoute::pass);
  if (!graph_ms && !pass_ms) return graph_ms.status();
  constexpr float kFailed = std::numeric_limits<float>::infinity();
  const std::array<float, 2> ms = {graph_ms.value_or(kFailed), pass_ms.value_or(kFailed)};
  if (!graph_ms || !pass_ms) {
    log_debug("{}: prologue {} failed: {}", key, graph_ms ? "by the pass" : "in cuDNN's graph",
              (graph_ms ? pass_ms : graph_ms).status().message());
  }
  const PrologueRoute route = ms[1] < ms[0] ? PrologueRoute::pass : PrologueRoute::graph;
  log_debug("{}: prologue {:.3f} ms in cuDNN's graph, {:.3f} ms by the pass: {}", key, ms[0], ms[1],
            route == PrologueRoute::pass ? "the pass" : "the graph");
  if (options_.tuning) {
    const auto index = static_cast<std::size_t>(route);
    if (Status s = options_.tuning->record(
            tuning_key,
            {static_cast<std::int64_t>(index),
             {},
             route == PrologueRoute::pass ? "prologue by the pass" : "prologue in the graph",
             ms[index],
             0,
             {}});
        !s.is_ok()) {
      log_warn("{}", s.message());
    }
  }
  prologue_routes_.emplace(std::move(key), route);
  return route;
}

// w is dw and y is dy for the weight gradient; scale and bias (the prologue) absent or both there;
// sum and sqsum for the forward.
Status CudaBackend::fused_conv(ConvDirection direction, const TensorView& x,
                               const TensorView* scale, const TensorView* bias, const TensorView& w,
                               const TensorView& y, const TensorView* sum, const TensorView* sqsum,
                               const Conv2dParams& p, std::string_view op) {
  DLPROBE_RETURN_IF_ERROR(need_fused_operands(op, x, w, y));
  const bool prologue = scale != nullptr && bias != nullptr;
  if (prologue) DLPROBE_RETURN_IF_ERROR(need_prologue_operands(op, x, *scale, *bias));
  const std::int64_t c = x.desc.dim(1);
  const std::int64_t k = w.desc.dim(0);
  const bool stats = sum != nullptr && sqsum != nullptr;
  // The input the prologue would give the convolution by dlprobe's pass, then the convolution
  // without it (the statistics as the options say).
  const auto prologue_apart = [&]() {
    return conv_after_pass(direction, x, *scale, *bias, w, y, sum, sqsum, p, op);
  };
  // The output's sums by dlprobe's pass, after the convolution.
  const auto sums_apart = [&]() -> Status {
    ++sums_passes_;
    return launch_channel_sums(ctx(), y, *sum, *sqsum);
  };
  if (!prologue && !stats) return conv(direction, x, w, y, p, op);
  if (stats) {
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, "sum", *sum));
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, "sqsum", *sqsum));
    DLPROBE_RETURN_IF_ERROR(need(sum->desc.rank() == 1 && sum->desc.numel() == k &&
                                     sqsum->desc.rank() == 1 && sqsum->desc.numel() == k,
                                 op, "sum and sqsum: one value per channel of y"));
  }
  FusedConvSpec spec;
  DLPROBE_ASSIGN_OR_RETURN(spec.conv, conv_spec(direction, x, w, y, p));
  spec.prologue = prologue;
  // A per-channel vector as cuDNN's [1, n, 1, 1], channels innermost.
  auto channels = [](std::int64_t uid, const TensorView& v, std::int64_t n) -> Result<TensorSpec> {
    DLPROBE_ASSIGN_OR_RETURN(cudnnDataType_t type, cudnn_type(v.desc.dtype()));
    TensorSpec s;
    s.uid = uid;
    s.dtype = type;
    s.dims = {1, n, 1, 1};
    s.strides = {n, 1, n, n};
    s.alignment = alignment_of(v.data, 16);
    return s;
  };
  std::vector<std::int64_t> uids = {kUidX, kUidW, kUidY};
  std::vector<void*> ptrs = {x.data, w.data, y.data};
  if (prologue) {
    DLPROBE_ASSIGN_OR_RETURN(spec.scale, channels(kUidScale, *scale, c));
    DLPROBE_ASSIGN_OR_RETURN(spec.bias, channels(kUidBias, *bias, c));
    uids.insert(uids.end(), {kUidScale, kUidBias});
    ptrs.insert(ptrs.end(), {scale->data, bias->data});
  }
  // With the sums pass the graph keeps only the prologue (a plain convolution without one), and
  // dlprobe's pass sums the output after it.
  const bool sums_pass = stats && sums_pass_in(y.desc.dtype());
  if (stats && !sums_pass) {
    DLPROBE_ASSIGN_OR_RETURN(spec.sum, channels(kUidSum, *sum, k));
    DLPROBE_ASSIGN_OR_RETURN(spec.sqsum, channels(kUidSqsum, *sqsum, k));
    uids.insert(uids.end(), {kUidSum, kUidSqsum});
    ptrs.insert(ptrs.end(), {sum->data, sqsum->data});
  }
  if (!prologue && sums_pass) {
    DLPROBE_RETURN_IF_ERROR(conv(direction, x, w, y, p, op));
    return sums_apart();
  }
  // Where cuDNN has no engine for a graph with the prologue (bf16 with fp32 scale and bias, say),
  // the prologue by dlprobe's pass instead, warned once.
  // (The key is made only where some graph was refused: eager steps call this hundreds of times.)
  if (prologue && !unfusable_.empty() && unfusable_.contains(fused_conv_key(spec))) {
    return prologue_apart();
  }
  const Status fused = run_fused(spec, uids, ptrs, op);
  if (prologue && fused.code() == Errc::unsupported) {
    log_warn("{}: {}; the batch norm's apply runs as a pass before the convolution", op,
             fused.message());
    unfusable_.insert(fused_conv_key(spec));
    return prologue_apart();
  }
  DLPROBE_RETURN_IF_ERROR(fused);
  return sums_pass ? sums_apart() : Status::ok();
}

Status CudaBackend::need_fused_operands(std::string_view op, const TensorView& x,
                                        const TensorView& w, const TensorView& y) {
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "x", x));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "w", w));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "y", y));
  const DType t = x.desc.dtype();
  DLPROBE_RETURN_IF_ERROR(need(is_activation(t) && w.desc.dtype() == t && y.desc.dtype() == t, op,
                               "x, w and y: all fp32, all fp16 or all bf16"));
  DLPROBE_RETURN_IF_ERROR(need(x.desc.layout() == Layout::nhwc && w.desc.layout() == Layout::nhwc &&
                                   y.desc.layout() == Layout::nhwc,
                               op, "x, w and y: NHWC"));
  // These calls come from the backend's users directly, not through ops.h's shape checks.
  DLPROBE_RETURN_IF_ERROR(need(x.desc.rank() == 4 && w.desc.rank() == 4 && y.desc.rank() == 4, op,
                               "x, w and y of rank 4"));
  return need(w.desc.dim(1) == x.desc.dim(1) && y.desc.dim(1) == w.desc.dim(0) &&
                  y.desc.dim(0) == x.desc.dim(0),
              op,
              fmt::format("x {}, w {} and y {} do not make a convolution", x.desc.str(),
                          w.desc.str(), y.desc.str()));
}

Status CudaBackend::need_prologue_operands(std::string_view op, const TensorView& x,
                                           const TensorView& scale, const TensorView& bias) const {
  const DType t = x.desc.dtype();
  const DType pt = conv_prologue_dtype(t);
  DLPROBE_RETURN_IF_ERROR(
      need(scale.desc.dtype() == pt && bias.desc.dtype() == pt, op,
           fmt::format("scale and bias: {} for {} x", dtype_name(pt), dtype_name(t))));
  const std::int64_t c = x.desc.dim(1);
  return need(scale.desc.rank() == 1 && scale.desc.numel() == c && bias.desc.rank() == 1 &&
                  bias.desc.numel() == c,
              op, "scale and bias: one value per channel of x");
}

Status CudaBackend::run_fused(const FusedConvSpec& spec, std::span<const std::int64_t> uids,
                              std::span<void* const> ptrs, std::string_view op) {
  const std::string key = fused_conv_key(spec);
  const ExecutionPlan* plan = conv_plans_.find(key);
  if (plan == nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(ExecutionPlan built, fused_conv_plan(spec, key, op, uids, ptrs));
    log_debug("{}: {} for {}", op, built.engine_name, key);
    plan = &conv_plans_.insert(key, std::move(built));
  }
  return run_conv_plan(*plan, uids, ptrs, op);
}

Status CudaBackend::conv2d_backward_data_add_relu(const TensorView& dy, const TensorView& w,
                                                  const TensorView& add, const TensorView& relu_y,
                                                  const TensorView& dx, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_data_add_relu";
  DLPROBE_RETURN_IF_ERROR(need_fused_operands(op, dx, w, dy));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "add", add));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "relu_y", relu_y));
  DLPROBE_RETURN_IF_ERROR(need(add.desc == dx.desc && relu_y.desc == dx.desc, op,
                               fmt::format("add {} and relu_y {}: shaped as dx {}", add.desc.str(),
                                           relu_y.desc.str(), dx.desc.str())));
  FusedConvSpec spec;
  DLPROBE_ASSIGN_OR_RETURN(spec.conv, conv_spec(ConvDirection::backward_data, dx, w, dy, p));
  spec.prologue = false;
  DLPROBE_ASSIGN_OR_RETURN(spec.add, tensor_spec(kUidAdd, add));
  DLPROBE_ASSIGN_OR_RETURN(spec.relu_y, tensor_spec(kUidReluY, relu_y));
  const std::int64_t uids[] = {kUidX, kUidW, kUidY, kUidAdd, kUidReluY};
  void* const ptrs[] = {dx.data, w.data, dy.data, add.data, relu_y.data};
  const std::string key = fused_conv_key(spec);
  if (!unfusable_.contains(key)) {
    Status fused = run_fused(spec, uids, ptrs, op);
    if (fused.code() != Errc::unsupported) return fused;
    log_warn("{}: {}; the data gradient and the ReLU's backward run apart", op, fused.message());
    unfusable_.insert(key);
  }
  // Where cuDNN has no engine for the graph, the two calls it stands for, the data gradient in
  // scratch memory (the step planned no buffer for it).
  DLPROBE_ASSIGN_OR_RETURN(auto buffer, scratch(ctx(), dx.desc.bytes(), op));
  const TensorView grad{dx.desc, buffer.data()};
  DLPROBE_RETURN_IF_ERROR(conv(ConvDirection::backward_data, grad, w, dy, p, op));
  return relu_backward_add(add, grad, relu_y, dx);
}

// A kept plan is cuDNN's whole operation graph (its tensors' uids, its pointwise operations) as
// make_fused_conv_graph built it, which the spec's key does not name: a dlprobe that builds the
// graph otherwise must not load an older one, so this goes up with every such change.
constexpr int kFusedGraphVersion = 1;

// The plan of a fused graph not planned yet: loaded from the tuning cache where it holds the
// serialized plan (no heuristics query, no search over candidates), else built (the heuristics'
// choice, or under exhaustive the one choose_timed_config keeps of all its configurations) and,
// with a cache, recorded there whole.
Result<ExecutionPlan> CudaBackend::fused_conv_plan(const FusedConvSpec& spec,
                                                   const std::string& key, std::string_view op,
                                                   std::span<const std::int64_t> uids,
                                                   std::span<void* const> ptrs) {
  // Exhaustive tuning also times every runtime-compiled configuration of the graph; the others
  // take the first that builds (each compiles for about a second: exhaustive's first run of an
  // fp16 ResNet-50 step took 46 s on an H200 just started, autotune's 9 s).
  const bool tuned = options_.conv_engine == ConvEngineChoice::exhaustive;
  // " timed all": a cache from when exhaustive timed only the first four configurations holds
  // plans of a narrower search, which are tuned again rather than taken; so are those an older
  // rule chose among the timed ones.
  const std::string tuning_key =
      options_.tuning
          ? fmt::format("{} | fused v{}{} | {}", tuning_stamp_, kFusedGraphVersion,
                        tuned ? fmt::format(" timed all, choice v{}", kTimedChoiceVersion) : "",
                        key)
          : std::string();
  if (options_.tuning) {
    if (auto entry = options_.tuning->find(tuning_key); entry && !entry->plan.empty()) {
      auto plan =
          load_fused_conv_plan(cudnn_.get(), spec, entry->plan, options_.max_workspace_bytes);
      if (plan) {
        ++fused_plans_loaded_;
        return plan;
      }
      log_warn("{}: the tuning cache's plan does not load ({}); building it again", op,
               plan.status().message());
      options_.tuning->forget(tuning_key);
    }
  }
  DLPROBE_ASSIGN_OR_RETURN(
      ExecutionPlan built,
      build_fused_conv_plan(cudnn_.get(), spec, options_.max_workspace_bytes,
                            tuned ? candidate_timer(uids, ptrs, op) : PlanTimer{}));
  if (options_.tuning) {
    // A plan cuDNN does not serialize, or a cache that cannot be written, loses only the saving
    // on the next run: say so, go on.
    auto text = serialize_plan(built);
    Status s = text.status();
    if (s.is_ok() && text->empty()) {
      s = error(Errc::unsupported, "cuDNN serialized it as nothing");
    } else if (s.is_ok()) {
      s = options_.tuning->record(tuning_key, {built.engine_index, built.knobs, built.engine_name,
                                               0, built.workspace_bytes, std::move(*text)});
    }
    if (!s.is_ok()) log_warn("{}: the plan is not kept in the tuning cache: {}", op, s.message());
  }
  return built;
}

Result<ConvSpec> CudaBackend::conv_spec(ConvDirection direction, const TensorView& x,
                                        const TensorView& w, const TensorView& y,
                                        const Conv2dParams& p) const {
  ConvSpec spec;
  spec.direction = direction;
  DLPROBE_ASSIGN_OR_RETURN(spec.x, tensor_spec(kUidX, x));
  DLPROBE_ASSIGN_OR_RETURN(spec.w, tensor_spec(kUidW, w));
  DLPROBE_ASSIGN_OR_RETURN(spec.y, tensor_spec(kUidY, y));
  for (int i = 0; i < 2; ++i) {
    spec.pad[i] = p.pad[static_cast<std::size_t>(i)];
    spec.stride[i] = p.stride[static_cast<std::size_t>(i)];
    spec.dilation[i] = p.dilation[static_cast<std::size_t>(i)];
  }
  // fp32 accumulation for every dtype, as autocast's convolutions.
  spec.compute = CUDNN_DATA_FLOAT;
  spec.allow_tf32 = options_.math_mode == MathMode::tf32;
  spec.deterministic = options_.deterministic;
  spec.allow_transforms = options_.transform_engines;
  return spec;
}

Status CudaBackend::run_conv_plan(const ExecutionPlan& plan, std::span<const std::int64_t> uids,
                                  std::span<void* const> ptrs, std::string_view op) {
  last_conv_engine_ = plan.engine_name;
  std::optional<Scratch> holder;
  DLPROBE_ASSIGN_OR_RETURN(void* ws,
                           workspace(static_cast<std::size_t>(plan.workspace_bytes), op, holder));
  return execute_plan(cudnn_.get(), plan, uids, ptrs, ws);
}

Status CudaBackend::conv2d_forward(const TensorView& x, const TensorView& w, const TensorView& y,
                                   const Conv2dParams& p) {
  return conv(ConvDirection::forward, x, w, y, p, "conv2d_forward");
}

Status CudaBackend::conv2d_backward_data(const TensorView& dy, const TensorView& w,
                                         const TensorView& dx, const Conv2dParams& p) {
  return conv(ConvDirection::backward_data, dx, w, dy, p, "conv2d_backward_data");
}

Status CudaBackend::conv2d_backward_weight(const TensorView& x, const TensorView& dy,
                                           const TensorView& dw, const Conv2dParams& p) {
  return conv(ConvDirection::backward_filter, x, dw, dy, p, "conv2d_backward_weight");
}

// ---- batch norm ----
//
// Each pass and its fused form (ReLU, with or without the residual) check and launch alike; the
// fused form only adds the epilogue.

namespace {

// Each per-channel tensor in `ch`: fp32, one element per channel of x.
Status need_channels(std::string_view op, const TensorView& x, NamedTensors ch) {
  for (const auto& [name, t] : ch) {
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, name, *t));
    DLPROBE_RETURN_IF_ERROR(need(
        t->desc.numel() == x.desc.dim(1), op,
        fmt::format("{} has {} elements for {} channels", name, t->desc.numel(), x.desc.dim(1))));
  }
  return Status::ok();
}

Status check_batch_norm(std::string_view op, const TensorView& x, NamedTensors ch) {
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "x", x));
  DLPROBE_RETURN_IF_ERROR(need(x.desc.rank() == 4, op, "x must be rank 4"));
  return need_channels(op, x, ch);
}

// The fused forward's epilogue: the ReLU, after the residual when the step passes one (a residual
// without data is none).
BatchNormEpilogue relu_epilogue(const TensorView& residual) {
  return {residual.data != nullptr ? &residual : nullptr, true};
}

// The batch statistics a training forward saves for the backward.
struct SavedStatistics {
  const TensorView& mean;
  const TensorView& invstd;
};

// The four forwards: their checks, then the training launch when `saved` is given, else the
// inference one (which normalises by the running statistics).
Status forward(const KernelContext& ctx, std::string_view op, const TensorView& x,
               const TensorView& gamma, const TensorView& beta, const TensorView& running_mean,
               const TensorView& running_var, const TensorView& y, const SavedStatistics* saved,
               const BatchNormParams& p, const BatchNormEpilogue& epi) {
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x,
                                           {{"gamma", &gamma},
                                            {"beta", &beta},
                                            {"running_mean", &running_mean},
                                            {"running_var", &running_var}}));
  if (saved != nullptr) {
    DLPROBE_RETURN_IF_ERROR(
        need_channels(op, x, {{"save_mean", &saved->mean}, {"save_invstd", &saved->invstd}}));
  }
  DLPROBE_RETURN_IF_ERROR(need_like(op, "y", y, x));
  if (epi.residual != nullptr) {
    DLPROBE_RETURN_IF_ERROR(need_like(op, "residual", *epi.residual, x));
  }
  if (saved == nullptr) {
    return launch_batch_norm_inference_forward(ctx, x, gamma, beta, running_mean, running_var, y, p,
                                               epi);
  }
  return launch_batch_norm_train_forward(ctx, x, gamma, beta, running_mean, running_var, y,
                                         saved->mean, saved->invstd, p, epi);
}

// `relu_beta`: the fused forward's beta, where dy is the gradient of relu(bn(x)); null for the
// plain backward.
Status backward(const KernelContext& ctx, std::string_view op, const TensorView& dy,
                const TensorView* relu_beta, const TensorView& x, const TensorView& gamma,
                const TensorView& save_mean, const TensorView& save_invstd, const TensorView& dx,
                const TensorView& dgamma, const TensorView& dbeta) {
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x,
                                           {{"gamma", &gamma},
                                            {"save_mean", &save_mean},
                                            {"save_invstd", &save_invstd},
                                            {"dgamma", &dgamma},
                                            {"dbeta", &dbeta}}));
  if (relu_beta != nullptr) DLPROBE_RETURN_IF_ERROR(need_channels(op, x, {{"beta", relu_beta}}));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "dy", dy, x));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "dx", dx, x));
  return launch_batch_norm_backward(ctx, dy, relu_beta, x, gamma, save_mean, save_invstd, dx,
                                    dgamma, dbeta);
}

}  // namespace

Status CudaBackend::batch_norm_train_forward(const TensorView& x, const TensorView& gamma,
                                             const TensorView& beta, const TensorView& running_mean,
                                             const TensorView& running_var, const TensorView& y,
                                             const TensorView& save_mean,
                                             const TensorView& save_invstd,
                                             const BatchNormParams& p) {
  const SavedStatistics saved{save_mean, save_invstd};
  return forward(ctx(), "batch_norm_train_forward", x, gamma, beta, running_mean, running_var, y,
                 &saved, p, {});
}

Status CudaBackend::batch_norm_relu_train_forward(
    const TensorView& x, const TensorView& gamma, const TensorView& beta,
    const TensorView& running_mean, const TensorView& running_var, const TensorView& residual,
    const TensorView& y, const TensorView& save_mean, const TensorView& save_invstd,
    const BatchNormParams& p) {
  const SavedStatistics saved{save_mean, save_invstd};
  return forward(ctx(), "batch_norm_relu_train_forward", x, gamma, beta, running_mean, running_var,
                 y, &saved, p, relu_epilogue(residual));
}

Status CudaBackend::batch_norm_inference_forward(const TensorView& x, const TensorView& gamma,
                                                 const TensorView& beta,
                                                 const TensorView& running_mean,
                                                 const TensorView& running_var, const TensorView& y,
                                                 const BatchNormParams& p) {
  return forward(ctx(), "batch_norm_inference_forward", x, gamma, beta, running_mean, running_var,
                 y, nullptr, p, {});
}

Status CudaBackend::batch_norm_relu_inference_forward(
    const TensorView& x, const TensorView& gamma, const TensorView& beta,
    const TensorView& running_mean, const TensorView& running_var, const TensorView& residual,
    const TensorView& y, const BatchNormParams& p) {
  return forward(ctx(), "batch_norm_relu_inference_forward", x, gamma, beta, running_mean,
                 running_var, y, nullptr, p, relu_epilogue(residual));
}

Status CudaBackend::batch_norm_backward(const TensorView& dy, const TensorView& x,
                                        const TensorView& gamma, const TensorView& save_mean,
                                        const TensorView& save_invstd, const TensorView& dx,
                                        const TensorView& dgamma, const TensorView& dbeta) {
  return backward(ctx(), "batch_norm_backward", dy, nullptr, x, gamma, save_mean, save_invstd, dx,
                  dgamma, dbeta);
}

Status CudaBackend::batch_norm_add_backward(const TensorView& dy, const BatchNormGrads& x,
                                            const BatchNormGrads& r) {
  constexpr std::string_view op = "batch_norm_add_backward";
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x.x,
                                           {{"gamma", &x.gamma},
                                            {"save_mean", &x.save_mean},
                                            {"save_invstd", &x.save_invstd},
                                            {"dgamma", &x.dgamma},
                                            {"dbeta", &x.dbeta},
                                            {"r_gamma", &r.gamma},
                                            {"r_mean", &r.save_mean},
                                            {"r_invstd", &r.save_invstd},
                                            {"r_dgamma", &r.dgamma},
                                            {"r_dbeta", &r.dbeta}}));
  for (const auto& [name, t] :
       NamedTensors{{"dy", &dy}, {"dx", &x.dx}, {"r", &r.x}, {"dr", &r.dx}}) {
    DLPROBE_RETURN_IF_ERROR(need_like(op, name, *t, x.x));
  }
  return launch_batch_norm_add_backward(ctx(), dy, x, r);
}

// The ReLU's decision is recomputed from x (launch_batch_norm_backward), so y, where stored, is
// only checked.
Status CudaBackend::batch_norm_relu_backward(const TensorView& dy, const TensorView& y,
                                             const TensorView& x, const TensorView& gamma,
                                             const TensorView& beta, const TensorView& save_mean,
                                             const TensorView& save_invstd, const TensorView& dx,
                                             const TensorView& dgamma, const TensorView& dbeta) {
  if (y.data != nullptr) DLPROBE_RETURN_IF_ERROR(need_like("batch_norm_relu_backward", "y", y, x));
  return backward(ctx(), "batch_norm_relu_backward", dy, &beta, x, gamma, save_mean, save_invstd,
                  dx, dgamma, dbeta);
}

Status CudaBackend::need_finalize_operands(std::string_view op, const BatchNormFinalize& f) {
  const std::int64_t channels = f.gamma.desc.numel();
  DLPROBE_RETURN_IF_ERROR(
      need(f.count >= 2, op, fmt::format("{} values a channel (at least 2)", f.count)));
  for (const auto& [name, t] : NamedTensors{{"sum", &f.sum},
                                            {"sqsum", &f.sqsum},
                                            {"gamma", &f.gamma},
                                            {"beta", &f.beta},
                                            {"running_mean", &f.running_mean},
                                            {"running_var", &f.running_var},
                                            {"save_mean", &f.save_mean},
                                            {"save_invstd", &f.save_invstd}}) {
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, name, *t));
    DLPROBE_RETURN_IF_ERROR(
        need(t->desc.numel() == channels, op,
             fmt::format("{} has {} elements for {} channels", name, t->desc.numel(), channels)));
  }
  const bool prologue = f.scale.data != nullptr;
  DLPROBE_RETURN_IF_ERROR(
      need(prologue == (f.bias.data != nullptr), op, "scale and bias come together"));
  if (prologue) {
    DLPROBE_RETURN_IF_ERROR(need(f.scale.desc.numel() == channels &&
                                     f.bias.desc.numel() == channels &&
                                     f.scale.desc.dtype() == f.bias.desc.dtype(),
                                 op, "scale and bias: one value per channel, of one dtype"));
  }
  return Status::ok();
}

Status CudaBackend::need_finalize_operands(std::string_view op, const BatchNormFinalize& f,
                                           const TensorView& x) {
  DLPROBE_RETURN_IF_ERROR(need_finalize_operands(op, f));
  const std::int64_t per_channel =
      x.desc.rank() == 4 ? x.desc.dim(0) * x.desc.dim(2) * x.desc.dim(3) : -1;
  return need(f.count == per_channel, op,
              fmt::format("the sums are over {} values a channel; x {} has {}", f.count,
                          x.desc.str(), per_channel));
}

Status CudaBackend::batch_norm_finalize(const BatchNormFinalize& f) {
  DLPROBE_RETURN_IF_ERROR(need_finalize_operands("batch_norm_finalize", f));
  return launch_batch_norm_finalize(ctx(), f);
}

Status CudaBackend::batch_norm_finalize_apply(const BatchNormFinalize& f, const TensorView& x,
                                              const TensorView& residual, const TensorView& y,
                                              bool relu) {
  constexpr std::string_view op = "batch_norm_finalize_apply";
  if (x.desc.layout() != Layout::nhwc) {
    return Backend::batch_norm_finalize_apply(f, x, residual, y, relu);
  }
  DLPROBE_RETURN_IF_ERROR(need_finalize_operands(op, f, x));
  DLPROBE_RETURN_IF_ERROR(need(f.scale.data == nullptr, op, "no prologue's scale and bias"));
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x, {{"gamma", &f.gamma}}));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "y", y, x));
  DLPROBE_RETURN_IF_ERROR(
      need(residual.data == nullptr || relu, op, "a residual comes only with the ReLU"));
  if (residual.data != nullptr) DLPROBE_RETURN_IF_ERROR(need_like(op, "residual", residual, x));
  const BatchNormEpilogue epi = relu ? relu_epilogue(residual) : BatchNormEpilogue{nullptr, false};
  return launch_batch_norm_finalize_apply(ctx(), f, x, y, epi);
}

Status CudaBackend::batch_norm_apply(const TensorView& x, const TensorView& gamma,
                                     const TensorView& beta, const TensorView& save_mean,
                                     const TensorView& save_invstd, const TensorView& residual,
                                     const TensorView& y, bool relu) {
  constexpr std::string_view op = "batch_norm_apply";
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x,
                                           {{"gamma", &gamma},
                                            {"beta", &beta},
                                            {"save_mean", &save_mean},
                                            {"save_invstd", &save_invstd}}));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "y", y, x));
  DLPROBE_RETURN_IF_ERROR(
      need(residual.data == nullptr || relu, op, "a residual comes only with the ReLU"));
  if (residual.data != nullptr) DLPROBE_RETURN_IF_ERROR(need_like(op, "residual", residual, x));
  const BatchNormEpilogue epi = relu ? relu_epilogue(residual) : BatchNormEpilogue{nullptr, false};
  return launch_batch_norm_apply(ctx(), x, gamma, beta, save_mean, save_invstd, y, epi);
}

Status CudaBackend::batch_norm_apply_add(const TensorView& x, const TensorView& gamma,
                                         const TensorView& beta, const TensorView& save_mean,
                                         const TensorView& save_invstd, const TensorView& r,
                                         const TensorView& r_gamma, const TensorView& r_beta,
                                         const TensorView& r_mean, const TensorView& r_invstd,
                                         const TensorView& y) {
  constexpr std::string_view op = "batch_norm_apply_add";
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x,
                                           {{"gamma", &gamma},
                                            {"beta", &beta},
                                            {"save_mean", &save_mean},
                                            {"save_invstd", &save_invstd},
                                            {"r_gamma", &r_gamma},
                                            {"r_beta", &r_beta},
                                            {"r_mean", &r_mean},
                                            {"r_invstd", &r_invstd}}));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "r", r, x));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "y", y, x));
  return launch_batch_norm_apply_add(ctx(), x, {gamma, beta, save_mean, save_invstd}, r,
                                     {r_gamma, r_beta, r_mean, r_invstd}, y);
}

Status CudaBackend::batch_norm_finalize_apply_add(const BatchNormFinalize& f, const TensorView& x,
                                                  const BatchNormFinalize& rf, const TensorView& r,
                                                  const TensorView& y) {
  constexpr std::string_view op = "batch_norm_finalize_apply_add";
  if (x.desc.layout() != Layout::nhwc) {
    return Backend::batch_norm_finalize_apply_add(f, x, rf, r, y);
  }
  for (const auto& [each, of] : {std::pair{&f, &x}, std::pair{&rf, &r}}) {
    DLPROBE_RETURN_IF_ERROR(need_finalize_operands(op, *each, *of));
    DLPROBE_RETURN_IF_ERROR(need(each->scale.data == nullptr, op, "no prologue's scale and bias"));
  }
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x, {{"gamma", &f.gamma}, {"r_gamma", &rf.gamma}}));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "r", r, x));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "y", y, x));
  return launch_batch_norm_finalize_apply_add(ctx(), f, x, rf, r, y);
}

// ---- elementwise, pooling ----

Status CudaBackend::relu_forward(const TensorView& x, const TensorView& y) {
  DLPROBE_RETURN_IF_ERROR(need_elementwise("relu_forward", {{"x", &x}, {"y", &y}}));
  return launch_relu_forward(ctx(), x, y);
}

Status CudaBackend::relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx) {
  DLPROBE_RETURN_IF_ERROR(need_elementwise("relu_backward", {{"dy", &dy}, {"y", &y}, {"dx", &dx}}));
  return launch_relu_backward(ctx(), dy, y, dx);
}

Status CudaBackend::relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                                      const TensorView& dx) {
  DLPROBE_RETURN_IF_ERROR(
      need_elementwise("relu_backward_add", {{"a", &a}, {"b", &b}, {"y", &y}, {"dx", &dx}}));
  return launch_relu_backward_add(ctx(), a, b, y, dx);
}

namespace {

// A max pooling's image and pooled tensor, or their gradients: rank 4 activations of one dtype.
Status need_max_pool(std::string_view op, std::string_view image_name, const TensorView& image,
                     std::string_view pooled_name, const TensorView& pooled) {
  DLPROBE_RETURN_IF_ERROR(need_activation(op, image_name, image));
  DLPROBE_RETURN_IF_ERROR(need_activation(op, pooled_name, pooled));
  DLPROBE_RETURN_IF_ERROR(
      need(image.desc.rank() == 4 && pooled.desc.rank() == 4, op, "rank 4 expected"));
  return need(image.desc.dtype() == pooled.desc.dtype(), op,
              fmt::format("{} and {} differ in dtype", image_name, pooled_name));
}

// A global average pooling's image [N, C, H, W] and pooled [N, C] tensor, or their gradients, of
// one dtype.
Status need_global_avg_pool(std::string_view op, std::string_view image_name,
                            const TensorView& image, std::string_view pooled_name,
                            const TensorView& pooled) {
  DLPROBE_RETURN_IF_ERROR(need_activation(op, image_name, image));
  DLPROBE_RETURN_IF_ERROR(
      need(image.desc.rank() == 4, op, fmt::format("{} must be rank 4", image_name)));
  return need(pooled.data != nullptr && pooled.desc.dtype() == image.desc.dtype() &&
                  pooled.desc.numel() == image.desc.dim(0) * image.desc.dim(1),
              op,
              fmt::format("{} is {} for {} {}", pooled_name, pooled.desc.str(), image_name,
                          image.desc.str()));
}

}  // namespace

Status CudaBackend::max_pool2d_forward(const TensorView& x, const TensorView& y,
                                       const MaxPool2dParams& p) {
  DLPROBE_RETURN_IF_ERROR(need_max_pool("max_pool2d_forward", "x", x, "y", y));
  return launch_max_pool2d_forward(ctx(), x, y, p);
}

Status CudaBackend::max_pool2d_backward(const TensorView& dy, const TensorView& x,
                                        const TensorView& y, const TensorView& dx,
                                        const MaxPool2dParams& p) {
  // y is not needed: the backward finds each window's maximum again in x (see kernels_pool.cu).
  (void)y;
  constexpr std::string_view op = "max_pool2d_backward";
  DLPROBE_RETURN_IF_ERROR(need_max_pool(op, "x", x, "dy", dy));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "dx", dx, x));
  return launch_max_pool2d_backward(ctx(), dy, x, dx, p);
}

Status CudaBackend::max_pool2d_backward_recomputed(const TensorView& dy, const TensorView& bn_x,
                                                   const TensorView& gamma, const TensorView& beta,
                                                   const TensorView& save_mean,
                                                   const TensorView& save_invstd,
                                                   const TensorView& dx, const MaxPool2dParams& p) {
  constexpr std::string_view op = "max_pool2d_backward_recomputed";
  DLPROBE_RETURN_IF_ERROR(need_max_pool(op, "bn_x", bn_x, "dy", dy));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "dx", dx, bn_x));
  DLPROBE_RETURN_IF_ERROR(need_channels(op, bn_x,
                                        {{"gamma", &gamma},
                                         {"beta", &beta},
                                         {"save_mean", &save_mean},
                                         {"save_invstd", &save_invstd}}));
  const PoolInputFromBatchNorm from_bn{
      static_cast<const float*>(save_mean.data), static_cast<const float*>(save_invstd.data),
      static_cast<const float*>(gamma.data), static_cast<const float*>(beta.data)};
  return launch_max_pool2d_backward(ctx(), dy, bn_x, dx, p, &from_bn);
}

bool CudaBackend::fuses_max_pool_batch_norm_backward(const TensorDesc& x,
                                                     const MaxPool2dParams& pool) const {
  return options_.fused_stem_backward && x.rank() == 4 && x.layout() == Layout::nhwc &&
         (x.dtype() == DType::fp32 || x.dtype() == DType::fp16 || x.dtype() == DType::bf16) &&
         x.dim(1) % (16 / static_cast<std::int64_t>(dtype_size(x.dtype()))) == 0 &&
         pool.kernel[0] * pool.kernel[1] <= 255;
}

Status CudaBackend::batch_norm_relu_max_pool_backward(
    const TensorView& dy, const TensorView& positions, const TensorView& x, const TensorView& gamma,
    const TensorView& beta, const TensorView& save_mean, const TensorView& save_invstd,
    const TensorView& dx, const TensorView& dgamma, const TensorView& dbeta,
    const MaxPool2dParams& pool) {
  constexpr std::string_view op = "batch_norm_relu_max_pool_backward";
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x,
                                           {{"gamma", &gamma},
                                            {"beta", &beta},
                                            {"save_mean", &save_mean},
                                            {"save_invstd", &save_invstd},
                                            {"dgamma", &dgamma},
                                            {"dbeta", &dbeta}}));
  DLPROBE_RETURN_IF_ERROR(need_max_pool(op, "x", x, "dy", dy));
  DLPROBE_ASSIGN_OR_RETURN(const Shape pooled, max_pool2d_output_shape(x.desc.shape(), pool));
  DLPROBE_RETURN_IF_ERROR(need(dy.desc.shape() == pooled && dy.desc.layout() == x.desc.layout(), op,
                               fmt::format("dy is {} for x {}", dy.desc.str(), x.desc.str())));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "dx", dx, x));
  DLPROBE_RETURN_IF_ERROR(
      need(fuses_max_pool_batch_norm_backward(x.desc, pool), op,
           fmt::format("needs fused_stem_backward (bench --stem-backward fused), "
                       "NHWC in 16-byte channel packs and windows of at most "
                       "255 positions; x is {}",
                       x.desc.str())));
  if (positions.data != nullptr) {
    DLPROBE_RETURN_IF_ERROR(need_like(op, "positions", positions, dy));
    return launch_batch_norm_relu_backward_from_pool(ctx(), dy, {.values = positions.data}, pool, x,
                                                     gamma, beta, save_mean, save_invstd, dx,
                                                     dgamma, dbeta);
  }
  DLPROBE_ASSIGN_OR_RETURN(auto where,
                           scratch(ctx(), static_cast<std::size_t>(dy.desc.numel()), op));
  auto* bytes = static_cast<std::uint8_t*>(where.data());
  const PoolInputFromBatchNorm from_bn{
      static_cast<const float*>(save_mean.data), static_cast<const float*>(save_invstd.data),
      static_cast<const float*>(gamma.data), static_cast<const float*>(beta.data)};
  DLPROBE_RETURN_IF_ERROR(launch_max_pool2d_positions(ctx(), x, dy.desc, bytes, pool, &from_bn));
  return launch_batch_norm_relu_backward_from_pool(ctx(), dy, {.bytes = bytes}, pool, x, gamma,
                                                   beta, save_mean, save_invstd, dx, dgamma, dbeta);
}

// The statistics pass and its merge, then the pool, which normalises each value it compares: the
// batch norm's output (ResNet-50's stem at batch 256 in fp16: 411 MB) is neither written nor read.
Status CudaBackend::batch_norm_relu_max_pool_train_forward(
    const TensorView& x, const TensorView& gamma, const TensorView& beta,
    const TensorView& running_mean, const TensorView& running_var, const TensorView& y,
    const TensorView& positions, const TensorView& save_mean, const TensorView& save_invstd,
    const BatchNormParams& bn, const MaxPool2dParams& pool) {
  constexpr std::string_view op = "batch_norm_relu_max_pool_train_forward";
  DLPROBE_RETURN_IF_ERROR(check_batch_norm(op, x,
                                           {{"gamma", &gamma},
                                            {"beta", &beta},
                                            {"running_mean", &running_mean},
                                            {"running_var", &running_var},
                                            {"save_mean", &save_mean},
                                            {"save_invstd", &save_invstd}}));
  DLPROBE_RETURN_IF_ERROR(need_max_pool(op, "x", x, "y", y));
  DLPROBE_ASSIGN_OR_RETURN(const Shape pooled, max_pool2d_output_shape(x.desc.shape(), pool));
  DLPROBE_RETURN_IF_ERROR(need(y.desc.shape() == pooled && y.desc.layout() == x.desc.layout(), op,
                               fmt::format("y is {} for x {}", y.desc.str(), x.desc.str())));
  if (positions.data != nullptr) {
    // Checked before the statistics move the running ones: a refused call changes nothing.
    DLPROBE_RETURN_IF_ERROR(need_like(op, "positions", positions, y));
    DLPROBE_RETURN_IF_ERROR(
        need(fuses_max_pool_batch_norm_backward(x.desc, pool) &&
                 aligned_16({x.data, y.data, positions.data}),
             op,
             fmt::format("positions are kept only under fused_stem_backward (bench "
                         "--stem-backward fused), for NHWC in 16-byte channel packs; x is {}",
                         x.desc.str())));
  }
  DLPROBE_RETURN_IF_ERROR(launch_batch_norm_statistics(ctx(), x, running_mean, running_var,
                                                       save_mean, save_invstd, bn));
  const PoolInputFromBatchNorm from_bn{
      static_cast<const float*>(save_mean.data), static_cast<const float*>(save_invstd.data),
      static_cast<const float*>(gamma.data), static_cast<const float*>(beta.data)};
  return launch_max_pool2d_forward(ctx(), x, y, pool, &from_bn, positions.data);
}

Status CudaBackend::add(const TensorView& a, const TensorView& b, const TensorView& y) {
  DLPROBE_RETURN_IF_ERROR(need_elementwise("add", {{"a", &a}, {"b", &b}, {"y", &y}}));
  return launch_add(ctx(), a, b, y);
}

Status CudaBackend::global_avg_pool_forward(const TensorView& x, const TensorView& y) {
  DLPROBE_RETURN_IF_ERROR(need_global_avg_pool("global_avg_pool_forward", "x", x, "y", y));
  return launch_global_avg_pool_forward(ctx(), x, y);
}

Status CudaBackend::global_avg_pool_backward(const TensorView& dy, const TensorView& dx) {
  DLPROBE_RETURN_IF_ERROR(need_global_avg_pool("global_avg_pool_backward", "dx", dx, "dy", dy));
  return launch_global_avg_pool_backward(ctx(), dy, dx);
}

// ---- linear ----

Status CudaBackend::matmul(const Gemm& g, std::string_view op) {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (g.dtype == DType::fp32 && options_.math_mode == MathMode::tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  const cudaDataType_t scale_type = CUDA_R_32F;
  cublasLtMatmulDesc_t desc_raw = nullptr;
  auto make_desc = [&]() -> Status {
    DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_raw, compute, scale_type));
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(make_desc());
  MatmulDesc desc(desc_raw);
  auto set_desc = [&](cublasLtMatmulDescAttributes_t attr, const void* value,
                      std::size_t size) -> Status {
    DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), attr, value, size));
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(set_desc(CUBLASLT_MATMUL_DESC_TRANSA, &g.trans_a, sizeof(g.trans_a)));
  DLPROBE_RETURN_IF_ERROR(set_desc(CUBLASLT_MATMUL_DESC_TRANSB, &g.trans_b, sizeof(g.trans_b)));
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    DLPROBE_RETURN_IF_ERROR(set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    DLPROBE_RETURN_IF_ERROR(set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  }
  const bool na = g.trans_a == CUBLAS_OP_N;
  const bool nb = g.trans_b == CUBLAS_OP_N;
  DLPROBE_ASSIGN_OR_RETURN(auto a, matrix_layout(g.dtype, na ? g.m : g.k, na ? g.k : g.m, g.lda));
  DLPROBE_ASSIGN_OR_RETURN(auto b, matrix_layout(g.dtype, nb ? g.k : g.n, nb ? g.n : g.k, g.ldb));
  DLPROBE_ASSIGN_OR_RETURN(auto d, matrix_layout(g.dtype, g.m, g.n, g.ldd));

  // Algorithms depend on how the buffers are aligned; tell the heuristic, and key the cache on it.
  const auto align_a = static_cast<std::uint32_t>(alignment_of(g.a, 256));
  const auto align_b = static_cast<std::uint32_t>(alignment_of(g.b, 256));
  const auto align_d = static_cast<std::uint32_t>(alignment_of(g.d, 256));
  const std::string key = fmt::format(
      "{} {} {} m{} n{} k{} ld{},{},{} t{} c{} bias{} align{},{},{}", static_cast<int>(g.trans_a),
      static_cast<int>(g.trans_b), op, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, dtype_name(g.dtype),
      static_cast<int>(compute), g.bias != nullptr ? 1 : 0, align_a, align_b, align_d);
  auto found = matmul_algos_.find(key);
  if (found == matmul_algos_.end()) {
    cublasLtMatmulPreference_t pref_raw = nullptr;
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    auto heuristic = [&]() -> Status {
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
      Preference pref(pref_raw);
      const auto max_ws = static_cast<std::uint64_t>(options_.max_workspace_bytes);
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_.get(), desc.get(), a.get(), b.get(),
                                                          d.get(), d.get(), pref.get(), 1, &result,
                                                          &returned));
      return Status::ok();
    };
    DLPROBE_RETURN_IF_ERROR(heuristic());
    if (returned == 0) {
      return error(Errc::unsupported, fmt::format("{}: cuBLASLt has no algorithm for {}", op, key));
    }
    found = matmul_algos_.emplace(key, result).first;
  }
  const cublasLtMatmulHeuristicResult_t& algo = found->second;
  std::optional<Scratch> holder;
  DLPROBE_ASSIGN_OR_RETURN(void* ws, workspace(algo.workspaceSize, op, holder));
  const float alpha = 1.0F;
  const float beta = 0.0F;
  DLPROBE_CUBLAS_CHECK(cublasLtMatmul(lt_.get(), desc.get(), &alpha, g.a, a.get(), g.b, b.get(),
                                      &beta, g.d, d.get(), g.d, d.get(), &algo.algo, ws,
                                      algo.workspaceSize, stream()));
  return Status::ok();
}

// Row-major x [N, IN] is column-major x^T [IN, N], and likewise for every operand, so each
// product is computed transposed: y^T = w x^T is D [OUT, N] = op(A) B with A = w's buffer read as
// [IN, OUT] and transposed.
Status CudaBackend::linear_forward(const TensorView& x, const TensorView& w, const TensorView& b,
                                   const TensorView& y) {
  constexpr std::string_view op = "linear_forward";
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "x", x));
  DLPROBE_RETURN_IF_ERROR(need_same_layout(op, "w", w, x));
  DLPROBE_RETURN_IF_ERROR(need_same_layout(op, "b", b, x));
  DLPROBE_RETURN_IF_ERROR(need_same_layout(op, "y", y, x));
  const std::int64_t n = x.desc.dim(0);
  const std::int64_t in = x.desc.dim(1);
  const std::int64_t out = w.desc.dim(0);
  // The bias rides on cuBLASLt's BIAS epilogue: added to the fp32 accumulator before the one
  // rounding to y's dtype, with no extra pass over y.
  return matmul({CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w.data, in, x.data, in, y.data, out,
                 x.desc.dtype(), b.data},
                op);
}

Status CudaBackend::linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                                    const TensorView& dx, const TensorView& dw,
                                    const TensorView& db) {
  constexpr std::string_view op = "linear_backward";
  DLPROBE_RETURN_IF_ERROR(need_activation(op, "dy", dy));
  for (const auto& [name, t] :
       {std::pair{"x", &x}, {"w", &w}, {"dx", &dx}, {"dw", &dw}, {"db", &db}}) {
    DLPROBE_RETURN_IF_ERROR(need(t->data != nullptr, op, fmt::format("{} has no data", name)));
    DLPROBE_RETURN_IF_ERROR(need_same_layout(op, name, *t, dy));
  }
  const std::int64_t n = x.desc.dim(0);
  const std::int64_t in = x.desc.dim(1);
  const std::int64_t out = w.desc.dim(0);
  const DType t = dy.desc.dtype();
  // dx^T [IN, N] = w^T [IN, OUT] dy^T [OUT, N].
  DLPROBE_RETURN_IF_ERROR(matmul(
      {CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w.data, in, dy.data, out, dx.data, in, t, nullptr},
      "linear_backward_data"));
  // dw^T [IN, OUT] = x^T [IN, N] (dy^T)^T [N, OUT].
  DLPROBE_RETURN_IF_ERROR(matmul(
      {CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x.data, in, dy.data, out, dw.data, in, t, nullptr},
      "linear_backward_weight"));
  // db is a small kernel rather than the BGRADB epilogue: cuBLASLt offers that epilogue only for
  // some type, compute and transpose combinations (not for every one the engine uses), and the
  // sum over N rows of a [N, OUT] matrix is tiny beside the two products.
  return launch_column_sum(ctx(), dy, db);
}

// ---- loss ----

Status CudaBackend::cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                                          const TensorView& loss) {
  constexpr std::string_view op = "cross_entropy_forward";
  DLPROBE_RETURN_IF_ERROR(need_fp32(op, "logits", logits));
  DLPROBE_RETURN_IF_ERROR(need_fp32(op, "loss", loss));
  DLPROBE_RETURN_IF_ERROR(need(labels.data != nullptr, op, "labels has no data"));
  return launch_cross_entropy_forward(ctx(), logits, labels, loss);
}

Status CudaBackend::cross_entropy_backward(const TensorView& logits, const TensorView& labels,
                                           const TensorView& counters, const TensorView& dlogits) {
  constexpr std::string_view op = "cross_entropy_backward";
  DLPROBE_RETURN_IF_ERROR(need_fp32(op, "logits", logits));
  DLPROBE_RETURN_IF_ERROR(need_like(op, "dlogits", dlogits, logits));
  DLPROBE_RETURN_IF_ERROR(need(labels.data != nullptr, op, "labels has no data"));
  if (counters.data != nullptr) DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
  return launch_cross_entropy_backward(ctx(), logits, labels,
                                       static_cast<const StepCounters*>(counters.data), dlogits);
}

// ---- mixed precision, optimizers ----

Status CudaBackend::unscale_gradients(std::span<const TensorView> grads, const TensorView& counters,
                                      const TensorView& found_inf) {
  constexpr std::string_view op = "unscale_gradients";
  DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
  DLPROBE_RETURN_IF_ERROR(need_fp32(op, "found_inf", found_inf));
  std::vector<PackedTensors> groups;
  for (const TensorView& g : grads) {
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, "a gradient", g));
    groups.push_back({{g.data, nullptr, nullptr, nullptr}, g.desc.numel(), 0});
  }
  return launch_unscale(ctx(), pack_multi_tensor(groups),
                        static_cast<const StepCounters*>(counters.data),
                        static_cast<float*>(found_inf.data));
}

namespace {

// The slots as multi-tensor groups, after checking them: fp32 throughout, gradient and state in
// the parameter's shape and layout, and the state the optimizer needs present.
Result<MultiTensorPack> pack_slots(std::string_view op, std::span<const OptimizerSlot> slots,
                                   bool needs_state0, bool needs_state1) {
  std::vector<PackedTensors> groups;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const OptimizerSlot& s = slots[i];
    const std::string where = fmt::format("slot {}", i);
    DLPROBE_RETURN_IF_ERROR(need_fp32(op, where + " param", s.param));
    DLPROBE_RETURN_IF_ERROR(need_like(op, where + " grad", s.grad, s.param));
    if (needs_state0) DLPROBE_RETURN_IF_ERROR(need_like(op, where + " state0", s.state0, s.param));
    if (needs_state1) DLPROBE_RETURN_IF_ERROR(need_like(op, where + " state1", s.state1, s.param));
    groups.push_back({{s.param.data, s.grad.data, needs_state0 ? s.state0.data : nullptr,
                       needs_state1 ? s.state1.data : nullptr},
                      s.param.desc.numel(),
                      0});
  }
  return pack_multi_tensor(groups);
}

Result<const float*> skip_flag(std::string_view op, const TensorView& found_inf) {
  if (found_inf.data == nullptr) return static_cast<const float*>(nullptr);
  DLPROBE_RETURN_IF_ERROR(need_fp32(op, "found_inf", found_inf));
  return static_cast<const float*>(found_inf.data);
}

}  // namespace

Status CudaBackend::sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p,
                             const TensorView& counters, const TensorView& found_inf) {
  constexpr std::string_view op = "sgd_step";
  DLPROBE_RETURN_IF_ERROR(sgd_check(p));
  DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
  DLPROBE_ASSIGN_OR_RETURN(auto pack, pack_slots(op, slots, p.momentum != 0.0, false));
  DLPROBE_ASSIGN_OR_RETURN(const float* skip, skip_flag(op, found_inf));
  return launch_sgd(ctx(), pack, p, static_cast<const StepCounters*>(counters.data), skip);
}

Status CudaBackend::adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p,
                               const TensorView& counters, const TensorView& found_inf) {
  constexpr std::string_view op = "adamw_step";
  DLPROBE_RETURN_IF_ERROR(adamw_check(p));
  DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
  DLPROBE_ASSIGN_OR_RETURN(auto pack, pack_slots(op, slots, true, true));
  DLPROBE_ASSIGN_OR_RETURN(const float* skip, skip_flag(op, found_inf));
  return launch_adamw(ctx(), pack, p, static_cast<const StepCounters*>(counters.data), skip);
}

Status CudaBackend::advance_step(const TensorView& counters, const GradScalerOptions* scaler,
                                 const TensorView& found_inf) {
  constexpr std::string_view op = "advance_step";
  DLPROBE_RETURN_IF_ERROR(step_counters_check(op, counters));
  DLPROBE_ASSIGN_OR_RETURN(const float* found, skip_flag(op, found_inf));
  return launch_advance_step(ctx(), static_cast<StepCounters*>(counters.data), scaler, found);
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, memory::CachingAllocator& allocator,
                                                   CudaBackendOptions options) {
  DLPROBE_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::create(device, allocator, options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace dlprobe
