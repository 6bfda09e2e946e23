// The CUDA backend's batch_norm_add_backward beside the two batch_norm_backward calls it stands
// for: the same gradients to the bit, where its own kernels run (the op table in
// backend_ops_test checks both against fp64). Bit equality is what lets the step take the pair
// without changing a value.
#include <gtest/gtest.h>

#include <string>

#include "cuda_rows.h"
#include "test_util.h"

namespace dlprobe::testing {
namespace {

using CudaBatchNorm = CudaTest;

// One batch norm's operands on the GPU and two sets of outputs: the pair's and the single call's.
struct Side {
  BackendTensor x, gamma, mean, invstd;
  BackendTensor dx, dgamma, dbeta;     // from batch_norm_add_backward
  BackendTensor dx1, dgamma1, dbeta1;  // from batch_norm_backward

  Backend::BatchNormGrads pair() const {
    return {x.view(),  gamma.view(),  mean.view(), invstd.view(),
            dx.view(), dgamma.view(), dbeta.view()};
  }
};

Side side(OpenedBackend& env, const TensorDesc& d, std::uint64_t seed) {
  const Shape c{d.dim(1)};
  const TensorDesc cd = desc(c, DType::fp32);
  return {to_backend(env, rand(d.shape(), seed, d.dtype(), d.layout(), -2.0, 3.0)),
          to_backend(env, rand(c, seed + 1, DType::fp32, Layout::nchw, 0.5, 1.5)),
          to_backend(env, rand(c, seed + 2, DType::fp32, Layout::nchw, -0.5, 1.0)),
          to_backend(env, rand(c, seed + 3, DType::fp32, Layout::nchw, 0.3, 0.7)),
          backend_output(env, d),
          backend_output(env, cd),
          backend_output(env, cd),
          backend_output(env, d),
          backend_output(env, cd),
          backend_output(env, cd)};
}

// ResNet-50's layer1 block output at batch 8 (three launches in every dtype, one channel tile)
// and layer3's at batch 16 (four tiles in fp16 and bf16).
TEST_F(CudaBatchNorm, AddBackwardIsTheTwoBackwardsToTheBit) {
  for (const DType dtype : {DType::fp16, DType::bf16, DType::fp32}) {
    for (const Shape& s : {Shape{8, 256, 56, 56}, Shape{16, 1024, 14, 14}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + s.str());
      const TensorDesc d = desc(s, dtype, Layout::nhwc);
      const BackendTensor dy = to_backend(env(), rand(s, 11, dtype, Layout::nhwc));
      Side a = side(env(), d, 20);
      Side b = side(env(), d, 40);
      ASSERT_TRUE(shared().batch_norm_add_backward(dy.view(), a.pair(), b.pair()).is_ok());
      for (Side* one : {&a, &b}) {
        ASSERT_TRUE(shared()
                        .batch_norm_backward(dy.view(), one->x.view(), one->gamma.view(),
                                             one->mean.view(), one->invstd.view(), one->dx1.view(),
                                             one->dgamma1.view(), one->dbeta1.view())
                        .is_ok());
      }
      for (const Side* one : {&a, &b}) {
        EXPECT_TRUE(identical(to_host(env(), one->dx.view()), to_host(env(), one->dx1.view())));
        EXPECT_TRUE(
            identical(to_host(env(), one->dgamma.view()), to_host(env(), one->dgamma1.view())));
        EXPECT_TRUE(
            identical(to_host(env(), one->dbeta.view()), to_host(env(), one->dbeta1.view())));
      }
    }
  }
}

}  // namespace
}  // namespace dlprobe::testing
