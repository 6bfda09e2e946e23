// The measured GEMM ceilings that a sweep's achieved TFLOP/s is compared with: taken from doctor's
// measurement, or measured for just the precisions a sweep runs.
#pragma once

#include <map>
#include <vector>

#include "dlprobe/bench/results.h"
#include "dlprobe/bench/sweep.h"
#include "dlprobe/doctor/ceilings.h"

namespace dlprobe::bench {

// Doctor's measured GEMM ceilings by the precision whose matrix products run on their dtype.
std::map<engine::Precision, Ceiling> ceilings_by_precision(const Ceilings& ceilings);

// The GEMM dtypes of the precisions a sweep runs (none for fp64), each once.
std::vector<GemmDtype> ceiling_dtypes(const Sweep& sweep);

// Those ceilings, measured on the sweep's CUDA device as doctor does (cuBLASLt, 8192^3) but
// without the bandwidth figures; empty with a warning saying why where the measurement fails.
std::map<engine::Precision, Ceiling> measure_sweep_ceilings(const Sweep& sweep);

}  // namespace dlprobe::bench
