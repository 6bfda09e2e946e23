// One function per subcommand, `add_<name>_command(app)`: it registers the subcommand and its flags
// on `app` and returns a Command whose run() does the job once parsing has succeeded. main.cpp
// lists them and runs the one the user named.
#pragma once

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/files.h"
#include "dlprobe/core/status.h"
#include "dlprobe/core/units.h"
#include "dlprobe/data/gpu_decoder.h"

namespace dlprobe::cli {

// Exit codes: 0 success, 1 the job ran and found a failure (e.g. a regression), 2 bad input or
// an error that stopped the job.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitError = 2;

struct Command {
  CLI::App* app = nullptr;   // the subcommand, to see whether it was named
  std::function<int()> run;  // returns the process exit code
};

Command add_doctor_command(CLI::App& app);
Command add_monitor_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_memory_command(CLI::App& app);
Command add_step_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_report_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_evaluate_command(CLI::App& app);
Command add_pipeline_command(CLI::App& app);
Command add_history_command(CLI::App& app);

// An option that takes one value as text (parsed after CLI11 is done, so that errors name the flag
// and say what it takes): {"-i,--interval", &Flags::interval, "help"}.
template <class Flags>
struct TextOption {
  const char* names;
  std::string Flags::*field;
  const char* help;
};
// Registers `options` on `sub` in the order given, each writing to its field of `flags`.
// Each shows its field's value as its default, where it has one.
template <class Flags>
void add_text_options(CLI::App& sub, Flags& flags,
                      std::initializer_list<TextOption<Flags>> options) {
  for (const TextOption<Flags>& o : options) {
    sub.add_option(o.names, flags.*o.field, o.help)->capture_default_str();
  }
}

// Gives every option of `app` and its subcommands that takes its value as text the type its help
// shows: "--steps INT=30", not "TEXT=30". The values stay text for the commands to parse (so that
// errors name the flag); this pass only names what they take, from the default shown or, where
// there is none, from the list in commands.cpp.
void name_value_types(CLI::App& app);

// Refuses a value given empty (`--json ''`, `--fail-above "$UNSET"`) to any option or positional
// argument of `app` and of the subcommands that were parsed: an empty value would otherwise read
// as the option left out, and fall back to its default without a word.
Status refuse_empty_values(const CLI::App& app);

// --interval (monitor, run): a duration of at least monitor::kMinInterval, or a one-line error.
Result<std::chrono::nanoseconds> parse_sampling_interval(const std::string& text);

// --alpha and --noise (compare, history trend): a significance level more than 0 and less than 1,
// and a noise threshold from 0 up to (not with) 1, or a one-line error naming the flag.
Result<double> parse_alpha(const std::string& text);
Result<double> parse_noise(const std::string& text);

// A comma list, each item parsed by `parse`, no value twice: compared as values, so "2,02" names
// batch 2 twice.
template <std::equality_comparable T, class Parse>
Result<std::vector<T>> parse_each(const std::string& text, std::string_view flag, Parse parse) {
  DLPROBE_ASSIGN_OR_RETURN(std::vector<std::string> items, parse_list(text, flag));
  std::vector<T> out;
  for (const std::string& item : items) {
    DLPROBE_ASSIGN_OR_RETURN(T value, parse(item));
    const auto same = std::find(out.begin(), out.end(), value);
    if (same != out.end()) {
      const std::string& first = items[static_cast<std::size_t>(same - out.begin())];
      return invalid_argument(
          first == item ? fmt::format("{}: '{}' is given twice", flag, item)
                        : fmt::format("{}: '{}' and '{}' are the same", flag, first, item));
    }
    out.push_back(std::move(value));
  }
  return out;
}

// --gpu of monitor and run: NVML indices, e.g. "0,2", none twice.
Result<std::vector<unsigned>> parse_gpu_indices(const std::string& text);

// Prints "dlprobe: error: <message>" on one line to stderr and returns kExitError.
int report_error(const Status& status);

// --overwrite: an output may replace a file that holds something (an earlier run's results).
void add_overwrite_flag(CLI::App& sub, bool& overwrite);
// The outputs a command names, before any work: each writable, none replacing a file that holds
// something unless `overwrite`, no two the same file (core's check_outputs); and standard output
// set aside when one of them is "-" (reserve_stdout), so that the rest of what the command prints
// goes to stderr.
// `inputs`: the files the command reads, which no output may name.
Status prepare_outputs(std::initializer_list<NamedOutput> outputs, bool overwrite,
                       const std::vector<NamedOutput>& inputs = {});

// For an option bound to an integer: CLI11 reads its text with strtoll's base 0, so "010" would be
// eight and "0x10" sixteen. This reads it as parse_int reads every other count, in base 10 and in
// [min, max], and hands CLI11 the number written plainly.
CLI::Validator decimal_integer(std::int64_t min, std::int64_t max);

// Adds a flag whose default --help shows.
template <class T>
void option(CLI::App& app, const char* name, T& value, const char* help) {
  app.add_option(name, value, help)->capture_default_str();
}

// What a library parser made of a flag's text, its error prefixed with the flag ("--precision:
// unknown precision 'fp8' (...)"): the library speaks of values, the command line of flags.
template <class T>
Result<T> for_flag(std::string_view flag, Result<T> parsed) {
  if (!parsed.has_value()) return parsed.status().with_context(flag);
  return parsed;
}

// What nvJPEG hands the GPU augmentation (data::GpuPixels): `text` is rgb or ycbcr, for `flag`;
// anything but rgb is an error unless the images are decoded on the GPU (`on_gpu`; `how` says
// which flags do that).
Result<data::GpuPixels> parse_gpu_pixels(const std::string& text, std::string_view flag,
                                         bool on_gpu, std::string_view how);
inline constexpr const char* kGpuPixelsHelp =
    "What nvJPEG hands the GPU augmentation: rgb (nvJPEG converts each image; the faster) or "
    "ycbcr (the file's own planes, converted at the pixels the crop samples with libjpeg-turbo's "
    "arithmetic: samples identical to the host pipeline's)";

}  // namespace dlprobe::cli
