// What the history says: a trend per configuration with a regression flag, the environment
// difference between two results (what changed), and what a result costs at a price per GPU-hour.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/history/history.h"
#include "dlprobe/results/results.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::history {

// ---- cost ----

// The images of one epoch of ImageNet-1k's training set.
inline constexpr double kImageNetEpochImages = 1'281'167;

struct Cost {
  double dollars_per_million_images = 0;
  double dollars_per_epoch = 0;  // one ImageNet epoch at the measured throughput
};
// At `throughput` images per second on one GPU billed `price_per_gpu_hour` dollars; none unless
// both are positive and finite.
std::optional<Cost> cost_at(std::optional<double> throughput, double price_per_gpu_hour);
// What a GPU-hour costs: --price-per-hour's price for every row, else the config file's price for
// the row's GPU model, else the file's default.
struct Prices {
  std::optional<double> flat;             // --price-per-hour
  std::map<std::string, double> per_gpu;  // GPU model as the results name it: "NVIDIA H200"
  std::optional<double> fallback;         // the file's "default"

  // The price for a row on `gpu`; none when neither the flag nor the file gives one.
  std::optional<double> of(const std::string& gpu) const;
  bool any() const { return flat || fallback || !per_gpu.empty(); }
};

// $XDG_CONFIG_HOME/dlprobe/config.json when XDG_CONFIG_HOME is an absolute path, else
// $HOME/.config/dlprobe/config.json; fails when neither variable says where.
Result<std::filesystem::path> default_config_path();

// The prices of a config file's "price_per_gpu_hour" object, e.g. {"price_per_gpu_hour":
// {"default": 2.5, "NVIDIA H200": 3.9}}: none from a missing file or one without the key. A file
// that is no JSON, or a price that is not a positive number, is an error naming the file and the
// JSON path ("config.json: price_per_gpu_hour.NVIDIA H200: ...").
Result<Prices> read_prices(const std::filesystem::path& config);

// Energy over the timed window / images it processed; none without measured energy.
std::optional<double> joules_per_image(const Entry& entry);

// ---- what changed ----

struct Change {
  std::string what;  // "driver", "cuDNN", "GPU 0 power limit (W)"
  std::string before;
  std::string after;  // "" where the value is unknown or absent
  friend bool operator==(const Change&, const Change&) = default;
};

// The environment difference of two runs: machine, container runtime, container image (its name
// and digest as one change), GPU models, driver, CUDA, every library's
// version (cuDNN, cuBLAS, frameworks), dlprobe's version and build, the OS, and each GPU's clocks
// and power limit when the run started. Empty when nothing recorded differs.
std::vector<Change> environment_diff(const results::Context& before, const results::Context& after);

// ---- trend ----

struct TrendOptions {
  double alpha = 0.05;  // significance level of the Mann–Whitney U test
  // A drop smaller than this is no regression, however significant (compare's --noise).
  double noise = 0.01;
  // The latest result is compared with up to this many comparable results before it.
  int window = 5;
  stats::BootstrapOptions bootstrap;
};

enum class Flag {
  regression,   // slower than every run of its window, and significantly so (see trend())
  improvement,  // faster than every run of its window, and significantly so
  no_change,
  too_few,  // fewer than two finished results with timed steps, nothing to compare
};
std::string_view flag_name(Flag flag);

// The results of one configuration on one machine and GPU model over time.
struct Series {
  std::string machine;
  std::string gpu;
  std::string configuration;
  std::vector<Entry> points;  // oldest first
  Flag flag = Flag::too_few;
  // The latest throughput / the window's (its images / its seconds, the runs pooled).
  std::optional<double> ratio;
  // The bootstrap CI of that ratio and the Mann–Whitney U p-value of the step times: computed only
  // where the throughputs alone could make a flag (see trend()).
  std::optional<stats::Interval> ratio_ci;
  std::optional<double> p_value;
  int window = 0;  // comparable results the latest was compared with
  // The environment difference between the result before the latest and the latest.
  std::vector<Change> changes;
};

// The series of the rows that pass `filter`, in the order of their first result. The latest
// finished result of a series is compared with the finished ones before it (up to
// options.window) as `dlprobe compare` compares two files: the ratio of throughputs with its
// bootstrap CI and the Mann–Whitney U test of the step times, the window's steps pooled. It is a
// regression when the CI lies below 1, p is below alpha, the drop exceeds the noise threshold, and
// its throughput is below that of every result in the window: the pooled test sees only the noise
// within runs, and two runs of the same configuration differ by more than that (clocks,
// temperature, neighbours), so the spread between runs must be exceeded too. That last condition
// and the noise threshold need only the throughputs the rows hold: the step times are read and the
// tests run only for a series that meets them, so that the trend of a steady history of thousands
// of results takes a fraction of a second.
Result<std::vector<Series>> trend(const History& history, const Filter& filter,
                                  const TrendOptions& options = {});

// True when a series of `series` is flagged a regression.
bool any_regression(const std::vector<Series>& series);

}  // namespace dlprobe::history
