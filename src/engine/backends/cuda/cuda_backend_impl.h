// The CUDA backend's class, for the backend's own sources and its tests (which look at the plan
// caches); everyone else goes through dlprobe/cuda_backend.h.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cudnn_graph.h"
#include "dlprobe/engine/cuda_backend.h"
#include "kernels.h"

namespace dlprobe::cuda {

// Owns a CUDA or library handle (an opaque pointer), released with `destroy`.
template <auto destroy>
struct Destroy {
  template <class Handle>
  void operator()(Handle h) const {
    destroy(h);
  }
};
template <class Handle, auto destroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Destroy<destroy>>;

// Owners of the library handles; declared before the caches that use them, so destroyed after.
using StreamPtr = Owned<cudaStream_t, cudaStreamDestroy>;
using CudnnPtr = Owned<cudnnHandle_t, cudnnDestroy>;
using LtPtr = Owned<cublasLtHandle_t, cublasLtDestroy>;
using EventPtr = Owned<cudaEvent_t, cudaEventDestroy>;

// One matrix product D = op(A) op(B) (+ bias over D's rows) in cuBLASLt's column-major terms.
struct Gemm {
  cublasOperation_t trans_a = CUBLAS_OP_N;
  cublasOperation_t trans_b = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* d = nullptr;
  std::int64_t ldd = 0;
  DType dtype = DType::fp32;
  const void* bias = nullptr;  // length m, added to every column (CUBLASLT_EPILOGUE_BIAS)
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(int device,
                                                     memory::CachingAllocator& allocator,
                                                     const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  DeviceKind device() const override { return DeviceKind::cuda; }
  void set_math_mode(MathMode mode) override { options_.math_mode = mode; }

  Status upload(void* dst, const void* src, std::size_t bytes) override;
  Status download(void* dst, const void* src, std::size_t bytes) override;
  Status copy(void* dst, const void* src, std::size_t bytes) override;
  Status synchronize() override;
  Status mark(std::size_t index) override;
  Result<double> elapsed_ms(std::size_t from, std::size_t to) override;
  Status wait_for_mark(std::size_t index) override;
  Result<std::size_t> capture(const std::function<Status()>& record) override;
  Status replay(std::size_t graph) override;
  void release_graph(std::size_t graph) override;
  void reset_call_workspace_peak() override { eager_workspace_bytes_ = 0; }
  // Stream 1 runs weight gradients beside stream 0's work (StepConfig::streams).
  int streams() const override { return 2; }
  Result<std::size_t> on_stream(int stream, const std::function<Status()>& run) override;
  Status fork() override;
  Status join_through(std::size_t ticket) override;
  Status join() override;

  Status fill(const TensorView& t, double value) override;
  Status cast(const TensorView& src, const TensorView& dst) override;

  Status conv2d_forward(const TensorView& x, const TensorView& w, const TensorView& y,
                        const Conv2dParams& p) override;
  Status conv2d_backward_data(const TensorView& dy, const TensorView& w, const TensorView& dx,
                              const Conv2dParams& p) override;
  Status conv2d_backward_weight(const TensorView& x, const TensorView& dy, const TensorView& dw,
                                const Conv2dParams& p) override;

  Status batch_norm_train_forward(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, const TensorView& running_mean,
                                  const TensorView& running_var, const TensorView& y,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const BatchNormParams& p) override;
  Status batch_norm_inference_forward(const TensorView& x, const TensorView& gamma,
                                      const TensorView& beta, const TensorView& running_mean,
                                      const TensorView& running_var, const TensorView& y,
                                      const BatchNormParams& p) override;
  Status batch_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                             const TensorView& save_mean, const TensorView& save_invstd,
                             const TensorView& dx, const TensorView& dgamma,
                             const TensorView& dbeta) override;

  bool fuses_batch_norm_relu() const override { return true; }
  Status batch_norm_relu_train_forward(const TensorView& x, const TensorView& gamma,
                                       const TensorView& beta, const TensorView& running_mean,
                                       const TensorView& running_var, const TensorView& residual,
                                       const TensorView& y, const TensorView& save_mean,
                                       const TensorView& save_invstd,
                                       const BatchNormParams& p) override;
  Status batch_norm_relu_inference_forward(const TensorView& x, const TensorView& gamma,
                                           const TensorView& beta, const TensorView& running_mean,
                                           const TensorView& running_var,
                                           const TensorView& residual, const TensorView& y,
                                           const BatchNormParams& p) override;
  Status batch_norm_relu_backward(const TensorView& dy, const TensorView& y, const TensorView& x,
                                  const TensorView& gamma, const TensorView& beta,
                                  const TensorView& save_mean, const TensorView& save_invstd,
                                  const TensorView& dx, const TensorView& dgamma,
                                  const TensorView& dbeta) override;
  bool fuses_relu_backward_add() const override { return true; }
  Status relu_backward_add(const TensorView& a, const TensorView& b, const TensorView& y,
                           const TensorView& dx) override;
  Status relu_forward(const TensorView& x, const TensorView& y) override;
  Status cast_many(std::span<const TensorView> src, std::span<const TensorView> dst) override;
  Status relu_backward(const TensorView& dy, const TensorView& y, const TensorView& dx) override;
  Status max_pool2d_forward(const TensorView& x, const TensorView& y,
                            const MaxPool2dParams& p) override;
  Status max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& y,
                             const TensorView& dx, const MaxPool2dParams& p) override;
  bool recomputes_max_pool_input() const override { return true; }
  Status max_pool2d_backward_recomputed(const TensorView& dy, const TensorView& bn_x,
                                        const TensorView& gamma, const TensorView& beta,
                                        const TensorView& save_mean, const TensorView& save_invstd,
                                        const TensorView& dx, const MaxPool2dParams& p) override;
  // NHWC in 16-byte channel packs (ResNet's stem: 64 channels): the batch norm's two passes gather
  // the pool's gradient from dy as they load it (launch_batch_norm_relu_backward_from_pool), at the
  // windows' maxima the forward kept (`positions`) or, without them, the ones a first pass finds
  // as max_pool2d_backward_recomputed does: at ResNet-50's stem the tensor of the pool's input
  // gradient (411 MB at fp16 batch 256) is neither written nor read twice.
  bool fuses_max_pool_batch_norm_backward(const TensorDesc& x,
                                          const MaxPool2dParams& pool) const override;
  Status batch_norm_relu_max_pool_backward(const TensorView& dy, const TensorView& positions,
                                           const TensorView& x, const TensorView& gamma,
                                           const TensorView& beta, const TensorView& save_mean,
                                           const TensorView& save_invstd, const TensorView& dx,
                                           const TensorView& dgamma, const TensorView& dbeta,
                                           const MaxPool2dParams& pool) override;
  Status batch_norm_relu_max_pool_train_forward(
      const TensorView& x, const TensorView& gamma, const TensorView& beta,
      const TensorView& running_mean, const TensorView& running_var, const TensorView& y,
      const TensorView& positions, const TensorView& save_mean, const TensorView& save_invstd,
      const BatchNormParams& bn, const MaxPool2dParams& pool) override;
  Status add(const TensorView& a, const TensorView& b, const TensorView& y) override;
  Status global_avg_pool_forward(const TensorView& x, const TensorView& y) override;
  Status global_avg_pool_backward(const TensorView& dy, const TensorView& dx) override;

  Status linear_forward(const TensorView& x, const TensorView& w, const TensorView& b,
                        const TensorView& y) override;
  Status linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                         const TensorView& dx, const TensorView& dw, const TensorView& db) override;

  Status cross_entropy_forward(const TensorView& logits, const TensorView& labels,
                               const TensorView& loss) override;
  Status cross_entropy_backward(const TensorView& logits, const TensorView& labels,
                                const TensorView& counters, const TensorView& dlogits) override;

  Status unscale_gradients(std::span<const TensorView> grads, const TensorView& counters,
                           const TensorView& found_inf) override;
  Status sgd_step(std::span<const OptimizerSlot> slots, const SgdParams& p,
                  const TensorView& counters, const TensorView& found_inf) override;
  Status adamw_step(std::span<const OptimizerSlot> slots, const AdamWParams& p,
                    const TensorView& counters, const TensorView& found_inf) override;
  Status advance_step(const TensorView& counters, const GradScalerOptions* scaler,
                      const TensorView& found_inf) override;

  // cuDNN's runtime fusion of a convolution with the batch norms around it (cudnn_graph.h's
  // FusedConvSpec, from cuDNN's first choice of engine: build_fused_conv_plan): NHWC fp32, fp16
  // or bf16, scale and bias in conv_prologue_dtype, sum and sqsum fp32, on GPUs of compute
  // capability 8.0 and later (runtime fusion's engines need them). The step plans it for fp16,
  // and for bf16 and fp32 where dlprobe's pass sums the outputs (conv_sums): with cuDNN's
  // statistics epilogue (and batch norm applying itself) the bf16 step ran 6,277.6 img/s against
  // 7,472.3 with batch norm apart, and tf32 3,382.8 against 3,922.4 (ResNet-50 bs256, H200,
  // 2026-12-05; docs/performance.md). Nor
  // where the options ask for deterministic engines: cuDNN lists these engines as deterministic,
  // but the fused step's loss moved in the fifth digit between eager runs of one plan on an H200
  // (2.2935, 2.29405, 2.29318).
  bool fuses_conv_batch_norm(DType activation, Layout layout) const override {
    return runtime_fusion_ && !options_.deterministic && layout == Layout::nhwc &&
           (activation == DType::fp16 || sums_pass_in(activation));
  }
  // Whether dlprobe's pass rather than cuDNN's epilogue sums fused outputs of this dtype.
  bool sums_pass_in(DType activation) const {
    return options_.conv_sums == ConvSumsBy::pass ||
           (options_.conv_sums == ConvSumsBy::epilogue_in_fp16 && activation != DType::fp16);
  }
  // bf16's scale and bias in fp32: in bf16 (8 bits) the whole bf16 step fell outside the fp64
  // comparison of step_cuda_test on an H200 while the fp16 one passed with fp16's (11 bits).
  DType conv_prologue_dtype(DType activation) const override {
    return activation == DType::bf16 ? DType::fp32 : activation;
  }
  // Where the options make the prologue dlprobe's pass (fixed_prologue_route), and under a size
  // rule (auto, up-to) for inputs within its size at any batch: keeping the normalised tensors of
  // at most 13 MB ran fp16 ResNet-50 0.2 to 0.3 % faster at batch 256 (layer4's five, 0.06 GiB more
  // at the peak), where the timed routes applied them in the convolutions, and 0.6 to 0.8 % at
  // batch 64 (H100, 2026-12-06). In bf16 and fp32, every tensor: cuDNN 9.19 has no runtime-fusion
  // engine for a bf16 prologue with fp32 scale and bias for most of ResNet-50's shapes (at batch
  // 128 on an H100, none of the seven forward and seven weight-gradient shapes it was asked for),
  // whose calls run the prologue as dlprobe's pass anyway; and tf32 ResNet-50 so ran 6.6 % faster
  // than with batch norm apart at batches 64 and 256 (H100, 2026-12-06), where its fused prologues
  // were not measured.
  bool keeps_normalised_conv_input(const TensorDesc& x) const override {
    if (x.dtype() != DType::fp16) return true;
    if (options_.conv_prologue_pass_up_to_bytes) {
      return x.bytes() <= *options_.conv_prologue_pass_up_to_bytes;
    }
    return fixed_prologue_route(x) == PrologueRoute::pass;
  }
  Status conv2d_forward_fused(const TensorView& x, const TensorView& scale, const TensorView& bias,
                              const TensorView& w, const TensorView& y, const TensorView& sum,
                              const TensorView& sqsum, const Conv2dParams& p) override;
  // Where the prologue runs as dlprobe's pass (prologue_route), the pass finalizes too.
  Status conv2d_forward_finalize_fused(const BatchNormFinalize& finalize, const TensorView& x,
                                       const TensorView& w, const TensorView& y,
                                       const TensorView& sum, const TensorView& sqsum,
                                       const Conv2dParams& p) override;
  Status conv2d_backward_weight_fused(const TensorView& x, const TensorView& scale,
                                      const TensorView& bias, const TensorView& dy,
                                      const TensorView& dw, const Conv2dParams& p) override;
  // In one graph of cuDNN's runtime fusion (FusedConvSpec's data gradient). NHWC fp16 or bf16.
  Status conv2d_backward_data_add_relu(const TensorView& dy, const TensorView& w,
                                       const TensorView& add, const TensorView& relu_y,
                                       const TensorView& dx, const Conv2dParams& p) override;
  Status batch_norm_finalize(const BatchNormFinalize& finalize) override;
  Status batch_norm_apply_add(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                              const TensorView& save_mean, const TensorView& save_invstd,
                              const TensorView& r, const TensorView& r_gamma,
                              const TensorView& r_beta, const TensorView& r_mean,
                              const TensorView& r_invstd, const TensorView& y) override;
  Status batch_norm_finalize_apply(const BatchNormFinalize& finalize, const TensorView& x,
                                   const TensorView& residual, const TensorView& y,
                                   bool relu) override;
  Status batch_norm_apply(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                          const TensorView& save_mean, const TensorView& save_invstd,
                          const TensorView& residual, const TensorView& y, bool relu) override;
  Status batch_norm_finalize_apply_add(const BatchNormFinalize& finalize, const TensorView& x,
                                       const BatchNormFinalize& r_finalize, const TensorView& r,
                                       const TensorView& y) override;
  // Both batch norms' sums in one pass over dy, x and r, and both dx in another, where neither
  // takes the one-launch kernels (launch_batch_norm_add_backward).
  Status batch_norm_add_backward(const TensorView& dy, const BatchNormGrads& x,
                                 const BatchNormGrads& r) override;

  // Cached cuDNN execution plans and cuBLASLt algorithms (one per distinct shape key).
  std::size_t conv_plan_count() const { return conv_plans_.size(); }
  // Plans built from the tuning cache's record rather than by timing candidates.
  std::size_t conv_plans_replayed() const { return conv_plans_replayed_; }
  // Fused graphs' plans loaded whole from the tuning cache rather than compiled.
  std::size_t fused_plans_loaded() const { return fused_plans_loaded_; }
  // Fused calls whose prologue ran as dlprobe's pass (conv_prologue_pass, the route timed
  // faster under conv_prologue_timed, or cuDNN had no engine for the graph), and whose output's
  // sums did (conv_sums): what the options asked for is what ran, which the numbers alone
  // would not show.
  std::size_t prologue_passes() const { return prologue_passes_; }
  std::size_t sums_passes() const { return sums_passes_; }
  // Fused graphs cuDNN had no engine for, whose calls ran as the unfused ones they stand for.
  std::size_t unfusable_graphs() const { return unfusable_.size(); }
  std::size_t matmul_algo_count() const { return matmul_algos_.size(); }
  // The stream calls go to now (see on_stream()).
  cudaStream_t stream() const { return stream_index_ == 1 ? side_stream_.get() : stream_.get(); }
  // The cuDNN engine of the latest convolution ("eng12 [tensor_core]"), for reports and tests.
  const std::string& last_conv_engine() const { return last_conv_engine_; }
  // While a graph is being recorded, the workspace its calls share (else null): tests overwrite
  // it to show that a replayed call does not depend on what was left there at capture.
  const memory::DeviceBuffer* recording_workspace() const {
    return recording_ != nullptr ? &recording_->workspace : nullptr;
  }

 private:
  CudaBackend(memory::CachingAllocator& allocator, const CudaBackendOptions& options)
      : allocator_(allocator), options_(options) {}

  // Stream 1's scratch always comes from a pool of its own, which keeps its blocks: given back
  // to the allocator, a block could go to a stream-0 call while the stream-1 call still runs.
  KernelContext ctx() {
    ScratchPool* pool = nullptr;
    if (stream_index_ == 1) {
      pool = &side_scratch_;
    } else if (recording_ != nullptr) {
      pool = &recording_->scratch;
    }
    return {stream(), sm_count_, &allocator_, pool, cooperative_};
  }
  // Workspace for one cuDNN or cuBLASLt call, held by `holder` until the call is queued: on
  // stream 0 from the allocator for this call, or while recording a graph, the one workspace the
  // graph's stream-0 calls share (they run in order); on stream 1 from its pool.
  Result<void*> workspace(std::size_t bytes, std::string_view op, std::optional<Scratch>& holder);
  // The ConvSpec of a convolution over these operands, with the backend's numerical policy.
  Result<ConvSpec> conv_spec(ConvDirection direction, const TensorView& x, const TensorView& w,
                             const TensorView& y, const Conv2dParams& p) const;
  // Runs `plan` (a uid and pointer for each of its tensors) with workspace from `op`'s account.
  Status run_conv_plan(const ExecutionPlan& plan, std::span<const std::int64_t> uids,
                       std::span<void* const> ptrs, std::string_view op);
  Status fused_conv(ConvDirection direction, const TensorView& x, const TensorView* scale,
                    const TensorView* bias, const TensorView& w, const TensorView& y,
                    const TensorView* sum, const TensorView* sqsum, const Conv2dParams& p,
                    std::string_view op);
  Status conv(ConvDirection direction, const TensorView& x, const TensorView& w,
              const TensorView& y, const Conv2dParams& p, std::string_view op);
  // How a convolution with a batch norm's apply and ReLU before it (its prologue) runs: in
  // cuDNN's fused graph, or after dlprobe's pass writes the normalised input to scratch memory.
  enum class PrologueRoute : std::uint8_t { graph, pass };
  // A call with the prologue (forward or weight gradient) by its route.
  Status with_prologue(ConvDirection direction, const TensorView& x, const TensorView& scale,
                       const TensorView& bias, const TensorView& w, const TensorView& y,
                       const TensorView* sum, const TensorView* sqsum, const Conv2dParams& p,
                       std::string_view op);
  // The pass into scratch memory, then the convolution without the prologue.
  Status conv_after_pass(ConvDirection direction, const TensorView& x, const TensorView& scale,
                         const TensorView& bias, const TensorView& w, const TensorView& y,
                         const TensorView* sum, const TensorView* sqsum, const Conv2dParams& p,
                         std::string_view op);
  // The convolution over an input of x's shape that make_input writes to scratch memory (a
  // prologue's pass), without cuDNN's prologue.
  Status conv_on_scratch(ConvDirection direction, const TensorView& x,
                         const std::function<Status(const TensorView&)>& make_input,
                         const TensorView& w, const TensorView& y, const TensorView* sum,
                         const TensorView* sqsum, const Conv2dParams& p, std::string_view op);
  // The route of op's calls of this shape: as CudaBackendOptions::conv_prologue_pass or
  // conv_prologue_pass_up_to_bytes fixes it, or under conv_prologue_timed the faster of the two as
  // `run` takes them on the first call's buffers, kept for the backend's life and in the tuning
  // cache. `run` may run many times: what it writes must be the same each time.
  Result<PrologueRoute> prologue_route(ConvDirection direction, const TensorView& x,
                                       const TensorView& w, const TensorView& y, bool stats,
                                       const Conv2dParams& p, std::string_view op,
                                       const std::function<Status(PrologueRoute)>& run);
  // The route the options fix for calls over an input like x, whatever their shape's timing
  // would say; none where it is timed on the call's first run.
  std::optional<PrologueRoute> fixed_prologue_route(const TensorDesc& x) const;
  Status need_prologue_operands(std::string_view op, const TensorView& x, const TensorView& scale,
                                const TensorView& bias) const;
  // The checks batch_norm_finalize's operands pass; with x, the tensor whose sums they are
  // (a combined call's input), also its count of values a channel.
  static Status need_finalize_operands(std::string_view op, const BatchNormFinalize& f);
  static Status need_finalize_operands(std::string_view op, const BatchNormFinalize& f,
                                       const TensorView& x);
  // The stem's images are padded to this many channels (see needs_channel_pad).
  static constexpr std::int64_t kPaddedChannels = 4;
  bool needs_channel_pad(const TensorView& x, const TensorView& w, const Conv2dParams& p) const;
  Status padded_conv(ConvDirection direction, const TensorView& x, const TensorView& w,
                     const TensorView& y, const Conv2dParams& p, std::string_view op);
  // The image stem (7x7, stride 2, pad 3, at most four channels, NHWC) as a 4x4 convolution over
  // 16 channels (kernels.h, launch_stem_to_depth).
  bool runs_stem_as_depth(const TensorView& x, const TensorView& w, const TensorView& y,
                          const Conv2dParams& p) const;
  Status stem_conv_as_depth(ConvDirection direction, const TensorView& x, const TensorView& w,
                            const TensorView& y, std::string_view op);
  Result<ExecutionPlan> fused_conv_plan(const FusedConvSpec& spec, const std::string& key,
                                        std::string_view op, std::span<const std::int64_t> uids,
                                        std::span<void* const> ptrs);
  // Times a candidate plan on these buffers (see build_conv_plan).
  PlanTimer candidate_timer(std::span<const std::int64_t> uids, std::span<void* const> ptrs,
                            std::string_view op);
  // Runs the plan of `spec` (planned on first use) with a uid and pointer for each tensor.
  Status run_fused(const FusedConvSpec& spec, std::span<const std::int64_t> uids,
                   std::span<void* const> ptrs, std::string_view op);
  // The checks every fused convolution's operands pass: fp16 or bf16 alike, NHWC, rank 4, shapes
  // that make a convolution (x is dx and y is dy for a data gradient).
  Status need_fused_operands(std::string_view op, const TensorView& x, const TensorView& w,
                             const TensorView& y);
  Result<ExecutionPlan> tuned_conv_plan(const ConvSpec& spec, const std::string& key,
                                        std::string_view op, const PlanTimer& timer);
  // The workspace one convolution's engine may take (see CudaBackendOptions).
  std::int64_t conv_workspace_cap(const ConvSpec& spec) const;
  Status matmul(const Gemm& g, std::string_view op);

  memory::CachingAllocator& allocator_;
  CudaBackendOptions options_;
  int sm_count_ = 1;
  bool cooperative_ = false;
  bool runtime_fusion_ = false;  // compute capability 8.0 or later
  std::string tuning_stamp_;     // GPU, cuDNN and workspace limit, for the tuning cache's keys
  StreamPtr stream_;
  StreamPtr side_stream_;  // stream 1
  EventPtr fork_;
  EventPtr join_;
  int stream_index_ = 0;
  bool forked_ = false;  // stream 1 has waited on stream 0 since the last join
  // Recorded on stream 1 after the work of each ticket (on_stream), by ticket modulo their count.
  std::array<EventPtr, kStreamTickets> done_;
  std::size_t next_ticket_ = 0;
  // Stream 1's scratch and workspace, eager and recorded alike: its blocks are never given back
  // while the backend lives, so a graph may keep their addresses; and an eager stream-1 call
  // (after a fork) and a replay (on stream 0) never overlap.
  ScratchPool side_scratch_;
  CudnnPtr cudnn_;
  LtPtr lt_;
  EventPtr start_;
  EventPtr stop_;
  std::vector<EventPtr> marks_;  // timing marks by index, created on first use
  // A recorded graph and the memory its replays use.
  struct Graph {
    Owned<cudaGraphExec_t, cudaGraphExecDestroy> exec;
    memory::DeviceBuffer workspace;
    ScratchPool scratch;  // every kernel scratch buffer the recorded calls use
  };
  std::vector<std::unique_ptr<Graph>> graphs_;
  Graph* recording_ = nullptr;  // the graph being recorded
  // The most workspace one eager call took since reset_call_workspace_peak() or the last capture
  // (see capture()).
  std::size_t eager_workspace_bytes_ = 0;
  PlanCache conv_plans_;
  std::map<std::string, cublasLtMatmulHeuristicResult_t> matmul_algos_;
  std::string last_conv_engine_;
  std::size_t conv_plans_replayed_ = 0;
  std::size_t fused_plans_loaded_ = 0;
  std::size_t prologue_passes_ = 0;
  std::size_t sums_passes_ = 0;
  // Fused graphs cuDNN has no engine for: their calls run as the unfused ones they stand for.
  std::set<std::string> unfusable_;
  // The prologue's route by op and shape (see prologue_route).
  std::map<std::string, PrologueRoute> prologue_routes_;
};

}  // namespace dlprobe::cuda
