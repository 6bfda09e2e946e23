#include "backend_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"

namespace dlprobe::testing {

Tolerance tolerance(DType out, Precision p, const Check& c) {
  if (c.exact) return {0.0, 0.0};
  // Two units in the last place after one rounding to `out` (four for fp16), and as much near
  // zero; fp32 keeps room for the few roundings of a short formula in fp32.
  double tol = 1e-5;
  double eps = 1e-5;
  if (out == DType::fp16) {
    tol = 1e-3;
    eps = 2e-3;
  } else if (out == DType::bf16) {
    tol = 8e-3;
    eps = 1.6e-2;
  }
  // Each term of an fp32 sum adds rounding error; TF32 rounds every input to 10 mantissa bits,
  // so each product is good to about 1e-3.
  double per_term = 1e-5;
  if (p.math == MathMode::tf32) {
    tol = 1e-2;
    eps = 5e-3;
    per_term = 1e-3;
  }
  return {(tol + per_term * std::sqrt(c.terms)) * c.scale, eps};
}

namespace {

// How far `a` is from `r` in units of what the tolerance allows (0 when equal, infinity when it
// allows nothing or one of them is NaN or infinite and the other differs).
double normalised_error(double a, double r, const Tolerance& t) {
  if (std::isnan(a) || std::isnan(r)) {
    return std::isnan(a) && std::isnan(r) ? 0.0 : std::numeric_limits<double>::infinity();
  }
  if (std::isinf(a) || std::isinf(r)) return a == r ? 0.0 : std::numeric_limits<double>::infinity();
  const double err = std::abs(a - r);
  if (err == 0.0) return 0.0;
  const double allowed = t.tol + t.eps * std::abs(r);
  return allowed > 0.0 ? err / allowed : std::numeric_limits<double>::infinity();
}

}  // namespace

::testing::AssertionResult matches(const HostTensor& actual, const HostTensor& reference,
                                   Precision p, const Check& c) {
  if (!(actual.shape() == reference.shape())) {
    return ::testing::AssertionFailure()
           << "shape " << actual.shape().str() << ", the reference's " << reference.shape().str();
  }
  const Result<HostTensor> rounded = reference.to_dtype(actual.dtype());
  if (!rounded.has_value()) return ::testing::AssertionFailure() << rounded.status().message();
  const Tolerance t = tolerance(actual.dtype(), p, c);
  struct Miss {
    double norm;
    std::array<std::int64_t, 4> index;
    double actual;
    double reference;
  };
  std::vector<Miss> misses;
  for_each_index(actual.shape(), [&](std::array<std::int64_t, 4> i) {
    const double a = value_at(actual, i);
    const double r = value_at(*rounded, i);
    const double norm = normalised_error(a, r, t);
    if (norm > 1.0) misses.push_back({norm, i, a, r});
  });
  if (misses.empty()) return ::testing::AssertionSuccess();
  std::stable_sort(misses.begin(), misses.end(),
                   [](const Miss& x, const Miss& y) { return x.norm > y.norm; });
  ::testing::AssertionResult result = ::testing::AssertionFailure();
  result << misses.size() << " of " << actual.numel() << " " << dtype_name(actual.dtype())
         << " elements differ by more than " << t.tol << " + " << t.eps << " * |ref|; worst:";
  for (std::size_t k = 0; k < std::min<std::size_t>(misses.size(), 5); ++k) {
    const Miss& m = misses[k];
    result << "\n  at " << index_str(actual.shape(), m.index) << ": " << m.actual
           << " vs reference " << m.reference << " (normalised error " << m.norm << ")";
  }
  return result;
}

// ---- backends ----

BackendTensor to_backend(OpenedBackend& b, const HostTensor& host, bool misaligned) {
  const std::size_t offset = misaligned ? sizeof(float) : 0;
  BackendTensor t{host.desc(), {}, offset};
  auto buffer =
      b.allocator->allocate_buffer(host.desc().bytes() + offset, memory::Category::temporaries);
  if (!buffer.has_value()) {
    ADD_FAILURE() << buffer.status().message();
    return t;
  }
  t.buffer = std::move(buffer).value();
  const Status s = b.backend->upload(t.view().data, host.data(), host.desc().bytes());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return t;
}

BackendTensor backend_output(OpenedBackend& b, const TensorDesc& desc) {
  return to_backend(b, HostTensor(desc));
}

HostTensor to_host(OpenedBackend& b, const TensorView& view) {
  HostTensor h(view.desc);
  const Status s = b.backend->download(h.data(), view.data, view.desc.bytes());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return h;
}

namespace {

struct SharedBackends {
  std::map<std::string_view, std::unique_ptr<OpenedBackend>> opened;
  std::map<std::string_view, std::string> failed;
};
SharedBackends& shared() {
  static SharedBackends s;
  return s;
}

// Closes the shared backends before the process exits: the CUDA runtime tears itself down at
// exit, before the destructors of statics would run.
class CloseSharedBackends : public ::testing::Environment {
 public:
  void TearDown() override { shared().opened.clear(); }
};
[[maybe_unused]] ::testing::Environment* const kCloseSharedBackends =
    ::testing::AddGlobalTestEnvironment(new CloseSharedBackends);

}  // namespace

OpenedBackend* shared_backend(const BackendRow& row) {
  SharedBackends& s = shared();
  if (const auto it = s.opened.find(row.name); it != s.opened.end()) return it->second.get();
  if (const auto it = s.failed.find(row.name); it == s.failed.end()) {
    Result<OpenedBackend> opened = row.open();
    if (opened.has_value()) {
      auto& slot = s.opened[row.name];
      slot = std::make_unique<OpenedBackend>(std::move(opened).value());
      return slot.get();
    }
    s.failed[row.name] = opened.status().message();
  }
  ADD_FAILURE() << "cannot open the " << row.name << " backend: " << s.failed[row.name];
  return nullptr;
}

// ---- op cases ----

DType OpTensors::dtype(Role role) const {
  return role == Role::activation ? precision_.dtype : DType::fp32;
}

const HostTensor& OpTensors::input(const std::string& name, const HostTensor& values, Role role,
                                   bool misaligned) {
  Entry e;
  e.misaligned = misaligned;
  if (role == Role::own) {
    e.desc = values.desc();
    e.values = values;
  } else {
    const HostTensor rounded = values.to_dtype(dtype(role)).value();
    e.desc = rounded.desc();
    e.values = rounded.to_dtype(DType::fp64).value();
  }
  Entry& stored = entries_[name] = std::move(e);
  return stored.values;
}

void OpTensors::output(const std::string& name, const TensorDesc& desc) {
  entries_[name] = Entry{desc, {}, false};
}

void OpTensors::output(const std::string& name, const Shape& shape, Layout layout, Role role) {
  // Below rank 4 there is one layout.
  output(name,
         TensorDesc::make(shape, dtype(role), shape.rank == 4 ? layout : Layout::nchw).value());
}

const HostTensor& OpTensors::operator[](const std::string& name) const {
  return entries_.at(name).values;
}

BackendTensors::BackendTensors(OpenedBackend& b, const OpTensors& t) : backend_(b) {
  for (const auto& [name, e] : t.entries()) {
    tensors_.emplace(name,
                     e.values.numel() > 0
                         ? to_backend(b, e.values.to_dtype(e.desc.dtype()).value(), e.misaligned)
                         : backend_output(b, e.desc));
  }
}

TensorView BackendTensors::operator[](const std::string& name) const {
  return tensors_.at(name).view();
}

void BackendTensors::snapshot(const std::string& key, const std::string& name) {
  snapshots_[key] = to_host(backend_, tensors_.at(name).view());
}

HostTensor BackendTensors::result(const std::string& key) {
  if (const auto it = snapshots_.find(key); it != snapshots_.end()) return it->second;
  return to_host(backend_, tensors_.at(key).view());
}

std::vector<OpTest> op_tests() {
  std::vector<OpTest> tests;
  for (const BackendRow& row : backend_rows()) {
    for (const OpCase& op : op_cases()) {
      if (op.needs != nullptr && !(row.offers.*op.needs)) continue;
      std::vector<Precision> precisions;
      switch (op.precisions) {
        case Precisions::math:
          precisions = row.precisions;
          break;
        case Precisions::activations:
          for (const Precision& p : row.precisions) {
            if (p.math == MathMode::strict_fp32) precisions.push_back(p);
          }
          break;
        case Precisions::fp32:
          precisions = {kFp32};
          break;
        case Precisions::storage:
          precisions = {kFp32, kFp16, kBf16};
          break;
        case Precisions::halves:
          precisions = {kFp16, kBf16};
          break;
      }
      for (const Precision& p : precisions) tests.push_back({&row, &op, p});
    }
  }
  return tests;
}

std::string op_test_name(const OpTest& t) {
  return fmt::format("{}_{}_{}", t.row->name, t.op->name, t.precision.name);
}

void PrintTo(const OpTest& t, std::ostream* os) {
  *os << op_test_name(t);
}

void PrintTo(const BackendRow* row, std::ostream* os) {
  *os << row->name;
}

Result<Values> run_variant(OpenedBackend& b, const Variant& v) {
  BackendTensors tensors(b, v.tensors);
  DLPROBE_RETURN_IF_ERROR(v.run(*b.backend, tensors));
  Values out;
  for (const auto& [key, check] : v.checks) out[key] = tensors.result(key);
  return out;
}

::testing::AssertionResult compare(const Variant& v, const Values& actual,
                                   const Values& reference) {
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  bool failed = false;
  for (const auto& [key, check] : v.checks) {
    const auto a = actual.find(key);
    const auto r = reference.find(key);
    ::testing::AssertionResult one = ::testing::AssertionSuccess();
    if (a == actual.end() || r == reference.end()) {
      one = ::testing::AssertionFailure() << (a == actual.end() ? "no result" : "no reference");
    } else {
      one = matches(a->second, r->second, v.tensors.precision(), check);
    }
    if (one) continue;
    if (!failed) result = ::testing::AssertionFailure();
    failed = true;
    result << key << ": " << one.message() << "\n";
  }
  return result;
}

}  // namespace dlprobe::testing
