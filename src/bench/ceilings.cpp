#include "dlprobe/bench/ceilings.h"

#include <algorithm>

#include "dlprobe/core/log.h"

namespace dlprobe::bench {

std::map<engine::Precision, Ceiling> ceilings_by_precision(const Ceilings& ceilings) {
  std::map<engine::Precision, Ceiling> out;
  for (const engine::Precision p : {engine::Precision::fp32, engine::Precision::tf32,
                                    engine::Precision::fp16, engine::Precision::bf16}) {
    const auto dtype = ceiling_dtype(p);
    for (const GemmCeiling& g : ceilings.gemm) {
      if (dtype && g.measured && gemm_dtype_name(g.dtype) == *dtype) out[p] = {*dtype, g.tflops};
    }
  }
  return out;
}

std::vector<GemmDtype> ceiling_dtypes(const Sweep& sweep) {
  std::vector<GemmDtype> out;
  for (const SweepGroup& g : sweep.groups) {
    const auto name = ceiling_dtype(g.step.precision);
    const auto dtype = name ? parse_gemm_dtype(*name) : std::nullopt;
    if (dtype && std::find(out.begin(), out.end(), *dtype) == out.end()) out.push_back(*dtype);
  }
  return out;
}

std::map<engine::Precision, Ceiling> measure_sweep_ceilings(const Sweep& sweep) {
  CeilingOptions options;
  options.device_bandwidth = false;
  options.host_bandwidth = false;
  options.dtypes = ceiling_dtypes(sweep);
  if (options.dtypes.empty()) return {};
  auto measured = measure_ceilings(sweep.device.index, options);
  if (!measured) {
    log_warn("no GEMM ceilings: {}", measured.status().message());
    return {};
  }
  return ceilings_by_precision(*measured);
}

}  // namespace dlprobe::bench
