// Shared by the CUDA backend's GPU tests: one allocator and backend for the whole run, device
// tensors moved through the backend's own upload/download, and comparison against the reference
// backend in fp64 with tolerances by dtype.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "../engine/test_util.h"
#include "cuda_backend_impl.h"
#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/allocator/memory_source.h"

namespace dlprobe::testing {

// Created once (the CUDA context and library handles take a while) and torn down before exit.
class CudaEnv : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;
  static memory::CachingAllocator& allocator();
  static cuda::CudaBackend& backend();
};

struct DeviceTensor {
  TensorDesc desc;
  memory::DeviceBuffer buffer;
  TensorView view() const { return {desc, buffer.data()}; }
};

// A device tensor holding a copy of `host`.
DeviceTensor to_device(const HostTensor& host);
// A device tensor of `desc` filled with NaN (floating) so that an element the op under test
// forgets to write shows up.
DeviceTensor device_output(const TensorDesc& desc);
HostTensor to_host(const TensorView& view);
HostTensor to_host(const DeviceTensor& t);

// The same values in fp64, for the reference backend.
HostTensor f64(const HostTensor& t);

struct Tolerance {
  double atol;
  double rtol;
};
// fp32: a few ulps of fp32 sums; fp16/bf16: about two ulps of the type, since the reference is
// rounded to it once and the backend may round the other way after a different summation order.
Tolerance tolerance_for(DType t);

// `actual` against the fp64 `reference` rounded to actual's dtype, within atol + rtol * |ref|.
::testing::AssertionResult matches(const HostTensor& actual, const HostTensor& reference,
                                   Tolerance tol);
inline ::testing::AssertionResult matches(const HostTensor& actual, const HostTensor& reference) {
  return matches(actual, reference, tolerance_for(actual.dtype()));
}

// "fp16/nhwc" for test names.
std::string case_name(DType t, Layout l);

}  // namespace dlprobe::testing
