// The results file every measuring command writes and report / compare read: one JSON document,
// schema "dlprobe.results/1" (docs/results-schema.md), holding the context of the run (host, GPUs,
// software stack, device state at the start) and one entry per measured configuration (settings,
// status, statistics, raw step times, memory, telemetry, achieved TFLOP/s, findings).
//
// Reading is strict: a file that is not dlprobe results, has another schema version, is cut off, or
// lacks a field (or has one of the wrong type) is refused with one line naming the file and the
// JSON path. Fields that may be unknown are written as null, never left out, so that a missing key
// always means a broken file. Keys this version does not know are ignored.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/severity.h"
#include "dlprobe/core/status.h"
#include "dlprobe/stats/statistics.h"
#include "dlprobe/stats/steady_state.h"

namespace dlprobe::results {

inline constexpr std::string_view kSchema = "dlprobe.results/1";

// ---- context: where and with what the run happened ----

struct Library {
  std::string name;     // "cuDNN"
  std::string version;  // "9.19.0"; empty when not found
  std::string path;     // the file loaded; empty when unknown

  friend bool operator==(const Library&, const Library&) = default;
};

struct Gpu {
  int index = 0;
  std::string name;
  std::string uuid;
  std::string pci_bus_id;
  std::optional<std::string> compute_capability;  // "9.0"
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<int> sm_count;

  friend bool operator==(const Gpu&, const Gpu&) = default;
};

struct GpuProcess {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_bytes;

  friend bool operator==(const GpuProcess&, const GpuProcess&) = default;
};

// A GPU's state when the run started: what could make its numbers differ from another day's.
struct DeviceState {
  int gpu = 0;
  std::optional<double> sm_clock_mhz;
  std::optional<double> mem_clock_mhz;
  std::optional<double> temperature_c;
  std::optional<double> power_w;
  std::optional<double> power_limit_w;
  std::vector<std::string> clock_event_reasons;  // active throttle reasons
  std::vector<GpuProcess> other_processes;       // this process left out

  friend bool operator==(const DeviceState&, const DeviceState&) = default;
};

// The container the run was in (doctor::detect_container); fields empty where unknown.
struct Container {
  std::string runtime;  // "docker", "podman", "containerd", "kubernetes"
  std::string image;    // "nvcr.io/nvidia/pytorch:24.05-py3", "NGC PyTorch 24.05 (build 91564)"
  std::string digest;   // "sha256:..." when the runtime or the user says it

  friend bool operator==(const Container&, const Container&) = default;
};

struct Context {
  std::string dlprobe_version;
  std::string git_hash;
  std::vector<std::string> command_line;
  std::string date;  // ISO-8601 UTC, "2025-03-01T12:34:56Z"
  std::string hostname;
  std::string os;
  std::string cpu;
  std::optional<int> cpu_threads;
  std::optional<std::uint64_t> host_memory_bytes;
  std::optional<std::string> driver_version;        // "580.65.06"
  std::optional<std::string> cuda_driver_version;   // newest CUDA the driver supports: "13.0"
  std::optional<std::string> cuda_runtime_version;  // the runtime dlprobe runs on: "13.0"
  std::vector<Library> libraries;
  std::vector<Gpu> gpus;
  std::vector<DeviceState> device_state;
  // Added within dlprobe.results/1: files written before it lack the key; absent or null when the
  // run was in no container dlprobe could tell.
  std::optional<Container> container;

  friend bool operator==(const Context&, const Context&) = default;
};

// The current time as ISO-8601 UTC with seconds, for Context::date.
std::string iso8601_utc_now();

// ---- one configuration ----

enum class Kind { native, external };
std::string_view kind_name(Kind kind);

enum class RunStatus { ok, oom, failed, interrupted, timeout };
std::string_view run_status_name(RunStatus status);

// Where the runs of a configuration's spread ran: on fresh engines in one process (bench
// --repeat) or each in a fresh process (bench --repeat-process), which also sees what a process
// starts anew (the loader, the allocator's address space, the threads' placement).
enum class RunsIn { engines, processes };
std::string_view runs_in_name(RunsIn runs_in);

// Native runs fill the first block, external runs (a user's command) the second; the other block
// stays empty and is not written.
struct Settings {
  std::string model;  // "resnet50"
  std::int64_t batch = 0;
  std::string precision;  // "fp32", "tf32", "bf16", "fp16", "fp64"
  std::string mode;       // "train", "grads", "infer"
  std::string layout;     // "nchw", "nhwc"
  std::string device;     // "cuda:0", "cpu"
  std::string optimizer;  // "sgd", "adamw"; "none" outside train mode
  // Added within dlprobe.results/1, so files written before them lack these keys and read as 0 /
  // "": how the run took device memory (--gpu-memory: "grow", "planned", "limit:16GiB", ...; empty
  // reads as the default, grow), the square image side, the classes of the model's last layer,
  // the engine's backend ("cuda", "onednn", "reference"), and the model's width (channels of its
  // stem; 0 reads as torchvision's 64).
  std::string gpu_memory;
  std::int64_t image_size = 0;
  std::int64_t classes = 0;
  std::string backend;
  std::int64_t width = 0;
  // Where the step's images came from: "" (read as "synthetic": one batch kept on the device),
  // "jpeg-gpu" (JPEGs decoded and augmented on the GPU) or "jpeg-cpu" (on the host's threads).
  std::string input;
  // The backend streams the step ran on (StepConfig::streams) where more than one; 0 (and files
  // without the key): one.
  std::int64_t streams = 0;
  // On two streams, the bound on how far stream 0 runs ahead of a weight gradient, in calls
  // (StepConfig::stream_lag); 0 (and files before it): no bound, or one stream.
  std::int64_t stream_lag = 0;
  // What the backward pass computed again instead of keeping (StepConfig::recompute_block_outputs):
  // "block-outputs"; empty (and files before it) for nothing.
  std::string recompute;

  std::string command;                       // as the user gave it
  std::map<std::string, std::string> sweep;  // the sweep's keys and this run's values

  friend bool operator==(const Settings&, const Settings&) = default;
};

// The batch of a configuration: Settings::batch, or an external run's sweep value "batch".
std::optional<std::int64_t> batch_of(Kind kind, const Settings& settings);
// The precision: Settings::precision, or an external run's sweep value "precision"; "" if none.
std::string precision_of(Kind kind, const Settings& settings);
// "resnet50 bs=256 bf16 train nhwc cuda:0 sgd" or "python train.py (batch=64, precision=bf16)";
// a width other than 64 and an image side other than 224 follow the model ("resnet18-w16@64"), a
// backend other than the device's own follows the device ("cpu/reference"), and classes other
// than 1000 come last ("classes=10").
std::string describe(Kind kind, const Settings& settings);

// The settings with what each key a file may lack means written in (width 64, images 224, 1000
// classes, grow, synthetic input, one stream; the layout in lower case), so that a file from
// before a key and one with the key at its default name one configuration.
Settings with_defaults(Kind kind, const Settings& settings);
bool same_settings(Kind kind, const Settings& a, const Settings& b);

// Everything of a configuration but its batch: the series it belongs to in a throughput-vs-batch
// curve. "resnet50 bf16 train nhwc cuda:0 sgd"; "python train.py precision=bf16".
std::string series_label(Kind kind, const Settings& settings);

// How one run warmed up (bench's protocol, docs/bench.md "Warm-up").
struct Warmup {
  std::string mode;  // "steady" (until the step times stop falling) or "fixed"
  std::int64_t steps = 0;
  double seconds = 0;
  bool steady = false;  // mode steady: the test passed; false: a bound (time, steps) ended it
  // Timed windows that started unsettled and were timed again; their steps are in the curve.
  std::int64_t restarts = 0;
  std::vector<double> step_seconds;  // the warm-up curve

  friend bool operator==(const Warmup&, const Warmup&) = default;
};

// The raw measurement: one entry per timed step (warm-up steps are left out).
struct Samples {
  std::vector<double> step_seconds;
  std::vector<double> step_items;  // images (samples) each step processed; same length
  int warmup_steps = 0;            // every run's together
  // With repeated timed windows (bench --windows), the steps of each window in order; they add up
  // to the step count. Empty: one window. Added within dlprobe.results/1 (absent in older files).
  std::vector<std::int64_t> window_steps;
  // With runs from scratch (bench --repeat), the steps of each run in order, adding up to the step
  // count; empty: one run. Added within dlprobe.results/1, as is the warm-up of each run.
  std::vector<std::int64_t> run_steps;
  std::vector<Warmup> warmup;
  // CPU seconds that other processes on the host used during each timed window, every run's in
  // order (/proc/stat's busy time less this process's), and the CPUs online; empty and 0 where not
  // read (an external run, an older file). Added within dlprobe.results/1.
  std::vector<double> window_other_cpu_seconds;
  int host_cpus = 0;

  friend bool operator==(const Samples&, const Samples&) = default;
};

// Items per second of each timed window (one value without repeated windows); empty when the
// window steps do not add up to the samples or a window has no time.
std::vector<double> window_throughputs(const Samples& samples);
// The same for each run (Samples::run_steps).
std::vector<double> run_throughputs(const Samples& samples);

// The share of the host's CPU time (0 to 1) that other processes used over the timed windows: their
// CPU seconds over the windows' step time times the CPUs; nullopt where not recorded.
std::optional<double> other_cpu_share(const Samples& samples);

struct Memory {
  // "allocator": dlprobe's caching allocator (allocator_stats holds memory::to_flat_json);
  // "framework": figures an external run reported; "nvml": only NVML's view of the process.
  std::string source;
  nlohmann::json allocator_stats;  // an object, or null when not from dlprobe's allocator
  std::optional<std::int64_t> framework_peak_allocated_bytes;
  std::optional<std::int64_t> framework_peak_reserved_bytes;
  std::optional<std::int64_t> nvml_process_peak_bytes;
  // `dlprobe memory`'s analysis (memory::to_json(AnalysisRecord), docs/results-schema.md): an
  // object, or null. Files written before it existed lack the key, which reads as null.
  nlohmann::json analysis;
  // A planned step's arena when most of it is live (bench: the `fullest` object of
  // memory.analysis's arena, docs/results-schema.md), or null; written only when set.
  nlohmann::json arena;

  friend bool operator==(const Memory&, const Memory&) = default;
};

struct Range {
  std::size_t count = 0;
  double min = 0;
  double median = 0;
  double max = 0;

  friend bool operator==(const Range&, const Range&) = default;
};

// One NVML reading, timed from the start of the timed window.
struct TelemetrySample {
  double t_s = 0;
  std::optional<double> gpu_util_pct;
  std::optional<double> power_w;
  std::optional<double> sm_clock_mhz;
  std::optional<double> mem_used_mib;
  std::optional<double> temperature_c;

  friend bool operator==(const TelemetrySample&, const TelemetrySample&) = default;
};

// What one GPU did over the timed window.
struct Telemetry {
  int gpu = 0;
  std::size_t samples = 0;
  double window_s = 0;
  std::optional<Range> gpu_util_pct;
  std::optional<Range> mem_util_pct;
  std::optional<Range> power_w;
  std::optional<Range> sm_clock_mhz;
  std::optional<Range> mem_clock_mhz;
  std::optional<Range> temperature_c;
  std::optional<Range> mem_used_mib;
  std::optional<double> energy_j;
  std::string energy_source;                  // "counter", "power_integral" or "none"
  std::vector<std::string> throttle_reasons;  // every reason seen in the window
  std::vector<TelemetrySample> timeline;      // empty unless the run recorded it

  friend bool operator==(const Telemetry&, const Telemetry&) = default;
};

struct Compute {
  std::optional<double> flops_per_item;  // per image and step (forward + backward when training)
  std::optional<double> achieved_tflops;
  std::optional<double> ceiling_tflops;  // doctor's measured GEMM ceiling for the precision
  std::string ceiling_dtype;             // the GEMM dtype of that ceiling; "" without one
  std::optional<double> fraction_of_ceiling;

  friend bool operator==(const Compute&, const Compute&) = default;
};

struct Finding {
  Severity severity = Severity::info;
  std::string id;  // stable, e.g. "thermal_throttle"
  std::string message;
  std::string evidence;  // the numbers behind it
  std::string fix;       // empty when there is nothing to do

  friend bool operator==(const Finding&, const Finding&) = default;
};

// One call of a profiled step (bench --profile N), in the step's order: its name as the step's
// plan gives it ("layer1.0.conv1.forward"; names may repeat), its kind ("conv_forward",
// "batch_norm_relu_backward", ...) and its device time in ms, the median over the profiled steps.
struct CallTime {
  std::string name;
  std::string kind;
  double ms = 0;

  friend bool operator==(const CallTime&, const CallTime&) = default;
};

// A profile's calls summed by kind (bench --profile), the largest share first.
struct KindTime {
  std::string kind;
  double ms = 0;
  int calls = 0;
};
std::vector<KindTime> time_by_kind(const std::vector<CallTime>& profile);
// Its `count` slowest calls, the slowest first (ties in the step's order).
std::vector<const CallTime*> slowest_calls(const std::vector<CallTime>& profile, std::size_t count);

struct Configuration {
  Kind kind = Kind::native;
  Settings settings;
  RunStatus status = RunStatus::ok;
  std::string error;                         // why it did not finish; empty when ok
  std::optional<stats::Summary> statistics;  // none when no step was timed
  // With two runs or more (bench --repeat): the spread of their throughputs, a Student t interval
  // over the run means, beside the statistics' interval within the steps. Added within
  // dlprobe.results/1.
  std::optional<stats::RunSpread> run_spread;
  // What the runs of run_spread and samples.run_steps were; none with a single run. Added within
  // dlprobe.results/1 (absent in older files, whose runs are engines).
  std::optional<RunsIn> runs_in;
  Samples samples;
  std::optional<Memory> memory;
  std::vector<Telemetry> telemetry;  // one per GPU sampled
  std::optional<Compute> compute;
  std::vector<Finding> findings;
  // Every call of the step with its device time (bench --profile N); absent unless profiled.
  // Added within dlprobe.results/1.
  std::optional<std::vector<CallTime>> profile;

  friend bool operator==(const Configuration&, const Configuration&) = default;
};

struct Document {
  Context context;
  std::vector<Configuration> configurations;
  std::vector<Finding> findings;  // about the run as a whole

  friend bool operator==(const Document&, const Document&) = default;
};

// ---- JSON ----

// What a results file may be (docs/results-schema.md, "Limits"): nested no deeper than
// kMaxJsonDepth (core/json_text.h), and of at most kMaxFileBytes, far above any measurement's
// file (a long sweep with telemetry is a few megabytes), which stops an endless input
// (/dev/zero, a pipe that never closes) from being read until memory runs out.
inline constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 30;

nlohmann::json to_json(const Document& document);
// Validates everything; errors are one line with the JSON path ("configurations[2].status: ...").
Result<Document> from_json(const nlohmann::json& json);
// Parses text; `name` (a file name) prefixes every error. A number beyond a double's range and
// nesting deeper than kMaxJsonDepth are refused with the JSON path, as a wrong field is.
Result<Document> parse(std::string_view text, std::string_view name = "results");
// Refuses a file larger than kMaxFileBytes, and any input that goes on past it.
Result<Document> read_file(const std::filesystem::path& path);
// Pretty-printed with a final newline.
std::string serialize(const Document& document);

}  // namespace dlprobe::results
