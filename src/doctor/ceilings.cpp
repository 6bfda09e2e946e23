#include "dlprobe/doctor/ceilings.h"

namespace dlprobe {

double gemm_check_tolerance(GemmDtype dtype) {
  switch (dtype) {
    case GemmDtype::fp32:
      return 1e-4;  // fp32 accumulation in any order over a few hundred terms
    case GemmDtype::tf32:
      return 4e-3;  // inputs rounded to 10 mantissa bits: ~2^-10 per product
    case GemmDtype::fp16:
      return 2e-3;  // fp16 output: 2^-11 of |D| <= Σ|a·b|
    case GemmDtype::bf16:
    case GemmDtype::fp8_e4m3:
      return 1e-2;  // bf16 output: 2^-8 of |D| (fp8 inputs are exact in the reference)
  }
  return 0;
}

#if !DLPROBE_WITH_CUDA
// Without the CUDA backend there is nothing to measure on; callers get the reason to show.
Result<Ceilings> measure_ceilings(int, const CeilingOptions&) {
  return error(Errc::unavailable, "dlprobe was built without CUDA (DLPROBE_WITH_CUDA=OFF)");
}
Result<double> gemm_check_error(int, GemmDtype, std::int64_t, std::int64_t, std::int64_t) {
  return error(Errc::unavailable, "dlprobe was built without CUDA (DLPROBE_WITH_CUDA=OFF)");
}
#endif

}  // namespace dlprobe
