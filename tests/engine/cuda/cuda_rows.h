// The backend of the GPU test binaries: the CUDA backend on device 0, shared by every test of
// the process (its context and library handles take a while to make).
#pragma once

#include <gtest/gtest.h>

#include "backend_ops.h"
#include "cuda_backend_impl.h"

namespace dlprobe::testing {

const BackendRow& cuda_row();

// Tests of the CUDA backend beyond the table's numerics (plan caches, tuning, graphs).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = shared_backend(cuda_row());
    ASSERT_NE(env_, nullptr);
  }
  OpenedBackend& env() { return *env_; }
  cuda::CudaBackend& shared() { return static_cast<cuda::CudaBackend&>(*env_->backend); }
  memory::CachingAllocator& allocator() { return *env_->allocator; }

 private:
  OpenedBackend* env_ = nullptr;
};

}  // namespace dlprobe::testing
