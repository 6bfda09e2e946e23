// What `dlprobe bench`, `dlprobe evaluate` and `dlprobe step` share on the command line: the
// tuning and device flags, Ctrl-C handling, and the live progress line on stderr.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/bench/sweep.h"
#include "dlprobe/core/units.h"
#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/device.h"
#include "dlprobe/engine/conv_tuning.h"
#include "dlprobe/models/resnet.h"
#include "dlprobe/results/results.h"

namespace CLI {
class App;
}

namespace dlprobe::cli {

// --conv-algo and --tuning-cache, as bench, evaluate, memory and step take them.
struct TuningFlags {
  std::string algo = "autotune";
  std::string cache;  // a file; empty: choices kept for this process only
};
void add_tuning_flags(CLI::App& sub, TuningFlags& flags);
struct Tuning {
  ConvEngineChoice algo = ConvEngineChoice::autotune;
  std::shared_ptr<ConvTuningCache> cache;  // always set: in memory, or over the file
};
// A bad choice or a file that is not a tuning cache: a one-line error naming the flag.
Result<Tuning> tuning_options(const TuningFlags& flags);

// A duration flag ("2s", "500ms") in seconds, not negative.
Result<double> parse_seconds(const std::string& text, std::string_view flag);

// --model, --precision, --mode, --layout and --optimizer: the step that runs, as bench, memory and
// step take it. Each command registers them with its own help (bench sweeps comma lists) and
// parses them as it takes them.
struct WorkloadFlags {
  std::string model = "resnet50";
  std::string precision = "fp32";
  std::string mode = "train";
  std::string layout = "auto";
  std::string optimizer = "sgd";
  bool optimizer_given = false;  // --optimizer on the command line
};

// --optimizer, refused when given to a run that does not train: it would be taken and ignored.
Result<engine::OptimizerKind> workload_optimizer(const WorkloadFlags& flags, bool trains);

// --model, its help the models there are and then `more` ("a comma list sweeps").
void add_model_flag(CLI::App& sub, std::string& model, std::string_view more = "");

// --recompute, as bench and memory take it: none, or block-outputs
// (StepConfig::recompute_block_outputs).
void add_recompute_flag(CLI::App& sub, std::string& recompute);
Status parse_recompute(const std::string& text, engine::StepConfig& step);

// --data, --data-threads and --data-decode: train from a JPEG dataset beside the synthetic batch.
struct DataFlags {
  std::string dir;
  std::string threads = "0";
  std::string decode = "auto";
  std::string gpu_pixels = "rgb";
};
void add_data_flags(CLI::App& sub, DataFlags& flags);

// Before the command's first CUDA call: where --data may decode on the GPU, the hardware work
// queues that keep the decoders from waiting for the training step (dlprobe/data/cuda_queues.h).
void prepare_data_decode(const DataFlags& flags);

// Nothing without --data; else the dataset listed (a missing or empty folder is a one-line error)
// and where it decodes on `device`.
Result<std::optional<bench::JpegInput>> data_input(const DataFlags& flags,
                                                   const device::Device& device);

// --device and --backend, as bench, memory and step take them. `reference_note` says what the
// reference loops are to the command ("a correctness tool, not a benchmark").
struct DeviceFlags {
  std::string device = "auto";
  std::string backend = "auto";
};
void add_device_flags(CLI::App& sub, DeviceFlags& flags, std::string_view reference_note);
// The device, and the backend that runs there ("auto": oneDNN on the CPU where built, the
// reference loops only when named). --device auto is the first usable GPU, else the CPU (the
// device a named backend runs on, if one is named); a GPU named that is not usable is refused with
// the reason and what to run instead. Each refusal names its flag.
struct DeviceChoice {
  device::Device device;
  device::BackendKind backend = device::BackendKind::reference;
  // With --device auto, the line that says what was picked and why ("device cpu, onednn backend;
  // no usable GPU: ..."); empty when the device was named.
  std::string picked;
};
Result<DeviceChoice> device_choice(const DeviceFlags& flags);
// device_choice, and "dlprobe <command>: <picked>" on stderr when the device was picked.
Result<DeviceChoice> noted_device_choice(const DeviceFlags& flags, std::string_view command);

// The options among `names` given on the command line, in that order.
std::vector<std::string> given_options(const CLI::App& sub,
                                       std::initializer_list<std::string_view> names);
// Options that only the CUDA backend reads, given for a run on another backend: a line on stderr
// for each, so that the run is not read as one that took them. A warning, not a refusal: a script
// may pass the same flags to every device it runs on.
void warn_cuda_only(std::string_view command, device::BackendKind backend,
                    const std::vector<std::string>& given);

// --image-size, --classes and --width: the model's shape, as bench and memory take them.
struct ShapeFlags {
  std::string image_size = "224";
  std::string classes = "1000";
  std::string width = "64";
};
void add_shape_flags(CLI::App& sub, ShapeFlags& flags);
// Sets the shape's fields of `model`; a value out of range is refused, naming its flag.
Status parse_shape(const ShapeFlags& flags, model::ModelConfig& model);

// The live line: configuration i of n, what it is doing, the running estimate and the ETA, redrawn
// in place on a terminal; one line per finished configuration everywhere.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet);
  void update(const bench::SweepProgress& p);
  void finished(std::size_t index, std::size_t planned, const results::Configuration& c);
  void note(const std::string& text);  // a line of its own ("measuring GEMM ceilings...")
  // A sweep's callbacks that draw on this line: the live progress, and a line for each finished
  // configuration.
  bench::SweepCallbacks sweep_callbacks();

 private:
  void clear();
  bool quiet_ = false;
  bool tty_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// The exit code of a sweep whose text is printed: its error, if it stopped on one; 1 when it was
// interrupted (after `interrupted_note` on the progress line) or a configuration did not complete;
// with `single` (one configuration, detailed), that configuration's error as the command's.
int sweep_exit_code(const Status& status, const bench::SweepOutcome& outcome, ProgressLine& line,
                    std::string_view interrupted_note, bool single);

}  // namespace dlprobe::cli
