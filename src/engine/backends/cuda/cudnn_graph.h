// A thin builder over cuDNN's backend (graph) API: RAII descriptors, tensors, convolution
// operation graphs, engine selection (heuristics, optional autotuning) and execution plans cached
// per shape key. cudnn-frontend does this in C++ too but is not packaged for Debian, so dlprobe
// keeps its own small builder; it covers only the operations the engine uses.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/cuda_backend.h"

namespace dlprobe::cuda {

// Owns one cudnnBackendDescriptor_t.
class BackendDescriptor {
 public:
  static Result<BackendDescriptor> create(cudnnBackendDescriptorType_t type);
  BackendDescriptor() = default;
  BackendDescriptor(BackendDescriptor&& other) noexcept;
  BackendDescriptor& operator=(BackendDescriptor&& other) noexcept;
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;
  ~BackendDescriptor();

  cudnnBackendDescriptor_t get() const { return d_; }
  Status set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
             const void* values);
  Status set_descriptor(cudnnBackendAttributeName_t name, const BackendDescriptor& value);
  Status finalize();

 private:
  explicit BackendDescriptor(cudnnBackendDescriptor_t d) : d_(d) {}
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A tensor of the graph: dims and strides in cuDNN's order (N, C, H, W) whatever the memory
// layout; NHWC is expressed through the strides.
struct TensorSpec {
  std::int64_t uid = 0;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::vector<std::int64_t> dims;
  std::vector<std::int64_t> strides;
  bool is_virtual = false;
  // Bytes the data pointer is aligned to (at most 16); engines needing more are not offered.
  std::int64_t alignment = 16;
};

enum class ConvDirection { forward, backward_data, backward_filter };

// y = conv(x, w). For backward_data, x is the gradient being produced (dx) and y the incoming
// gradient (dy); for backward_filter, w is the gradient being produced (dw).
struct ConvSpec {
  ConvDirection direction = ConvDirection::forward;
  TensorSpec x;
  TensorSpec w;
  TensorSpec y;
  std::int64_t pad[2] = {0, 0};
  std::int64_t stride[2] = {1, 1};
  std::int64_t dilation[2] = {1, 1};
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  // False keeps fp32 convolutions off tensor cores (TF32), as strict fp32 requires.
  bool allow_tf32 = false;
  // True keeps off engines cuDNN marks non-deterministic (atomic accumulation across blocks),
  // whose sums also land in the output's dtype when it is fp16/bf16.
  bool deterministic = true;
  // True lets FFT and Winograd engines compete: their transformed operands carry more rounding
  // error than a direct sum (~1e-6 relative in fp32 rather than ~1e-7), which cudnn.benchmark
  // accepts and an exact run does not.
  bool allow_transforms = false;
  // True lets engines cuDNN notes for reduced-precision reductions compete, as cudnn.benchmark
  // does (PyTorch filters no such note). cuDNN's first-layer engine for images of up to four
  // channels is one (ResNet-50's stem at fp16 batch 256 on an H200, autotuning's timings: 0.42 ms
  // forward and 0.40 ms weight gradient, against 0.84 and 1.11 ms for the best engines with fp32
  // sums).
  bool allow_reduced_precision = false;
};

// Text that identifies a ConvSpec for the plan cache.
std::string conv_key(const ConvSpec& spec);

// A convolution with what the batch norms around it need, in one graph of cuDNN's runtime fusion
// (Ampere and later; NHWC fp16 or bf16). With the prologue, on the way in x' = relu(x * scale +
// bias) per input channel: the batch norm before the convolution applied with its ReLU, so that no
// normalised copy of x is written and read again. Forward, on the way out, the per-channel sum and
// sum of squares of y: the statistics of the batch norm after it, without reading y again (a
// block's first convolution, whose input is no batch norm's, takes these without the prologue).
// As a weight gradient (conv.direction backward_filter: conv.w is dw, conv.y is dy; prologue
// required), the prologue recomputes the normalised input the gradient needs from the stored x.
//
// As a data gradient (conv.direction backward_data: conv.x is dx, conv.y is dy; no prologue), the
// epilogue adds `add` and masks the sum where `relu_y` is zero: dx = (dgrad(dy, w) + add) *
// (relu_y > 0). That is the gradient of a ResNet block's output relu_y, whose two terms arrive
// from the next block's first convolution (this data gradient) and from its shortcut (`add`),
// with the ReLU's backward applied, so that the data gradient is never written on its own.
struct FusedConvSpec {
  ConvSpec conv;  // conv.x is the tensor before the batch norm, or dx
  bool prologue = true;
  TensorSpec scale, bias;  // with the prologue: [1, C, 1, 1] in conv.x's dtype
  TensorSpec sum, sqsum;   // forward only, where it has them: [1, K, 1, 1] fp32
  TensorSpec add, relu_y;  // backward_data only: shaped as conv.x
};
// Whether the graph sums its output (cuDNN's statistics epilogue): a forward with sum and sqsum.
bool has_sums(const FusedConvSpec& spec);
std::string fused_conv_key(const FusedConvSpec& spec);

// fp32 operands and sums with TF32 off: no tensor-core engine may run it.
bool strict_fp32(const ConvSpec& spec);

struct ExecutionPlan {
  BackendDescriptor plan;
  std::int64_t workspace_bytes = 0;
  std::string engine_name;  // "eng<global index>" and its numerical notes, for logs and reports
  std::int64_t engine_index = -1;  // cuDNN's global engine index
  float time_ms = 0;               // as timed when autotuning chose it (0: not timed)
  std::vector<ConvKnob> knobs;     // the configuration's knob choices, to rebuild it
};

// Times one candidate plan on real buffers for autotuning (its time in ms). `best_ms` is the
// fastest so far (infinity at first): a candidate clearly slower on its first run need not be
// run again.
using PlanTimer = std::function<Result<float>(const ExecutionPlan&, float best_ms)>;

// Builds the operation graph for `spec` and returns an execution plan: heuristics mode A's first
// engine that builds, or with autotune / exhaustive the candidate that choose_timed_config keeps
// of those `timer` measures (the fastest, or the fastest without workspace where it is within 3 %
// of that). Candidates whose workspace exceeds `max_workspace_bytes` are skipped.
Result<ExecutionPlan> build_conv_plan(cudnnHandle_t handle, const ConvSpec& spec,
                                      ConvEngineChoice choice, std::int64_t max_workspace_bytes,
                                      const PlanTimer& timer = {});

// The plan for a FusedConvSpec: the first engine cuDNN's heuristics offer that builds within the
// workspace, or with `timer` the one choose_timed_config keeps of all the configurations that
// build (heuristics modes A and B, the fallback list). Only runtime-fusion engines take such a
// graph, and they compile their kernels when the plan is built (about a second each), so a timed
// search costs seconds a graph; the backend times only under exhaustive tuning (docs/performance.md
// has what it bought).
Result<ExecutionPlan> build_fused_conv_plan(cudnnHandle_t handle, const FusedConvSpec& spec,
                                            std::int64_t max_workspace_bytes,
                                            const PlanTimer& timer = {});

// cuDNN's serialized form of a plan (its JSON representation: the operation graph, the engine and
// its knob choices; about 4 KB for a fused convolution, no kernel binary), which
// load_fused_conv_plan turns back into the plan without a heuristics query or a search over
// candidates that fail to build. cuDNN serializes the plans of runtime-compiled engines only.
Result<std::string> serialize_plan(const ExecutionPlan& plan);

// The plan serialize_plan wrote, for `spec` (whose key the caller looked it up by), on the same
// GPU model and cuDNN: the same checks as a built plan (the engine's numerical notes, the
// workspace). Errc::unsupported when cuDNN does not take the text or a check fails.
Result<ExecutionPlan> load_fused_conv_plan(cudnnHandle_t handle, const FusedConvSpec& spec,
                                           std::string_view text, std::int64_t max_workspace_bytes);

// The plan of one engine configuration, by cuDNN's global index and knob choices (a choice
// recorded by an earlier tuning), with the same checks: the engine takes the graph and the
// choices, the spec allows its numerical notes, and its workspace fits. Errc::unsupported when
// any fails.
Result<ExecutionPlan> build_conv_plan_for_engine(cudnnHandle_t handle, const ConvSpec& spec,
                                                 std::int64_t engine_index,
                                                 const std::vector<ConvKnob>& knobs,
                                                 std::int64_t max_workspace_bytes);

// How many engines cuDNN's global list holds for `spec`'s graph (the indices
// build_conv_plan_for_engine takes run below it).
Result<std::int64_t> conv_engine_count(cudnnHandle_t handle, const ConvSpec& spec);

// Executes `plan` with a device pointer for each unique id.
Status execute_plan(cudnnHandle_t handle, const ExecutionPlan& plan,
                    std::span<const std::int64_t> uids, std::span<void* const> pointers,
                    void* workspace);

// Plans built once per shape key and reused for every step.
class PlanCache {
 public:
  const ExecutionPlan* find(const std::string& key) const;
  const ExecutionPlan& insert(const std::string& key, ExecutionPlan plan);
  std::size_t size() const { return plans_.size(); }
  const std::map<std::string, std::unique_ptr<ExecutionPlan>>& plans() const { return plans_; }

 private:
  std::map<std::string, std::unique_ptr<ExecutionPlan>> plans_;
};

}  // namespace dlprobe::cuda
