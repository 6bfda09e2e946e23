// The backend op test: a table of op cases (op_cases.cpp) run on a table of backends (the rows of
// each test binary: host_rows.cpp, cuda/cuda_rows.cpp) in every precision a backend runs, each
// output compared with the reference functions in fp64 on the same inputs, the reference rounded
// to the output's dtype first. An element passes when |actual - ref| <= tol + eps * |ref|, with
// tol and eps by dtype and precision (tolerance()); the failure names the worst elements by that
// normalised error.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/engine/backend.h"
#include "dlprobe/engine/tensor.h"

namespace dlprobe::testing {

// A precision a backend runs an op in: the dtype of its activations and, for fp32, whether
// convolutions and matrix products may round their inputs to TF32.
struct Precision {
  std::string_view name;
  DType dtype = DType::fp32;
  MathMode math = MathMode::strict_fp32;
};
inline constexpr Precision kFp32{"fp32", DType::fp32};
inline constexpr Precision kTf32{"tf32", DType::fp32, MathMode::tf32};
inline constexpr Precision kFp16{"fp16", DType::fp16};
inline constexpr Precision kBf16{"bf16", DType::bf16};

// How an output may differ from the reference (tolerance() turns it into figures).
struct Check {
  // Products of O(1) values summed into one element: an fp32 sum's error grows with the square
  // root of their number.
  double terms = 1;
  // The size of the values the output is made of, where it is not O(1) (a loss scale, AdamW's
  // (1 - beta2) g^2): the whole of tol scales with it.
  double scale = 1;
  // Selections, copies, casts and exactly rounded sums: equal values (NaN to NaN).
  bool exact = false;
};

struct Tolerance {
  double tol;
  double eps;
};
// For an output of dtype `out` computed in `p`: eps a few units in the last place of `out`, and
// tol = (as much near zero + the error per term of the precision's sums * sqrt(terms)) * scale.
Tolerance tolerance(DType out, Precision p, const Check& c);

// `actual` against the fp64 `reference` rounded to actual's dtype, element by element across
// layouts; NaN must meet NaN and an infinity the same infinity.
::testing::AssertionResult matches(const HostTensor& actual, const HostTensor& reference,
                                   Precision p, const Check& c = {});

// ---- backends ----

// A backend with the allocator its tensors and its scratch come from (destroyed after it).
struct OpenedBackend {
  std::unique_ptr<memory::CachingAllocator> allocator;
  std::unique_ptr<Backend> backend;
};

// A tensor in a backend's memory, `misaligned` ones 4 bytes into their buffer (which sends the
// multi-tensor kernels down their scalar path).
struct BackendTensor {
  TensorDesc desc;
  memory::DeviceBuffer buffer;
  std::size_t offset = 0;
  TensorView view() const { return {desc, static_cast<std::byte*>(buffer.data()) + offset}; }
};
BackendTensor to_backend(OpenedBackend& b, const HostTensor& host, bool misaligned = false);
// Filled with NaN, so that an element the op forgets to write shows up.
BackendTensor backend_output(OpenedBackend& b, const TensorDesc& desc);
HostTensor to_host(OpenedBackend& b, const TensorView& view);

// Ops a backend may or may not offer.
struct Offers {
  bool fused_batch_norm_relu = false;    // fuses_batch_norm_relu()
  bool fused_relu_backward_add = false;  // fuses_relu_backward_add()
  bool mixed_layouts = false;            // add and cast between NCHW and NHWC operands
  bool half_to_half_casts = false;       // casts between fp16 and bf16
  // The batch-norm ops of batch norm inside the convolutions: batch_norm_finalize,
  // batch_norm_apply and the ReLU's backward without a stored y, in every precision and layout.
  // Not checked against fuses_conv_batch_norm, which on the CUDA backend also depends on its
  // options (deterministic engines: no fusion); the fused convolutions themselves are tested per
  // backend (tests/engine/cuda/conv_plan_test.cpp).
  bool fused_conv_batch_norm = false;
  // Batch norm on NHWC tensors of ResNet-50's sizes at batch 32: those that reach the CUDA
  // backend's one-launch kernels at their deeper holds (3.2 M and 6.4 M elements on an H200) and
  // two past every hold (25.7 M, in 256 and 1024 channels), where its three-launch kernels run. A
  // row that sets this runs those cases; they are too large for the host rows' reference loops to
  // be quick.
  bool gpu_sized_batch_norm = false;
  bool recomputed_max_pool = false;  // recomputes_max_pool_input()
  // batch_norm_relu_max_pool_backward on NHWC tensors in 16-byte channel packs (its cases'
  // shapes): fuses_max_pool_batch_norm_backward() for them.
  bool fused_max_pool_backward = false;
};

struct BackendRow {
  std::string_view name{};
  // Precisions of its compute ops; casts and fills run in every floating dtype on every row.
  std::vector<Precision> precisions{};
  Offers offers{};
  // Every scratch buffer is back in the allocator when a slot returns.
  bool returns_scratch = false;
  std::function<Result<OpenedBackend>()> open{};
  // Why `p` cannot run on this machine (bf16 on a CPU without AVX-512); nothing when it can.
  std::function<std::optional<std::string>(Backend&, Precision)> unavailable{};
  // A check of the backend's own after each op (the CUDA convolutions' engine choice); its
  // message names what ran, also when it passes.
  std::function<::testing::AssertionResult(Backend&, std::string_view op, Precision)> after_op{};
};

// The rows of this test binary, from its rows file.
const std::vector<BackendRow>& backend_rows();
// The row's backend, opened on first use and kept until the tests end; null (after adding a
// failure that says why) when it cannot be opened.
OpenedBackend* shared_backend(const BackendRow& row);

// ---- op cases ----

// Which dtype a tensor of an op takes: the precision's (activations and their gradients), always
// fp32 (batch-norm parameters and statistics, logits, optimizer tensors), or its own (labels).
enum class Role { activation, fp32, own };

// The tensors of one variant of an op: inputs with their values (kept in fp64, as the reference
// reads them, after rounding to the dtype the backend gets) and outputs to be written.
class OpTensors {
 public:
  explicit OpTensors(Precision p) : precision_(p) {}
  // Tensor `name` holding `values` rounded to the role's dtype; returns those rounded values in
  // fp64.
  const HostTensor& input(const std::string& name, const HostTensor& values,
                          Role role = Role::activation, bool misaligned = false);
  void output(const std::string& name, const Shape& shape, Layout layout = Layout::nchw,
              Role role = Role::activation);
  void output(const std::string& name, const TensorDesc& desc);
  // An input's values in fp64.
  const HostTensor& operator[](const std::string& name) const;
  DType dtype(Role role) const;
  Precision precision() const { return precision_; }

  struct Entry {
    TensorDesc desc;    // as the backend gets it
    HostTensor values;  // fp64; empty for outputs
    bool misaligned = false;
  };
  const std::map<std::string, Entry>& entries() const { return entries_; }

 private:
  Precision precision_;
  std::map<std::string, Entry> entries_;
};

// The variant's tensors on the backend under test.
class BackendTensors {
 public:
  BackendTensors(OpenedBackend& b, const OpTensors& t);
  TensorView operator[](const std::string& name) const;
  // Keeps tensor `name`'s current values under `key`, for a check of a value a later call
  // changes (an optimizer's parameters after each step).
  void snapshot(const std::string& key, const std::string& name);
  // The value checked under `key`: its snapshot, or else the tensor's values now.
  HostTensor result(const std::string& key);

 private:
  OpenedBackend& backend_;
  std::map<std::string, BackendTensor> tensors_;
  std::map<std::string, HostTensor> snapshots_;
};

using Values = std::map<std::string, HostTensor>;

struct Variant {
  std::string label;
  OpTensors tensors;
  // What is compared after the run (tensor names or snapshot keys), and how.
  std::vector<std::pair<std::string, Check>> checks;
  std::function<Status(Backend&, BackendTensors&)> run;
  // The fp64 value of every check, from the reference functions on `tensors`' fp64 values.
  std::function<Result<Values>(const OpTensors&)> reference;
};

// The precisions an op runs in on a row.
enum class Precisions {
  math,         // the row's precisions (convolutions, matrix products)
  activations,  // the row's precisions but TF32, which only changes math ops
  fp32,         // fp32 only (loss, gradient unscaling, optimizers)
  storage,      // fp32, fp16 and bf16 on every row (casts, fills)
  halves,       // fp16 and bf16 on every row (casts between them)
};

struct OpCase {
  std::string_view name;
  Precisions precisions;
  // The offer a row needs to run it (empty: every row).
  bool Offers::*needs = nullptr;
  std::function<std::vector<Variant>(Precision)> variants;
};
const std::vector<OpCase>& op_cases();

// One test of the table: an op on a row in a precision.
struct OpTest {
  const BackendRow* row;
  const OpCase* op;
  Precision precision;
};
std::vector<OpTest> op_tests();
std::string op_test_name(const OpTest& t);
// gtest prints parameters in test lists and failures: by name.
void PrintTo(const OpTest& t, std::ostream* os);
void PrintTo(const BackendRow* row, std::ostream* os);

// Runs a variant on `b` and returns every checked value.
Result<Values> run_variant(OpenedBackend& b, const Variant& v);
// Each checked value of `actual` against the reference (`v.reference` of its tensors).
::testing::AssertionResult compare(const Variant& v, const Values& actual, const Values& reference);

}  // namespace dlprobe::testing
