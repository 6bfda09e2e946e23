#include "cudnn_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "cuda_library_check.h"
#include "dlprobe/core/log.h"
#include "timed_choice.h"

namespace dlprobe::cuda {

Result<BackendDescriptor> BackendDescriptor::create(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = nullptr;
  auto make = [&]() -> Status {
    DLPROBE_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(make());
  return BackendDescriptor(d);
}

BackendDescriptor::BackendDescriptor(BackendDescriptor&& other) noexcept
    : d_(std::exchange(other.d_, nullptr)) {}

BackendDescriptor& BackendDescriptor::operator=(BackendDescriptor&& other) noexcept {
  if (this != &other) {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(other.d_, nullptr);
  }
  return *this;
}

BackendDescriptor::~BackendDescriptor() {
  if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
}

Status BackendDescriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              std::int64_t count, const void* values) {
  DLPROBE_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  return Status::ok();
}

Status BackendDescriptor::set_descriptor(cudnnBackendAttributeName_t name,
                                         const BackendDescriptor& value) {
  cudnnBackendDescriptor_t raw = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

Status BackendDescriptor::finalize() {
  const cudnnStatus_t rc = cudnnBackendFinalize(d_);
  if (rc == CUDNN_STATUS_SUCCESS) return Status::ok();
  // cuDNN refuses an operation or graph it does not take here (statistics over bf16, a pattern
  // no engine of this version fuses) with a status of the bad-parameter or not-supported families
  // (2000s, 3000s): an unsupported error, which lets a fused call run its prologue apart
  // (CudaBackend::fused_conv) instead of failing the step.
  const int family = static_cast<int>(rc) / 1000;
  return api_failure("cuDNN", "cudnnBackendFinalize(d_)", cudnnGetErrorString(rc), __FILE__,
                     __LINE__, family == 2 || family == 3 ? Errc::unsupported : Errc::api_error);
}

namespace {

// cuDNN 9 deprecates the handle attributes in favour of device-property descriptors, but the
// handle form is what every cuDNN 9 release accepts, including the 9.x a user may have installed.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

Result<BackendDescriptor> make_tensor(const TensorSpec& t) {
  if (t.dims.size() != t.strides.size() || t.dims.empty()) {
    return error(Errc::internal, fmt::format("tensor {}: dims and strides differ in rank", t.uid));
  }
  DLPROBE_ASSIGN_OR_RETURN(auto d, BackendDescriptor::create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const auto rank = static_cast<std::int64_t>(t.dims.size());
  const bool is_virtual = t.is_virtual;
  DLPROBE_RETURN_IF_ERROR(d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t.dtype));
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, t.dims.data()));
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, t.strides.data()));
  DLPROBE_RETURN_IF_ERROR(d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid));
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &t.alignment));
  DLPROBE_RETURN_IF_ERROR(d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
  DLPROBE_RETURN_IF_ERROR(d.finalize());
  return d;
}

Result<BackendDescriptor> make_conv_desc(const ConvSpec& s) {
  DLPROBE_ASSIGN_OR_RETURN(auto d, BackendDescriptor::create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t spatial = 2;
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &s.compute));
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
  DLPROBE_RETURN_IF_ERROR(d.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, s.dilation));
  DLPROBE_RETURN_IF_ERROR(
      d.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, s.stride));
  DLPROBE_RETURN_IF_ERROR(d.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, s.pad));
  DLPROBE_RETURN_IF_ERROR(d.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, s.pad));
  DLPROBE_RETURN_IF_ERROR(d.finalize());
  return d;
}

Result<BackendDescriptor> make_conv_op(const ConvSpec& s, const BackendDescriptor& x,
                                       const BackendDescriptor& w, const BackendDescriptor& y,
                                       const BackendDescriptor& conv) {
  struct Attrs {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  Attrs a{};
  switch (s.direction) {
    case ConvDirection::forward:
      a = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
      break;
    case ConvDirection::backward_data:
      a = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
      break;
    case ConvDirection::backward_filter:
      a = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
      break;
  }
  DLPROBE_ASSIGN_OR_RETURN(auto op, BackendDescriptor::create(a.type));
  DLPROBE_RETURN_IF_ERROR(op.set_descriptor(a.x, x));
  DLPROBE_RETURN_IF_ERROR(op.set_descriptor(a.w, w));
  DLPROBE_RETURN_IF_ERROR(op.set_descriptor(a.y, y));
  DLPROBE_RETURN_IF_ERROR(op.set_descriptor(a.conv, conv));
  // Scaling factors take the compute type's host type: double for double compute, else float.
  if (s.compute == CUDNN_DATA_DOUBLE) {
    const double alpha = 1.0;
    const double beta = 0.0;
    DLPROBE_RETURN_IF_ERROR(op.set(a.alpha, CUDNN_TYPE_DOUBLE, 1, &alpha));
    DLPROBE_RETURN_IF_ERROR(op.set(a.beta, CUDNN_TYPE_DOUBLE, 1, &beta));
  } else {
    const float alpha = 1.0F;
    const float beta = 0.0F;
    DLPROBE_RETURN_IF_ERROR(op.set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
    DLPROBE_RETURN_IF_ERROR(op.set(a.beta, CUDNN_TYPE_FLOAT, 1, &beta));
  }
  DLPROBE_RETURN_IF_ERROR(op.finalize());
  return op;
}

// Whether an engine carries the runtime-compilation behaviour note.
bool compiles_at_runtime(const BackendDescriptor& engine) {
  cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                               CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &count,
                               notes) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  return std::find(notes, notes + std::min<std::int64_t>(count, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT),
                   CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) !=
         notes + std::min<std::int64_t>(count, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
}

// The numerical notes of the engine behind an engine configuration, its global index, and
// whether it compiles its kernels at plan time.
Result<std::vector<cudnnBackendNumericalNote_t>> engine_notes(const BackendDescriptor& cfg,
                                                              std::int64_t& global_index,
                                                              bool& runtime_compiled) {
  DLPROBE_ASSIGN_OR_RETURN(auto engine, BackendDescriptor::create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  cudnnBackendDescriptor_t raw = engine.get();
  std::int64_t count = 0;
  auto read = [&]() -> Status {
    DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw));
    DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                                 CUDNN_TYPE_INT64, 1, &count, &global_index));
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(read());
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  auto read_notes = [&]() -> Status {
    DLPROBE_CUDNN_CHECK(
        cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 static_cast<std::int64_t>(notes.size()), &count, notes.data()));
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(read_notes());
  notes.resize(static_cast<std::size_t>(count));
  runtime_compiled = compiles_at_runtime(engine);
  return notes;
}

// Whether an engine with these numerical notes may run `spec`. Reduced-precision reductions (16-bit
// partial sums) only when the spec allows them, as cudnn.benchmark does. FFT and Winograd,
// whose transformed operands carry rounding error beyond that of a direct sum, and
// non-deterministic engines only when the spec allows them. Strict fp32 also rules out tensor
// cores (TF32) and down-converted inputs.
bool engine_allowed(const ConvSpec& spec, const std::vector<cudnnBackendNumericalNote_t>& notes) {
  for (cudnnBackendNumericalNote_t n : notes) {
    switch (n) {
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        if (!spec.allow_reduced_precision) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_FFT:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
        if (!spec.allow_transforms) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        if (spec.deterministic) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
        if (strict_fp32(spec)) return false;
        break;
      default:
        break;
    }
  }
  return true;
}

std::string engine_label(std::int64_t index,
                         const std::vector<cudnnBackendNumericalNote_t>& notes) {
  static constexpr const char* kNames[] = {"tensor_core",
                                           "down_convert_inputs",
                                           "reduced_precision_reduction",
                                           "fft",
                                           "nondeterministic",
                                           "winograd",
                                           "winograd_4x4",
                                           "winograd_6x6",
                                           "winograd_13x13",
                                           "strict_nan_prop"};
  std::vector<std::string> names;
  for (cudnnBackendNumericalNote_t n : notes) {
    const auto i = static_cast<std::size_t>(n);
    names.push_back(i < std::size(kNames) ? kNames[i] : fmt::format("note{}", i));
  }
  return fmt::format("eng{} [{}]", index, fmt::join(names, ","));
}

// The knob choices of an engine configuration (the heuristics tune them per shape). None when
// cuDNN does not report them; the configuration then replays with the engine's defaults.
// cuDNN fills knob-choice descriptors the caller created, so as many as there are knob types are
// offered. Asking for the count first (zero elements) reported none on cuDNN 9.19: the first H200
// run recorded every choice without its knobs, and replays at the engines' defaults ran fp16
// ResNet-50 at a quarter of the tuned speed.
std::vector<ConvKnob> read_knobs(const BackendDescriptor& cfg) {
  constexpr std::int64_t count = CUDNN_KNOB_TYPE_COUNTS;
  std::vector<BackendDescriptor> choices;
  std::vector<cudnnBackendDescriptor_t> raws;
  for (std::int64_t i = 0; i < count; ++i) {
    auto d = BackendDescriptor::create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    if (!d) return {};
    raws.push_back(d->get());
    choices.push_back(std::move(d).value());
  }
  std::int64_t returned = 0;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                               raws.data()) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  std::vector<ConvKnob> knobs;
  for (std::int64_t i = 0; i < std::min(returned, count); ++i) {
    cudnnBackendKnobType_t type{};
    std::int64_t value = 0;
    std::int64_t n = 0;
    if (cudnnBackendGetAttribute(raws[static_cast<std::size_t>(i)],
                                 CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n,
                                 &type) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(raws[static_cast<std::size_t>(i)],
                                 CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n,
                                 &value) != CUDNN_STATUS_SUCCESS) {
      return {};
    }
    knobs.push_back({static_cast<std::int64_t>(type), value});
  }
  // By type, so that two configurations with the same choices compare equal.
  std::sort(knobs.begin(), knobs.end(),
            [](const ConvKnob& a, const ConvKnob& b) { return a.type < b.type; });
  return knobs;
}

// "eng<index> [notes]", and the knob choices as {type=value,...} when there are any.
std::string config_label(std::int64_t index, const std::vector<cudnnBackendNumericalNote_t>& notes,
                         const std::vector<ConvKnob>& knobs) {
  std::string label = engine_label(index, notes);
  if (knobs.empty()) return label;
  std::vector<std::string> parts;
  for (const ConvKnob& k : knobs) parts.push_back(fmt::format("{}={}", k.type, k.value));
  return fmt::format("{} {{{}}}", label, fmt::join(parts, ","));
}

}  // namespace

bool strict_fp32(const ConvSpec& s) {
  return s.x.dtype == CUDNN_DATA_FLOAT && s.compute == CUDNN_DATA_FLOAT && !s.allow_tf32;
}

std::string conv_key(const ConvSpec& s) {
  auto tensor = [](const TensorSpec& t) {
    return fmt::format("{}:[{}]/[{}]@{}", static_cast<int>(t.dtype), fmt::join(t.dims, ","),
                       fmt::join(t.strides, ","), t.alignment);
  };
  return fmt::format("conv{} x{} w{} y{} p{},{} s{},{} d{},{} c{} tf32={} det={} tr={} rp={}",
                     static_cast<int>(s.direction), tensor(s.x), tensor(s.w), tensor(s.y), s.pad[0],
                     s.pad[1], s.stride[0], s.stride[1], s.dilation[0], s.dilation[1],
                     static_cast<int>(s.compute), s.allow_tf32 ? 1 : 0, s.deterministic ? 1 : 0,
                     s.allow_transforms ? 1 : 0, s.allow_reduced_precision ? 1 : 0);
}

bool has_sums(const FusedConvSpec& spec) {
  return !spec.sum.dims.empty();
}

std::string fused_conv_key(const FusedConvSpec& s) {
  auto tensor = [](const TensorSpec& t) {
    return fmt::format("{}:[{}]@{}", static_cast<int>(t.dtype), fmt::join(t.dims, ","),
                       t.alignment);
  };
  const std::string prologue =
      s.prologue ? fmt::format("bn-relu scale{} bias{}>", tensor(s.scale), tensor(s.bias))
                 : std::string();
  std::string epilogue;
  if (s.conv.direction == ConvDirection::forward && has_sums(s)) {
    epilogue = fmt::format(">stats sum{} sqsum{}", tensor(s.sum), tensor(s.sqsum));
  } else if (s.conv.direction == ConvDirection::backward_data) {
    epilogue = fmt::format(">add{} relu-bwd{}", tensor(s.add), tensor(s.relu_y));
  }
  return fmt::format("{}{}{}", prologue, conv_key(s.conv), epilogue);
}

namespace {

// An operation graph and every descriptor it refers to, kept alive with it.
struct OpGraph {
  std::vector<BackendDescriptor> parts;
  BackendDescriptor graph;
};

// The graph of `ops` (their descriptors move into the result's parts).
Result<OpGraph> finish_graph(cudnnHandle_t handle, std::vector<BackendDescriptor> parts,
                             std::span<const std::size_t> ops) {
  OpGraph g{std::move(parts), {}};
  std::vector<cudnnBackendDescriptor_t> raws;
  for (std::size_t i : ops) raws.push_back(g.parts[i].get());
  DLPROBE_ASSIGN_OR_RETURN(g.graph,
                           BackendDescriptor::create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  DLPROBE_RETURN_IF_ERROR(g.graph.set(kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle));
  DLPROBE_RETURN_IF_ERROR(g.graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      static_cast<std::int64_t>(raws.size()), raws.data()));
  DLPROBE_RETURN_IF_ERROR(g.graph.finalize());
  return g;
}

Result<OpGraph> make_conv_graph(cudnnHandle_t handle, const ConvSpec& spec) {
  std::vector<BackendDescriptor> parts;
  DLPROBE_ASSIGN_OR_RETURN(auto x, make_tensor(spec.x));
  DLPROBE_ASSIGN_OR_RETURN(auto w, make_tensor(spec.w));
  DLPROBE_ASSIGN_OR_RETURN(auto y, make_tensor(spec.y));
  DLPROBE_ASSIGN_OR_RETURN(auto conv, make_conv_desc(spec));
  DLPROBE_ASSIGN_OR_RETURN(auto op, make_conv_op(spec, x, w, y, conv));
  parts.push_back(std::move(op));
  parts.push_back(std::move(x));
  parts.push_back(std::move(w));
  parts.push_back(std::move(y));
  parts.push_back(std::move(conv));
  const std::size_t ops[] = {0};
  return finish_graph(handle, std::move(parts), ops);
}

// A pointwise operation of `mode`, computed in fp32, over the tensors given by their attributes
// (XDESC, BDESC and YDESC forward; DYDESC, XDESC and DXDESC for a backward mode); null ones are
// left out.
using PointwiseTensors =
    std::initializer_list<std::pair<cudnnBackendAttributeName_t, const BackendDescriptor*>>;
Result<BackendDescriptor> make_pointwise(cudnnPointwiseMode_t mode, PointwiseTensors tensors,
                                         std::vector<BackendDescriptor>& parts) {
  DLPROBE_ASSIGN_OR_RETURN(auto pw, BackendDescriptor::create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  DLPROBE_RETURN_IF_ERROR(pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  DLPROBE_RETURN_IF_ERROR(
      pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision));
  DLPROBE_RETURN_IF_ERROR(pw.finalize());
  DLPROBE_ASSIGN_OR_RETURN(auto op,
                           BackendDescriptor::create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
  DLPROBE_RETURN_IF_ERROR(op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
  for (const auto& [attribute, tensor] : tensors) {
    if (tensor != nullptr) DLPROBE_RETURN_IF_ERROR(op.set_descriptor(attribute, *tensor));
  }
  DLPROBE_RETURN_IF_ERROR(op.finalize());
  parts.push_back(std::move(pw));
  return op;
}

// y = x <mode> b (b absent for a unary mode).
Result<BackendDescriptor> make_pointwise_op(cudnnPointwiseMode_t mode, const BackendDescriptor& x,
                                            const BackendDescriptor* b, const BackendDescriptor& y,
                                            std::vector<BackendDescriptor>& parts) {
  return make_pointwise(mode,
                        {{CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &x},
                         {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
                         {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &y}},
                        parts);
}

// Uids of the fused graph's virtual tensors, above any the caller gives its tensors.
constexpr std::int64_t kUidScaled = 1'000'001;
constexpr std::int64_t kUidBiased = 1'000'002;
constexpr std::int64_t kUidActivated = 1'000'003;
constexpr std::int64_t kUidDataGradient = 1'000'004;
constexpr std::int64_t kUidSummed = 1'000'005;

// A virtual fp32 tensor shaped as `like`: an intermediate of a fused graph, kept in registers.
Result<BackendDescriptor> make_intermediate(const TensorSpec& like, std::int64_t uid) {
  TensorSpec t = like;
  t.uid = uid;
  t.dtype = CUDNN_DATA_FLOAT;
  t.is_virtual = true;
  return make_tensor(t);
}

// The data gradient with the add and ReLU backward in its epilogue (FusedConvSpec).
Result<OpGraph> make_dgrad_add_relu_graph(cudnnHandle_t handle, const FusedConvSpec& spec) {
  std::vector<BackendDescriptor> parts;
  DLPROBE_ASSIGN_OR_RETURN(auto dx, make_tensor(spec.conv.x));
  DLPROBE_ASSIGN_OR_RETURN(auto w, make_tensor(spec.conv.w));
  DLPROBE_ASSIGN_OR_RETURN(auto dy, make_tensor(spec.conv.y));
  DLPROBE_ASSIGN_OR_RETURN(auto add, make_tensor(spec.add));
  DLPROBE_ASSIGN_OR_RETURN(auto relu_y, make_tensor(spec.relu_y));
  DLPROBE_ASSIGN_OR_RETURN(auto conv, make_conv_desc(spec.conv));
  DLPROBE_ASSIGN_OR_RETURN(auto grad, make_intermediate(spec.conv.x, kUidDataGradient));
  DLPROBE_ASSIGN_OR_RETURN(auto summed, make_intermediate(spec.conv.x, kUidSummed));
  std::vector<BackendDescriptor> all;  // the operations first: the graph lists them by position
  DLPROBE_ASSIGN_OR_RETURN(auto dgrad, make_conv_op(spec.conv, grad, w, dy, conv));
  all.push_back(std::move(dgrad));
  DLPROBE_ASSIGN_OR_RETURN(auto sum,
                           make_pointwise_op(CUDNN_POINTWISE_ADD, grad, &add, summed, parts));
  all.push_back(std::move(sum));
  // cuDNN's ReLU backward passes dy where x > 0; x may be the ReLU's output, positive where its
  // input was.
  DLPROBE_ASSIGN_OR_RETURN(auto mask,
                           make_pointwise(CUDNN_POINTWISE_RELU_BWD,
                                          {{CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, &summed},
                                           {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &relu_y},
                                           {CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, &dx}},
                                          parts));
  all.push_back(std::move(mask));
  const std::size_t ops[] = {0, 1, 2};
  for (BackendDescriptor* d : {&dx, &w, &dy, &add, &relu_y, &conv, &grad, &summed}) {
    all.push_back(std::move(*d));
  }
  for (auto& d : parts) all.push_back(std::move(d));
  return finish_graph(handle, std::move(all), ops);
}

Result<OpGraph> make_fused_conv_graph(cudnnHandle_t handle, const FusedConvSpec& spec) {
  const bool forward = spec.conv.direction == ConvDirection::forward;
  if (spec.conv.direction == ConvDirection::backward_data && !spec.prologue) {
    return make_dgrad_add_relu_graph(handle, spec);
  }
  if (!((forward && (spec.prologue || has_sums(spec))) ||
        (spec.prologue && spec.conv.direction == ConvDirection::backward_filter))) {
    return error(Errc::internal,
                 "a fused convolution runs forward with the batch norm's apply or the statistics "
                 "of its output, as a weight gradient with the apply, or as a data gradient with "
                 "the add and ReLU backward");
  }
  // The operations first (the graph lists them by position), then what they refer to.
  std::vector<BackendDescriptor> ops;
  std::vector<BackendDescriptor> parts;
  DLPROBE_ASSIGN_OR_RETURN(auto x, make_tensor(spec.conv.x));
  DLPROBE_ASSIGN_OR_RETURN(auto w, make_tensor(spec.conv.w));
  DLPROBE_ASSIGN_OR_RETURN(auto y, make_tensor(spec.conv.y));
  DLPROBE_ASSIGN_OR_RETURN(auto conv, make_conv_desc(spec.conv));
  // What the convolution reads: x, or relu(x * scale + bias) with the prologue, whose
  // intermediates stay in fp32, in registers (virtual tensors shaped as x).
  const BackendDescriptor* input = &x;
  BackendDescriptor activated;
  if (spec.prologue) {
    DLPROBE_ASSIGN_OR_RETURN(auto scale, make_tensor(spec.scale));
    DLPROBE_ASSIGN_OR_RETURN(auto bias, make_tensor(spec.bias));
    DLPROBE_ASSIGN_OR_RETURN(auto scaled, make_intermediate(spec.conv.x, kUidScaled));
    DLPROBE_ASSIGN_OR_RETURN(auto biased, make_intermediate(spec.conv.x, kUidBiased));
    DLPROBE_ASSIGN_OR_RETURN(activated, make_intermediate(spec.conv.x, kUidActivated));
    DLPROBE_ASSIGN_OR_RETURN(auto mul,
                             make_pointwise_op(CUDNN_POINTWISE_MUL, x, &scale, scaled, parts));
    DLPROBE_ASSIGN_OR_RETURN(auto add,
                             make_pointwise_op(CUDNN_POINTWISE_ADD, scaled, &bias, biased, parts));
    DLPROBE_ASSIGN_OR_RETURN(
        auto relu, make_pointwise_op(CUDNN_POINTWISE_RELU_FWD, biased, nullptr, activated, parts));
    ops.push_back(std::move(mul));
    ops.push_back(std::move(add));
    ops.push_back(std::move(relu));
    for (BackendDescriptor* d : {&scale, &bias, &scaled, &biased}) parts.push_back(std::move(*d));
    input = &activated;
  }
  // Forward: y = conv(input, w). Weight gradient: w is dw and y is dy.
  DLPROBE_ASSIGN_OR_RETURN(auto main_op, make_conv_op(spec.conv, *input, w, y, conv));
  ops.push_back(std::move(main_op));
  if (forward && has_sums(spec)) {
    DLPROBE_ASSIGN_OR_RETURN(auto sum, make_tensor(spec.sum));
    DLPROBE_ASSIGN_OR_RETURN(auto sqsum, make_tensor(spec.sqsum));
    DLPROBE_ASSIGN_OR_RETURN(
        auto stats, BackendDescriptor::create(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR));
    const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    DLPROBE_RETURN_IF_ERROR(
        stats.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode));
    DLPROBE_RETURN_IF_ERROR(
        stats.set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    DLPROBE_RETURN_IF_ERROR(stats.set_descriptor(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y));
    DLPROBE_RETURN_IF_ERROR(stats.set_descriptor(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum));
    DLPROBE_RETURN_IF_ERROR(stats.set_descriptor(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum));
    DLPROBE_RETURN_IF_ERROR(stats.finalize());
    ops.push_back(std::move(stats));
    parts.push_back(std::move(sum));
    parts.push_back(std::move(sqsum));
  }
  const std::size_t op_count = ops.size();
  std::vector<BackendDescriptor> all = std::move(ops);
  for (BackendDescriptor* d : {&x, &w, &y, &conv, &activated}) all.push_back(std::move(*d));
  for (auto& d : parts) all.push_back(std::move(d));
  std::vector<std::size_t> op_positions(op_count);
  for (std::size_t i = 0; i < op_count; ++i) op_positions[i] = i;
  return finish_graph(handle, std::move(all), op_positions);
}

// Engine `index` of cuDNN's global list with these knob choices (none: its defaults), or nullopt
// when it does not take the graph or the choices. The engine and knob descriptors are returned
// beside the configuration, which refers to them.
struct EngineConfig {
  BackendDescriptor engine;
  std::vector<BackendDescriptor> knobs;
  BackendDescriptor cfg;
};
Result<std::optional<EngineConfig>> engine_config(const BackendDescriptor& graph,
                                                  std::int64_t index,
                                                  const std::vector<ConvKnob>& knobs = {}) {
  EngineConfig ec;
  DLPROBE_ASSIGN_OR_RETURN(ec.engine, BackendDescriptor::create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  if (!ec.engine.set_descriptor(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph).is_ok() ||
      !ec.engine.set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index).is_ok() ||
      !ec.engine.finalize().is_ok()) {
    return std::optional<EngineConfig>{};
  }
  std::vector<cudnnBackendDescriptor_t> raws;
  for (const ConvKnob& k : knobs) {
    DLPROBE_ASSIGN_OR_RETURN(auto choice,
                             BackendDescriptor::create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    const auto type = static_cast<cudnnBackendKnobType_t>(k.type);
    if (!choice.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type).is_ok() ||
        !choice.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &k.value).is_ok() ||
        !choice.finalize().is_ok()) {
      return std::optional<EngineConfig>{};
    }
    raws.push_back(choice.get());
    ec.knobs.push_back(std::move(choice));
  }
  DLPROBE_ASSIGN_OR_RETURN(ec.cfg, BackendDescriptor::create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  if (!ec.cfg.set_descriptor(CUDNN_ATTR_ENGINECFG_ENGINE, ec.engine).is_ok() ||
      (!raws.empty() && !ec.cfg
                             .set(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                  static_cast<std::int64_t>(raws.size()), raws.data())
                             .is_ok()) ||
      !ec.cfg.finalize().is_ok()) {
    return std::optional<EngineConfig>{};
  }
  return std::optional<EngineConfig>{std::move(ec)};
}

// How many engines cuDNN's global list holds for an operation graph.
Result<std::int64_t> global_engine_count(const BackendDescriptor& graph) {
  std::int64_t engines = 0;
  std::int64_t n = 0;
  DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(graph.get(),
                                               CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                               CUDNN_TYPE_INT64, 1, &n, &engines));
  return engines;
}

// The execution plan of an engine configuration whose knob choices are `knobs` (for its label and
// to rebuild it), or nullopt when it cannot run here (the plan does not finalize, or it needs more
// workspace than allowed). `key` names the graph in the log.
Result<std::optional<ExecutionPlan>> make_plan(
    cudnnHandle_t handle, const BackendDescriptor& cfg, std::int64_t index,
    const std::vector<cudnnBackendNumericalNote_t>& notes, std::vector<ConvKnob> knobs,
    std::int64_t max_workspace_bytes, std::string_view key) {
  DLPROBE_ASSIGN_OR_RETURN(auto plan_desc,
                           BackendDescriptor::create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  cudnnBackendDescriptor_t cfg_raw = cfg.get();
  DLPROBE_RETURN_IF_ERROR(plan_desc.set(kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle));
  DLPROBE_RETURN_IF_ERROR(plan_desc.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg_raw));
  std::string label = config_label(index, notes, knobs);
  if (const Status finalized = plan_desc.finalize(); !finalized.is_ok()) {
    log_debug("conv candidate {} for {} left out: {}", label, key, finalized.message());
    return std::optional<ExecutionPlan>{};
  }
  ExecutionPlan plan{std::move(plan_desc), 0, std::move(label), index, 0, std::move(knobs)};
  std::int64_t n = 0;
  if (const cudnnStatus_t got =
          cudnnBackendGetAttribute(plan.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                   CUDNN_TYPE_INT64, 1, &n, &plan.workspace_bytes);
      got != CUDNN_STATUS_SUCCESS) {
    log_debug("conv candidate {} for {} left out: its workspace size is unknown ({})",
              plan.engine_name, key, cudnnGetErrorString(got));
    return std::optional<ExecutionPlan>{};
  }
  if (plan.workspace_bytes > max_workspace_bytes) {
    // Logged because a configuration left out here is one the timing never sees: cudnn.benchmark
    // may run it for PyTorch where the cap kept it from dlprobe.
    log_debug("conv candidate {} for {} left out: it needs {} bytes of workspace, the cap is {}",
              plan.engine_name, key, plan.workspace_bytes, max_workspace_bytes);
    return std::optional<ExecutionPlan>{};
  }
  return std::optional<ExecutionPlan>{std::move(plan)};
}

}  // namespace

namespace {

// The plan for graph `g`, as build_conv_plan describes; `spec` is the convolution whose numerical
// policy the engines must meet, `key` names the graph in errors.
// `time_runtime_compiled`: with a timer, the runtime-compiled configurations are timed as well (a
// fused graph's, which only they take); otherwise a plain convolution tries them only where
// nothing else built.
Result<ExecutionPlan> plan_for_graph(cudnnHandle_t handle, const OpGraph& g, const ConvSpec& spec,
                                     const std::string& key, ConvEngineChoice choice,
                                     std::int64_t max_workspace_bytes, const PlanTimer& timer,
                                     bool time_runtime_compiled = false) {
  // Heuristics mode A ranks the engines; when they are to be timed, mode B (a costlier model of
  // the same engines, which may rank other knob choices) and the fallback list add the
  // configurations A leaves out.
  std::vector<BackendDescriptor> configs;
  std::vector<cudnnBackendHeurMode_t> modes{CUDNN_HEUR_MODE_A};
  if (choice != ConvEngineChoice::heuristic && timer) modes.push_back(CUDNN_HEUR_MODE_B);
  modes.push_back(CUDNN_HEUR_MODE_FALLBACK);
  for (cudnnBackendHeurMode_t mode : modes) {
    DLPROBE_ASSIGN_OR_RETURN(auto heur,
                             BackendDescriptor::create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
    DLPROBE_RETURN_IF_ERROR(heur.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph));
    DLPROBE_RETURN_IF_ERROR(heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    if (!heur.finalize().is_ok()) continue;  // a mode may not apply to this graph
    std::int64_t available = 0;
    auto count_results = [&]() -> Status {
      DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available,
                                                   nullptr));
      return Status::ok();
    };
    DLPROBE_RETURN_IF_ERROR(count_results());
    std::vector<BackendDescriptor> batch;
    std::vector<cudnnBackendDescriptor_t> raws;
    for (std::int64_t i = 0; i < available; ++i) {
      DLPROBE_ASSIGN_OR_RETURN(auto cfg,
                               BackendDescriptor::create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raws.push_back(cfg.get());
      batch.push_back(std::move(cfg));
    }
    std::int64_t returned = 0;
    auto fill = [&]() -> Status {
      DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, available,
                                                   &returned, raws.data()));
      return Status::ok();
    };
    DLPROBE_RETURN_IF_ERROR(fill());
    batch.resize(static_cast<std::size_t>(std::min(returned, available)));
    for (auto& cfg : batch) configs.push_back(std::move(cfg));
  }
  // The exhaustive mode also tries every engine cuDNN has for the graph, with its default knobs,
  // as cudnn-frontend's exhaustive mode does, in case the heuristics' lists miss a fast engine
  // (fp32 weight gradients ran at ~40 % of the forward's rate on an H200 with them).
  const std::size_t ranked_configs = configs.size();
  std::vector<BackendDescriptor> engine_descs;  // kept while the configurations refer to them
  if (choice == ConvEngineChoice::exhaustive) {
    // Without the count the heuristics' lists stand alone.
    const std::int64_t engines = global_engine_count(g.graph).value_or(0);
    for (std::int64_t index = 0; index < engines; ++index) {
      DLPROBE_ASSIGN_OR_RETURN(auto ec, engine_config(g.graph, index));
      // Engines that compile their kernels at plan time (NVRTC) take seconds each: with them,
      // autotuning ResNet-50 took over a minute on an H200. The heuristics' lists keep them as
      // the last resort (below).
      if (!ec || compiles_at_runtime(ec->engine)) continue;
      configs.push_back(std::move(ec->cfg));
      engine_descs.push_back(std::move(ec->engine));
    }
  }

  // The allowed configurations, once each, in heuristic order; where tensor cores may run (fp16,
  // bf16, fp32 under TF32) those using them come first. They keep the products' fp32 sums in
  // registers until the one final rounding, and they are the fast ones; engines without them are
  // the fallback for shapes they cannot take.
  struct Candidate {
    const BackendDescriptor* cfg;
    std::int64_t index;
    std::vector<ConvKnob> knobs;
    std::vector<cudnnBackendNumericalNote_t> notes;
    bool ranked;       // offered by the heuristics, not only by the exhaustive list
    bool last_resort;  // tried only when no other engine builds (below)
  };
  std::vector<Candidate> candidates;
  for (std::size_t k = 0; k < configs.size(); ++k) {
    const BackendDescriptor& cfg = configs[k];
    std::int64_t index = -1;
    bool runtime_compiled = false;
    auto notes = engine_notes(cfg, index, runtime_compiled);
    if (!notes) continue;
    // One engine runs different kernels under different knob choices (tile sizes, split counts),
    // so a listed configuration is a candidate of its own unless both its engine and its knobs
    // were seen. The exhaustive list adds only engines no list named: its default knobs would
    // time a listed engine again, within the budget meant for the engines the lists miss.
    std::vector<ConvKnob> knobs = read_knobs(cfg);
    const bool ranked = k < ranked_configs;
    if (std::any_of(candidates.begin(), candidates.end(), [&](const Candidate& c) {
          return c.index == index && (!ranked || c.knobs == knobs);
        })) {
      continue;
    }
    if (!engine_allowed(spec, *notes)) continue;
    const bool strict_nan = std::find(notes->begin(), notes->end(),
                                      CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP) != notes->end();
    candidates.push_back({&cfg, index, std::move(knobs), std::move(notes).value(), ranked,
                          runtime_compiled || strict_nan});
  }
  if (!strict_fp32(spec)) {
    std::stable_partition(candidates.begin(), candidates.end(), [](const Candidate& c) {
      return std::find(c.notes.begin(), c.notes.end(), CUDNN_NUMERICAL_NOTE_TENSOR_CORE) !=
             c.notes.end();
    });
  }
  // Last resorts go last and are built only when no other engine builds:
  // - engines that compile at plan time: a plain convolution has precompiled kernels, and
  //   compiling one plan per candidate and shape would make warm-up minutes long;
  // - the one engine noted for strict NaN propagation (cuDNN's generic engine 0, offered by the
  //   fallback heuristics for every shape). On an H200 it won none of 1,700 tuned shapes in four
  //   precisions, at up to 961 ms a call, and took about 90 % of autotuning's GPU time (fp16
  //   ResNet-50 bs 256: 12.6 of the 13.1 s of all candidates' first timed runs, and each of its
  //   untimed runs as long again).
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](const Candidate& c) { return !c.last_resort; });
  if (log_level() <= LogLevel::debug) {
    std::vector<std::string> labels;
    for (const Candidate& c : candidates) {
      labels.push_back(config_label(c.index, c.notes, c.knobs) + (c.last_resort ? " (last)" : ""));
    }
    log_debug("conv candidates ({}): {}", candidates.size(), fmt::join(labels, "; "));
  }

  // Every configuration timed (with its time), for choose_timed_config once all are.
  std::vector<ExecutionPlan> timed;
  float best_ms = std::numeric_limits<float>::infinity();
  // The exhaustive list gets a time budget per shape once a ranked engine has been timed: with
  // ~75 shapes in a ResNet-50 step, an unbounded search took over a minute on an H200.
  const auto tuning_start = std::chrono::steady_clock::now();
  constexpr std::chrono::milliseconds kExhaustiveBudget{400};
  for (const Candidate& candidate : candidates) {
    if (!time_runtime_compiled && candidate.last_resort && !timed.empty()) break;  // last
    if (!candidate.ranked && !timed.empty() &&
        std::chrono::steady_clock::now() - tuning_start > kExhaustiveBudget) {
      continue;
    }
    DLPROBE_ASSIGN_OR_RETURN(auto plan,
                             make_plan(handle, *candidate.cfg, candidate.index, candidate.notes,
                                       candidate.knobs, max_workspace_bytes, key));
    if (!plan) continue;
    if (choice == ConvEngineChoice::heuristic || !timer) return std::move(*plan);
    auto ms = timer(*plan, best_ms);
    if (!ms || !std::isfinite(*ms)) {
      log_debug("conv autotune: {} failed: {}", plan->engine_name,
                ms ? fmt::format("timed {} ms", *ms) : ms.status().message());
      continue;
    }
    log_debug("conv autotune: {} {:.3f} ms", plan->engine_name, *ms);
    best_ms = std::min(best_ms, *ms);
    plan->time_ms = *ms;
    timed.push_back(std::move(*plan));
  }
  std::vector<TimedConfig> times;
  times.reserve(timed.size());
  for (const ExecutionPlan& p : timed) times.push_back({p.time_ms, p.workspace_bytes});
  if (const auto kept = choose_timed_config(times)) {
    if (timed[*kept].time_ms > best_ms) {
      log_debug("conv autotune: {} ({:.4f} ms) without workspace, the fastest {:.4f} ms with it",
                timed[*kept].engine_name, timed[*kept].time_ms, best_ms);
    }
    return std::move(timed[*kept]);
  }
  return error(Errc::unsupported,
               fmt::format("cuDNN has no engine for {} within {} bytes of workspace", key,
                           max_workspace_bytes));
}

}  // namespace

Result<ExecutionPlan> build_conv_plan(cudnnHandle_t handle, const ConvSpec& spec,
                                      ConvEngineChoice choice, std::int64_t max_workspace_bytes,
                                      const PlanTimer& timer) {
  DLPROBE_ASSIGN_OR_RETURN(const OpGraph g, make_conv_graph(handle, spec));
  return plan_for_graph(handle, g, spec, conv_key(spec), choice, max_workspace_bytes, timer);
}

Result<ExecutionPlan> build_fused_conv_plan(cudnnHandle_t handle, const FusedConvSpec& spec,
                                            std::int64_t max_workspace_bytes,
                                            const PlanTimer& timer) {
  DLPROBE_ASSIGN_OR_RETURN(const OpGraph g, make_fused_conv_graph(handle, spec));
  if (!timer) {
    return plan_for_graph(handle, g, spec.conv, fused_conv_key(spec), ConvEngineChoice::heuristic,
                          max_workspace_bytes, {});
  }
  return plan_for_graph(handle, g, spec.conv, fused_conv_key(spec), ConvEngineChoice::autotune,
                        max_workspace_bytes, timer, true);
}

Result<ExecutionPlan> build_conv_plan_for_engine(cudnnHandle_t handle, const ConvSpec& spec,
                                                 std::int64_t engine_index,
                                                 const std::vector<ConvKnob>& knobs,
                                                 std::int64_t max_workspace_bytes) {
  DLPROBE_ASSIGN_OR_RETURN(const OpGraph g, make_conv_graph(handle, spec));
  const auto unavailable = [&](std::string_view why) {
    return error(Errc::unsupported,
                 fmt::format("cuDNN engine {} {} for {}", engine_index, why, conv_key(spec)));
  };
  DLPROBE_ASSIGN_OR_RETURN(auto ec, engine_config(g.graph, engine_index, knobs));
  if (!ec) return unavailable("does not take the graph with the recorded knob choices");
  std::int64_t index = -1;
  bool runtime_compiled = false;
  DLPROBE_ASSIGN_OR_RETURN(auto notes, engine_notes(ec->cfg, index, runtime_compiled));
  // The policy may have changed since the choice was recorded: it is checked again.
  if (!engine_allowed(spec, notes)) return unavailable("is not allowed");
  DLPROBE_ASSIGN_OR_RETURN(auto plan,
                           make_plan(handle, ec->cfg, engine_index, notes, read_knobs(ec->cfg),
                                     max_workspace_bytes, conv_key(spec)));
  if (!plan) return unavailable("does not build within the workspace limit");
  return std::move(*plan);
}

Result<std::int64_t> conv_engine_count(cudnnHandle_t handle, const ConvSpec& spec) {
  DLPROBE_ASSIGN_OR_RETURN(const OpGraph g, make_conv_graph(handle, spec));
  return global_engine_count(g.graph);
}

Result<std::string> serialize_plan(const ExecutionPlan& plan) {
  std::int64_t size = 0;
  DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(plan.plan.get(),
                                               CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                                               CUDNN_TYPE_CHAR, 0, &size, nullptr));
  std::string text(static_cast<std::size_t>(size), '\0');
  DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(plan.plan.get(),
                                               CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                                               CUDNN_TYPE_CHAR, size, &size, text.data()));
  // The count includes the terminating NUL, which the text does not keep.
  text.resize(std::min(text.size(), static_cast<std::size_t>(size)));
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return text;
}

Result<ExecutionPlan> load_fused_conv_plan(cudnnHandle_t handle, const FusedConvSpec& spec,
                                           std::string_view text,
                                           std::int64_t max_workspace_bytes) {
  const auto unavailable = [&](std::string_view why) {
    return error(Errc::unsupported,
                 fmt::format("the serialized plan {} for {}", why, fused_conv_key(spec)));
  };
  DLPROBE_ASSIGN_OR_RETURN(auto plan_desc,
                           BackendDescriptor::create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  if (!plan_desc
           .set(CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                static_cast<std::int64_t>(text.size()), text.data())
           .is_ok() ||
      !plan_desc.set(kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle).is_ok() ||
      !plan_desc.finalize().is_ok()) {
    return unavailable("is not one cuDNN takes here");
  }
  // The engine configuration inside the plan: its engine's notes and the knob choices.
  DLPROBE_ASSIGN_OR_RETURN(auto cfg, BackendDescriptor::create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  cudnnBackendDescriptor_t cfg_raw = cfg.get();
  std::int64_t n = 0;
  DLPROBE_CUDNN_CHECK(cudnnBackendGetAttribute(plan_desc.get(),
                                               CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg_raw));
  std::int64_t index = -1;
  bool runtime_compiled = false;
  DLPROBE_ASSIGN_OR_RETURN(auto notes, engine_notes(cfg, index, runtime_compiled));
  if (!engine_allowed(spec.conv, notes)) return unavailable("runs an engine not allowed");
  std::vector<ConvKnob> knobs = read_knobs(cfg);
  std::string label = config_label(index, notes, knobs);
  ExecutionPlan plan{std::move(plan_desc), 0, std::move(label), index, 0, std::move(knobs)};
  if (cudnnBackendGetAttribute(plan.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &n,
                               &plan.workspace_bytes) != CUDNN_STATUS_SUCCESS ||
      plan.workspace_bytes > max_workspace_bytes) {
    return unavailable("needs more workspace than allowed");
  }
  return plan;
}

Status execute_plan(cudnnHandle_t handle, const ExecutionPlan& plan,
                    std::span<const std::int64_t> uids, std::span<void* const> pointers,
                    void* workspace) {
  DLPROBE_ASSIGN_OR_RETURN(auto pack,
                           BackendDescriptor::create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  const auto n = static_cast<std::int64_t>(uids.size());
  DLPROBE_RETURN_IF_ERROR(
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data()));
  DLPROBE_RETURN_IF_ERROR(
      pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers.data()));
  DLPROBE_RETURN_IF_ERROR(
      pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  DLPROBE_RETURN_IF_ERROR(pack.finalize());
  DLPROBE_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan.get(), pack.get()));
  return Status::ok();
}

const ExecutionPlan* PlanCache::find(const std::string& key) const {
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second.get();
}

const ExecutionPlan& PlanCache::insert(const std::string& key, ExecutionPlan plan) {
  auto& slot = plans_[key];
  slot = std::make_unique<ExecutionPlan>(std::move(plan));
  return *slot;
}

}  // namespace dlprobe::cuda
