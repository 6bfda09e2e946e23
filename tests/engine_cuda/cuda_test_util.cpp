#include "cuda_test_util.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "dlprobe/core/log.h"

namespace dlprobe::testing {
namespace {

std::unique_ptr<memory::CachingAllocator> g_allocator;
std::unique_ptr<cuda::CudaBackend> g_backend;

// gtest_main runs main(); the environment registers itself before it.
[[maybe_unused]] ::testing::Environment* const g_env =
    ::testing::AddGlobalTestEnvironment(new CudaEnv);

}  // namespace

void CudaEnv::SetUp() {
  // DLPROBE_TEST_DEBUG=1 logs which cuDNN engine each convolution shape got.
  if (std::getenv("DLPROBE_TEST_DEBUG") != nullptr) log_set_level(LogLevel::debug);
  auto source = memory::make_cuda_memory_source(0);
  ASSERT_TRUE(source.has_value()) << source.status().message();
  auto allocator = memory::CachingAllocator::create(std::move(source).value());
  ASSERT_TRUE(allocator.has_value()) << allocator.status().message();
  g_allocator = std::move(allocator).value();
  auto backend = cuda::CudaBackend::create(0, *g_allocator, {});
  ASSERT_TRUE(backend.has_value()) << backend.status().message();
  g_backend = std::move(backend).value();
}

void CudaEnv::TearDown() {
  g_backend.reset();
  g_allocator.reset();
}

memory::CachingAllocator& CudaEnv::allocator() {
  return *g_allocator;
}
cuda::CudaBackend& CudaEnv::backend() {
  return *g_backend;
}

DeviceTensor to_device(const HostTensor& host) {
  DeviceTensor t{host.desc(),
                 CudaEnv::allocator()
                     .allocate_buffer(host.desc().bytes(), memory::Category::temporaries)
                     .value()};
  const Status s = CudaEnv::backend().upload(t.buffer.data(), host.data(), host.desc().bytes());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return t;
}

DeviceTensor device_output(const TensorDesc& desc) {
  DeviceTensor t{
      desc,
      CudaEnv::allocator().allocate_buffer(desc.bytes(), memory::Category::temporaries).value()};
  if (dtype_is_floating(desc.dtype())) {
    const Status s = CudaEnv::backend().fill(t.view(), std::numeric_limits<double>::quiet_NaN());
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  return t;
}

HostTensor to_host(const TensorView& view) {
  HostTensor h(view.desc);
  const Status s = CudaEnv::backend().download(h.data(), view.data, view.desc.bytes());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return h;
}

HostTensor to_host(const DeviceTensor& t) {
  return to_host(t.view());
}

HostTensor f64(const HostTensor& t) {
  return t.to_dtype(DType::fp64).value();
}

Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::fp16:
      return {1e-3, 2e-3};
    case DType::bf16:
      return {8e-3, 1.6e-2};
    default:
      return {1e-5, 1e-5};
  }
}

::testing::AssertionResult matches(const HostTensor& actual, const HostTensor& reference,
                                   Tolerance tol) {
  const HostTensor rounded = reference.to_dtype(actual.dtype()).value();
  return all_close(actual, rounded, tol.rtol, tol.atol);
}

std::string case_name(DType t, Layout l) {
  return fmt::format("{}/{}", dtype_name(t), layout_name(l));
}

}  // namespace dlprobe::testing
