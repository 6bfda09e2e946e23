// `dlprobe bench`'s engine: plan a training step for a model, run warm-up steps, time the rest, and
// report images per second and peak memory by category.
//
// Timing: img/s = batch * steps / elapsed, with elapsed measured from just before the first timed
// step is queued to the end of a device synchronisation after the last (steps queue back to back;
// under fp16 each step waits for the previous one's inf/NaN check, as the loss scale depends on
// it). Peak memory is the caching allocator's over the timed steps only (after warm-up has filled
// its cache), so it is what a steady training loop needs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/allocator.h"
#include "dlprobe/backend.h"
#include "dlprobe/status.h"
#include "dlprobe/step.h"

namespace dlprobe::bench {

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
};
// "cpu" or "cuda:N" (also "cuda" for cuda:0).
Result<Device> parse_device(std::string_view text, std::string_view flag = "device");
std::string device_name(const Device& d);

// Which cuDNN convolution engines may run (ignored on the CPU). Never those that sum in 16 bits.
enum class ConvEngines : std::uint8_t {
  any,            // also non-deterministic, FFT and Winograd ones: what cudnn.benchmark allows
  deterministic,  // the same bits on every run
  exact,          // deterministic direct sums only (no FFT / Winograd): the engine's own tests
};
Result<ConvEngines> parse_conv_engines(std::string_view text, std::string_view flag);

// How the CUDA backend picks convolution engines.
struct ConvOptions {
  bool autotune = true;  // time every allowed engine per shape and keep the fastest
  ConvEngines engines = ConvEngines::any;
};

struct BenchOptions {
  engine::StepConfig step;
  Device device;
  std::int64_t steps = 30;
  std::int64_t warmup = 5;
  std::string weights;  // a safetensors state dict to start from; empty: seeded initialisation
  std::uint64_t data_seed = 0;  // the synthetic batch
  ConvOptions conv;
  // After the timed steps, this many more steps with a timing mark around every call; the
  // per-call times are the median over them.
  std::int64_t profile_steps = 0;
};

// Where a profiled step's time goes, per call of the plan.
struct CallTime {
  std::string name;
  engine::CallKind kind = engine::CallKind::fill;
  double ms = 0.0;  // median over the profiled steps
};

struct BenchResult {
  std::string backend;  // the backend's name
  double elapsed_seconds = 0.0;
  double images_per_second = 0.0;
  engine::StepResult last;  // the last timed step's loss
  memory::MemoryStats memory;
  std::vector<CallTime> profile;  // parallel to the step's calls; empty unless profiled
};

// Bad options, a device this build cannot drive, a weights file that does not fit the model and
// running out of memory are all errors (the last with the allocator's report as its message).
Result<BenchResult> run_bench(const BenchOptions& options);

}  // namespace dlprobe::bench
