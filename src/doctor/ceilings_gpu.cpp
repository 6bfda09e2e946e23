// GPU ceilings: dense GEMM through cuBLASLt, device-memory copy bandwidth, host<->device
// bandwidth. Every figure is the median over repetitions after warm-up, timed with CUDA events on
// one stream (pageable host copies with the host clock, see measure_host_bandwidth). The kernels
// are in ceilings_cuda.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "ceilings_kernels.h"
#include "cuda_check.h"
#include "dlprobe/core/log.h"
#include "dlprobe/doctor/ceilings.h"

namespace dlprobe {

namespace {

// ---- small RAII owners, so every early return frees what was made ----

// Owns `h` once it is set; `destroy` releases it at scope exit.
template <class Handle, auto destroy>
struct Owned {
  Handle h = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (h != nullptr) destroy(h);
  }
};

using DeviceMemory = Owned<void*, cudaFree>;
using PinnedMemory = Owned<void*, cudaFreeHost>;
using Event = Owned<cudaEvent_t, cudaEventDestroy>;
using Stream = Owned<cudaStream_t, cudaStreamDestroy>;
using LtHandle = Owned<cublasLtHandle_t, cublasLtDestroy>;

Status device_alloc(DeviceMemory& m, std::size_t bytes) {
  cudaError_t rc = cudaMalloc(&m.h, bytes);
  if (rc == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so later calls do not report it
    return error(Errc::out_of_memory, fmt::format("cudaMalloc of {} bytes: out of memory", bytes));
  }
  DLPROBE_CUDA_CHECK(rc);
  return Status::ok();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Times `op` (which enqueues work on `stream`) `reps` times after `warmup` untimed runs; returns
// the milliseconds of each timed run.
template <class Op>
Result<std::vector<double>> time_on_stream(cudaStream_t stream, int warmup, int reps, Op&& op) {
  for (int i = 0; i < warmup; ++i) DLPROBE_RETURN_IF_ERROR(op());
  DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<Event> start(static_cast<std::size_t>(reps)), stop(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    DLPROBE_CUDA_CHECK(cudaEventCreate(&start[i].h));
    DLPROBE_CUDA_CHECK(cudaEventCreate(&stop[i].h));
  }
  for (int i = 0; i < reps; ++i) {
    DLPROBE_CUDA_CHECK(cudaEventRecord(start[i].h, stream));
    DLPROBE_RETURN_IF_ERROR(op());
    DLPROBE_CUDA_CHECK(cudaEventRecord(stop[i].h, stream));
  }
  DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    DLPROBE_CUDA_CHECK(cudaEventElapsedTime(&t, start[i].h, stop[i].h));
    ms[i] = t;
  }
  return ms;
}

// ---- data ----

Status fill(void* p, std::size_t n, kernels::FillType type, std::uint64_t seed,
            cudaStream_t stream) {
  DLPROBE_CUDA_CHECK(kernels::fill_random(p, n, type, seed, stream));
  return Status::ok();
}

// ---- GEMM ----

// The element type a GEMM's inputs are filled as.
kernels::FillType fill_type(GemmDtype dtype) {
  switch (dtype) {
    case GemmDtype::fp32:
    case GemmDtype::tf32:
      return kernels::FillType::f32;
    case GemmDtype::fp16:
      return kernels::FillType::f16;
    case GemmDtype::bf16:
      return kernels::FillType::bf16;
    case GemmDtype::fp8_e4m3:
      return kernels::FillType::fp8_e4m3;
  }
  return kernels::FillType::f32;
}

struct GemmTypes {
  cudaDataType_t ab, cd;
  cublasComputeType_t compute;
  std::size_t ab_size, cd_size;
};

GemmTypes gemm_types(GemmDtype dtype) {
  switch (dtype) {
    case GemmDtype::fp32:
      return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 4, 4};
    case GemmDtype::tf32:
      return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4, 4};
    case GemmDtype::fp16:
      return {CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, 2, 2};
    case GemmDtype::bf16:
      return {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 2};
    case GemmDtype::fp8_e4m3:
      return {CUDA_R_8F_E4M3, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1, 2};
  }
  return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 4, 4};
}

// One cuBLASLt GEMM, D(m×n) = op(A)·B with A stored k×m and transposed ("TN"), B stored k×n, all
// column-major. TN is the layout cuBLASLt requires for fp8 and is used for every type so the
// figures compare like with like.
class Gemm {
 public:
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm() {
    if (pref_ != nullptr) cublasLtMatmulPreferenceDestroy(pref_);
    for (auto* l : {a_layout_, b_layout_, d_layout_})
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    if (op_ != nullptr) cublasLtMatmulDescDestroy(op_);
  }

  static Result<std::unique_ptr<Gemm>> create(cublasLtHandle_t lt, cudaStream_t stream,
                                              GemmDtype dtype, std::int64_t m, std::int64_t n,
                                              std::int64_t k, std::uint64_t workspace_bytes) {
    std::unique_ptr<Gemm> g(new Gemm());
    g->lt_ = lt;
    g->stream_ = stream;
    g->dtype_ = dtype;
    g->m_ = m, g->n_ = n, g->k_ = k;
    g->types_ = gemm_types(dtype);
    DLPROBE_RETURN_IF_ERROR(g->init(workspace_bytes));
    return Result<std::unique_ptr<Gemm>>(std::move(g));
  }

  Status run() {
    const float alpha = 1.0f, beta = 0.0f;
    // beta = 0, so C is never read; D doubles as C.
    DLPROBE_CUBLAS_CHECK(cublasLtMatmul(lt_, op_, &alpha, a_.h, a_layout_, b_.h, b_layout_, &beta,
                                        d_.h, d_layout_, d_.h, d_layout_, &algo_, workspace_.h,
                                        workspace_bytes_, stream_));
    return Status::ok();
  }

  double flops() const {
    return 2.0 * static_cast<double>(m_) * static_cast<double>(n_) * static_cast<double>(k_);
  }

  // The check: max over elements of |D - D_ref| / Σ_l |a·b|, from the device's own inputs.
  Result<double> compare_with_cpu() {
    DLPROBE_RETURN_IF_ERROR(run());
    DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DLPROBE_ASSIGN_OR_RETURN(auto a, copy_to_host_as_double(a_.h, k_ * m_, types_.ab));
    DLPROBE_ASSIGN_OR_RETURN(auto b, copy_to_host_as_double(b_.h, k_ * n_, types_.ab));
    DLPROBE_ASSIGN_OR_RETURN(auto d, copy_to_host_as_double(d_.h, m_ * n_, types_.cd));
    double worst = 0;
    for (std::int64_t j = 0; j < n_; ++j) {
      for (std::int64_t i = 0; i < m_; ++i) {
        double ref = 0, scale = 0;
        for (std::int64_t l = 0; l < k_; ++l) {
          const double p = a[l + i * k_] * b[l + j * k_];
          ref += p;
          scale += std::fabs(p);
        }
        if (scale > 0) worst = std::max(worst, std::fabs(d[i + j * m_] - ref) / scale);
      }
    }
    return worst;
  }

 private:
  Gemm() = default;

  Status init(std::uint64_t workspace_bytes) {
    const auto& t = types_;
    const auto ab_elems = [](std::int64_t r, std::int64_t c) {
      return static_cast<std::size_t>(r) * static_cast<std::size_t>(c);
    };
    DLPROBE_RETURN_IF_ERROR(device_alloc(a_, ab_elems(k_, m_) * t.ab_size));
    DLPROBE_RETURN_IF_ERROR(device_alloc(b_, ab_elems(k_, n_) * t.ab_size));
    DLPROBE_RETURN_IF_ERROR(device_alloc(d_, ab_elems(m_, n_) * t.cd_size));
    DLPROBE_RETURN_IF_ERROR(device_alloc(workspace_, workspace_bytes));
    workspace_bytes_ = workspace_bytes;
    DLPROBE_RETURN_IF_ERROR(fill_inputs());

    DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, t.compute, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                        sizeof(trans_a)));
    DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                        sizeof(trans_b)));
    if (dtype_ == GemmDtype::fp8_e4m3) {
      // fp8 GEMMs dequantise with per-tensor scales; unit scales keep the data as filled. Fast
      // accumulation stays off so the accumulator is the fp32 the ceiling is labelled with.
      // Each scale gets its own 16-byte-aligned slot: cuBLASLt's fp8 kernels want every pointer
      // they read 16-byte aligned.
      constexpr std::size_t kSlot = 16 / sizeof(float);
      DLPROBE_RETURN_IF_ERROR(device_alloc(scales_, 2 * kSlot * sizeof(float)));
      float ones[2 * kSlot] = {};
      ones[0] = ones[kSlot] = 1.0f;
      DLPROBE_CUDA_CHECK(cudaMemcpy(scales_.h, ones, sizeof(ones), cudaMemcpyHostToDevice));
      const float* a_scale = static_cast<const float*>(scales_.h);
      const float* b_scale = a_scale + kSlot;
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                          &a_scale, sizeof(a_scale)));
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                          &b_scale, sizeof(b_scale)));
      const std::int8_t fast_accum = 0;
      DLPROBE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                          &fast_accum, sizeof(fast_accum)));
    }
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    DLPROBE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout_, t.ab, u(k_), u(m_), k_));
    DLPROBE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout_, t.ab, u(k_), u(n_), k_));
    DLPROBE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_layout_, t.cd, u(m_), u(n_), m_));

    DLPROBE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
    DLPROBE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    DLPROBE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, op_, a_layout_, b_layout_, d_layout_,
                                                        d_layout_, pref_, 1, &result, &returned));
    if (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
      return error(Errc::unsupported,
                   fmt::format("cuBLASLt has no {} GEMM algorithm for {}x{}x{} on this GPU",
                               gemm_dtype_name(dtype_), m_, n_, k_));
    }
    algo_ = result.algo;
    return Status::ok();
  }

  Status fill_inputs() {
    const kernels::FillType type = fill_type(dtype_);
    DLPROBE_RETURN_IF_ERROR(fill(a_.h, static_cast<std::size_t>(k_ * m_), type, 1, stream_));
    return fill(b_.h, static_cast<std::size_t>(k_ * n_), type, 2, stream_);
  }

  // The host-side conversions of cuda_fp16.h, cuda_bf16.h and cuda_fp8.h decode exactly what the
  // GPU stored, so the reference sees the same inputs the GEMM did.
  Result<std::vector<double>> copy_to_host_as_double(const void* p, std::int64_t count,
                                                     cudaDataType_t type) {
    const std::size_t n = static_cast<std::size_t>(count);
    std::vector<double> out(n);
    auto copy = [&](auto tag) -> Status {
      using T = decltype(tag);
      // Raw bytes, decoded one element at a time through the type's host conversion.
      std::vector<unsigned char> bytes(n * sizeof(T));
      DLPROBE_CUDA_CHECK(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < n; ++i) {
        T value;
        std::memcpy(static_cast<void*>(&value), bytes.data() + i * sizeof(T), sizeof(T));
        out[i] = static_cast<double>(static_cast<float>(value));
      }
      return Status::ok();
    };
    switch (type) {
      case CUDA_R_32F:
        DLPROBE_RETURN_IF_ERROR(copy(float{}));
        break;
      case CUDA_R_16F:
        DLPROBE_RETURN_IF_ERROR(copy(__half{}));
        break;
      case CUDA_R_16BF:
        DLPROBE_RETURN_IF_ERROR(copy(__nv_bfloat16{}));
        break;
      case CUDA_R_8F_E4M3:
        DLPROBE_RETURN_IF_ERROR(copy(__nv_fp8_e4m3{}));
        break;
      default:
        return error(Errc::internal, "unexpected data type in the GEMM check");
    }
    return out;
  }

  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  GemmDtype dtype_ = GemmDtype::fp32;
  std::int64_t m_ = 0, n_ = 0, k_ = 0;
  GemmTypes types_{};
  DeviceMemory a_, b_, d_, workspace_, scales_;
  std::uint64_t workspace_bytes_ = 0;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, d_layout_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

// cuBLASLt's fp8 GEMMs need sm_89 (Ada) or newer.
std::string gemm_unsupported_reason(GemmDtype dtype, const cudaDeviceProp& prop) {
  const int cc = prop.major * 10 + prop.minor;
  if (dtype == GemmDtype::fp8_e4m3 && cc < 89)
    return fmt::format("fp8 tensor cores need compute capability 8.9 or newer (this GPU: {}.{})",
                       prop.major, prop.minor);
  if ((dtype == GemmDtype::bf16 || dtype == GemmDtype::tf32) && cc < 80)
    return fmt::format("{} tensor cores need compute capability 8.0 or newer (this GPU: {}.{})",
                       gemm_dtype_name(dtype), prop.major, prop.minor);
  return {};
}

// The small shape of the correctness check: unequal sides catch a swapped transpose, multiples of
// 16 satisfy fp8's alignment rules.
constexpr std::int64_t kCheckM = 384, kCheckN = 256, kCheckK = 320;

GemmCeiling measure_gemm(cublasLtHandle_t lt, cudaStream_t stream, const cudaDeviceProp& prop,
                         double clock_mhz, GemmDtype dtype, const CeilingOptions& o) {
  GemmCeiling c;
  c.dtype = dtype;
  c.m = c.n = c.k = o.gemm_size;
  c.layout = "TN";
  c.theoretical_tflops =
      theoretical_gemm_tflops(prop.major, prop.minor, prop.multiProcessorCount, clock_mhz, dtype);
  c.why_not = gemm_unsupported_reason(dtype, prop);
  if (!c.why_not.empty()) return c;
  if (o.check) {
    auto check = Gemm::create(lt, stream, dtype, kCheckM, kCheckN, kCheckK, o.workspace_bytes);
    Result<double> err = check ? check.value()->compare_with_cpu() : Result<double>(check.status());
    if (!err) {
      c.why_not = "correctness check failed to run: " + err.status().message();
      return c;
    }
    c.check_error = *err;
    if (*err > gemm_check_tolerance(dtype)) {
      c.why_not = fmt::format("result differs from the CPU reference by {:.3g} (tolerance {:.3g})",
                              *err, gemm_check_tolerance(dtype));
      return c;
    }
  }
  auto gemm = Gemm::create(lt, stream, dtype, c.m, c.n, c.k, o.workspace_bytes);
  if (!gemm) {
    c.why_not = gemm.status().message();
    return c;
  }
  Gemm& g = *gemm.value();
  auto ms = time_on_stream(stream, o.warmup, o.repetitions, [&] { return g.run(); });
  if (!ms) {
    c.why_not = ms.status().message();
    return c;
  }
  const auto tflops = [&](double t_ms) { return g.flops() / (t_ms * 1e-3) / 1e12; };
  c.tflops = tflops(median(*ms));
  c.tflops_min = tflops(*std::max_element(ms->begin(), ms->end()));
  c.tflops_max = tflops(*std::min_element(ms->begin(), ms->end()));
  c.measured = true;
  return c;
}

// ---- memory bandwidth ----

BandwidthCeiling failed(std::string name, std::string why) {
  BandwidthCeiling b;
  b.name = std::move(name);
  b.why_not = std::move(why);
  return b;
}

// `bytes` moved per repetition, at the median of the repetitions' milliseconds `ms`.
BandwidthCeiling measured(std::string name, std::uint64_t bytes, const std::vector<double>& ms) {
  BandwidthCeiling b;
  b.name = std::move(name);
  b.measured = true;
  b.bytes = bytes;
  b.gbs = static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
  return b;
}

std::vector<BandwidthCeiling> measure_device_bandwidth(cudaStream_t stream,
                                                       const cudaDeviceProp& prop,
                                                       std::optional<double> theoretical,
                                                       const CeilingOptions& o) {
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
    return {failed("device_copy_kernel", "cudaMemGetInfo failed")};
  // Shrink to what is free (keeping a margin for the context), but never to where L2 would hold a
  // good part of the buffers and flatter the figure.
  std::size_t bytes = o.device_copy_bytes;
  const std::size_t fit = free_bytes / 10 * 4;
  if (bytes > fit) bytes = fit;
  bytes = bytes / 4096 * 4096;
  const std::size_t min_bytes = 16 * static_cast<std::size_t>(prop.l2CacheSize);
  if (bytes < min_bytes) {
    const auto why = fmt::format("only {} bytes free; the copy needs two buffers of at least {}",
                                 free_bytes, min_bytes);
    return {failed("device_copy_kernel", why), failed("device_memcpy_d2d", why)};
  }
  DeviceMemory src, dst;
  for (DeviceMemory* m : {&src, &dst}) {
    Status s = device_alloc(*m, bytes);
    if (!s)
      return {failed("device_copy_kernel", s.message()), failed("device_memcpy_d2d", s.message())};
  }
  if (Status s = fill(src.h, bytes / 4, kernels::FillType::f32, 3, stream); !s)
    return {failed("device_copy_kernel", s.message()), failed("device_memcpy_d2d", s.message())};

  std::vector<BandwidthCeiling> out;
  auto kernel = [&]() -> Status {
    DLPROBE_CUDA_CHECK(kernels::copy_16b(src.h, dst.h, bytes, stream));
    return Status::ok();
  };
  auto memcpy_d2d = [&]() -> Status {
    DLPROBE_CUDA_CHECK(cudaMemcpyAsync(dst.h, src.h, bytes, cudaMemcpyDeviceToDevice, stream));
    return Status::ok();
  };
  const std::pair<const char*, std::function<Status()>> runs[] = {
      {"device_copy_kernel", kernel}, {"device_memcpy_d2d", memcpy_d2d}};
  for (const auto& [name, op] : runs) {
    auto ms = time_on_stream(stream, o.warmup, o.repetitions, op);
    if (!ms) {
      out.push_back(failed(name, ms.status().message()));
      continue;
    }
    // Every byte is read once and written once.
    BandwidthCeiling b = measured(name, 2 * bytes, *ms);
    b.theoretical_gbs = theoretical;
    out.push_back(std::move(b));
  }
  return out;
}

// Pinned copies are timed with events. Pageable ones are timed with the host clock around a
// synchronous cudaMemcpy: the driver stages them through its own pinned buffer on the calling
// thread, and that host-side time is part of what a framework pays.
std::vector<BandwidthCeiling> measure_host_bandwidth(cudaStream_t stream, const CeilingOptions& o) {
  std::vector<BandwidthCeiling> out;
  const std::size_t bytes = o.host_copy_bytes;
  DeviceMemory dev;
  if (Status s = device_alloc(dev, bytes); !s) {
    for (const char* name : {"h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable"})
      out.push_back(failed(name, s.message()));
    return out;
  }
  PinnedMemory pinned;
  if (cudaMallocHost(&pinned.h, bytes) != cudaSuccess) {
    cudaGetLastError();
    out.push_back(failed("h2d_pinned", "cudaMallocHost failed"));
    out.push_back(failed("d2h_pinned", "cudaMallocHost failed"));
  } else {
    std::memset(pinned.h, 1, bytes);
    for (bool h2d : {true, false}) {
      const char* name = h2d ? "h2d_pinned" : "d2h_pinned";
      auto ms = time_on_stream(stream, 1, o.repetitions, [&]() -> Status {
        DLPROBE_CUDA_CHECK(cudaMemcpyAsync(h2d ? dev.h : pinned.h, h2d ? pinned.h : dev.h, bytes,
                                           h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                           stream));
        return Status::ok();
      });
      if (!ms) {
        out.push_back(failed(name, ms.status().message()));
        continue;
      }
      out.push_back(measured(name, bytes, *ms));
    }
  }
  std::vector<char> pageable(bytes, 1);  // written, so every page is resident before timing
  for (bool h2d : {true, false}) {
    const char* name = h2d ? "h2d_pageable" : "d2h_pageable";
    std::vector<double> ms;
    std::string why;
    for (int i = 0; i < 1 + o.repetitions && why.empty(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      cudaError_t rc = cudaMemcpy(h2d ? dev.h : static_cast<void*>(pageable.data()),
                                  h2d ? static_cast<const void*>(pageable.data()) : dev.h, bytes,
                                  h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
      const auto t1 = std::chrono::steady_clock::now();
      if (rc != cudaSuccess) why = fmt::format("cudaMemcpy: {}", cudaGetErrorString(rc));
      if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    if (!why.empty()) {
      out.push_back(failed(name, why));
      continue;
    }
    out.push_back(measured(name, bytes, ms));
  }
  return out;
}

Status use_device(int device, cudaDeviceProp& prop) {
  int count = 0;
  DLPROBE_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    return error(Errc::invalid_argument,
                 fmt::format("no CUDA device {} (this machine has {})", device, count));
  DLPROBE_CUDA_CHECK(cudaSetDevice(device));
  DLPROBE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return Status::ok();
}

}  // namespace

Result<Ceilings> measure_ceilings(int device, const CeilingOptions& o) {
  if (o.repetitions < 1 || o.warmup < 0 || o.gemm_size < 16)
    return invalid_argument("ceilings need at least 1 repetition and a GEMM size of 16 or more");
  cudaDeviceProp prop{};
  DLPROBE_RETURN_IF_ERROR(use_device(device, prop));
  // cudaDeviceProp lost clockRate and memoryClockRate in CUDA 13; the attributes remain.
  int clock_khz = 0, mem_clock_khz = 0;
  DLPROBE_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  DLPROBE_CUDA_CHECK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device));

  Ceilings out;
  out.device = device;
  out.device_name = prop.name;
  out.sm_clock_mhz = clock_khz / 1000.0;
  Stream stream;
  DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream.h, cudaStreamNonBlocking));

  if (o.gemm) {
    LtHandle lt;
    DLPROBE_CUBLAS_CHECK(cublasLtCreate(&lt.h));
    for (GemmDtype dtype : o.dtypes) {
      log_info("ceilings: {} GEMM {}^3 on device {}", gemm_dtype_name(dtype), o.gemm_size, device);
      out.gemm.push_back(measure_gemm(lt.h, stream.h, prop, out.sm_clock_mhz, dtype, o));
    }
  }
  if (o.device_bandwidth) {
    log_info("ceilings: device memory bandwidth on device {}", device);
    std::optional<double> theoretical;
    if (prop.memoryBusWidth > 0 && mem_clock_khz > 0)
      theoretical = theoretical_memory_bandwidth_gbs(prop.memoryBusWidth, mem_clock_khz / 1000.0);
    for (auto& b : measure_device_bandwidth(stream.h, prop, theoretical, o))
      out.bandwidth.push_back(std::move(b));
  }
  if (o.host_bandwidth) {
    log_info("ceilings: host<->device bandwidth on device {}", device);
    for (auto& b : measure_host_bandwidth(stream.h, o)) out.bandwidth.push_back(std::move(b));
  }
  return out;
}

Result<double> gemm_check_error(int device, GemmDtype dtype, std::int64_t m, std::int64_t n,
                                std::int64_t k) {
  cudaDeviceProp prop{};
  DLPROBE_RETURN_IF_ERROR(use_device(device, prop));
  if (auto why = gemm_unsupported_reason(dtype, prop); !why.empty())
    return error(Errc::unsupported, why);
  Stream stream;
  DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream.h, cudaStreamNonBlocking));
  LtHandle lt;
  DLPROBE_CUBLAS_CHECK(cublasLtCreate(&lt.h));
  DLPROBE_ASSIGN_OR_RETURN(auto gemm, Gemm::create(lt.h, stream.h, dtype, m, n, k, 32ull << 20));
  return gemm->compare_with_cpu();
}

}  // namespace dlprobe
