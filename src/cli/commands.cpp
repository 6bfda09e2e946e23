#include "commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <regex>
#include <span>
#include <string>
#include <utility>

#include "dlprobe/core/units.h"
#include "dlprobe/monitor/sampler.h"

namespace dlprobe::cli {

namespace {

// The value types of options that show no default ("command --flag", or "--flag" in every
// command); the others are named from their default.
constexpr std::pair<std::string_view, std::string_view> kValueTypes[] = {
    {"bench --batch", "INT[,INT...]|auto"},
    {"memory --batch", "INT[,INT...]"},
    {"--profile", "INT"},
    {"--repeat-process", "INT"},
    {"--batch", "INT"},
    {"--steps", "INT"},
    {"--count", "INT"},
    {"--calibration-batch", "INT"},
    {"--max-batch-start", "INT"},
    {"--max-batch-limit", "INT"},
    {"--max-batch-step", "INT"},
    {"--max-batch-runs", "INT"},
    {"--loss-scale", "NUMBER"},
    {"--fail-above", "FRACTION"},
    {"--timeout", "DURATION"},
    {"--hang-after", "DURATION"},
    {"--duration", "DURATION"},
    {"--device-memory", "SIZE"},
    {"--limit", "SIZE"},
    {"--memory-limit", "SIZE"},
    {"--copies", "INT"},
    // history's filters take a GPU's name (h200); run's --gpu, devices by index.
    {"list --gpu", "NAME"},
    {"trend --gpu", "NAME"},
    {"--gpu", "INT[,INT...]"},
    {"--threads", "INT[,INT...]"},
};

// INT, NUMBER, FRACTION (12%), DURATION (2s, 100ms) or SIZE (8GiB) from a default's text; empty
// for words.
std::string_view type_of_default(std::string_view text) {
  static const std::regex integer("-?[0-9]+");
  static const std::regex number("-?[0-9]*\\.?[0-9]+(e-?[0-9]+)?");
  static const std::regex percent("[0-9]*\\.?[0-9]+%");
  static const std::regex duration("[0-9]*\\.?[0-9]+(ns|us|ms|s|m|h)");
  static const std::regex size("[0-9]*\\.?[0-9]+([KMGT]i?B|B)");
  const std::string value(text);
  if (std::regex_match(value, integer)) return "INT";
  if (std::regex_match(value, number)) return "NUMBER";
  if (std::regex_match(value, percent)) return "FRACTION";
  if (std::regex_match(value, duration)) return "DURATION";
  if (std::regex_match(value, size)) return "SIZE";
  return {};
}

void name_types_in(CLI::App& app, const std::string& command) {
  for (CLI::Option* o : app.get_options()) {
    if (o->get_type_name() != "TEXT" || o->get_lnames().empty()) continue;
    const std::string flag = "--" + o->get_lnames().front();
    std::string_view type = type_of_default(o->get_default_str());
    for (const auto& [name, named] : kValueTypes) {
      if (name == command + " " + flag || name == flag) {
        type = named;
        break;
      }
    }
    if (!type.empty()) o->type_name(std::string(type));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    name_types_in(*sub, sub->get_name());
  }
}

}  // namespace

void name_value_types(CLI::App& app) {
  name_types_in(app, "");
}

Status refuse_empty_values(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    // Flags take no value (their result reads "true"); what an option was given is in results().
    if (o->get_expected_min() == 0 || o->count() == 0) continue;
    for (const std::string& value : o->results()) {
      if (value.empty()) {
        return invalid_argument(
            fmt::format("{}: an empty value (give one, or leave the option out)", o->get_name()));
      }
    }
  }
  for (const CLI::App* sub : app.get_subcommands()) {
    DLPROBE_RETURN_IF_ERROR(refuse_empty_values(*sub));
  }
  return Status::ok();
}

Result<std::chrono::nanoseconds> parse_sampling_interval(const std::string& text) {
  DLPROBE_ASSIGN_OR_RETURN(const std::chrono::nanoseconds interval,
                           parse_duration(text, "--interval"));
  if (interval < monitor::kMinInterval) {
    return invalid_argument(fmt::format(
        "--interval: '{}' is below the minimum of {}ms", text,
        std::chrono::duration_cast<std::chrono::milliseconds>(monitor::kMinInterval).count()));
  }
  return interval;
}

int report_error(const Status& status) {
  std::fprintf(stderr, "dlprobe: error: %s\n", one_line(status.message()).c_str());
  return kExitError;
}

Result<std::vector<unsigned>> parse_gpu_indices(const std::string& text) {
  return parse_each<unsigned>(text, "--gpu", [](const std::string& item) -> Result<unsigned> {
    DLPROBE_ASSIGN_OR_RETURN(const std::int64_t gpu, parse_int(item, "--gpu", 0, 1023));
    return static_cast<unsigned>(gpu);
  });
}

Result<double> parse_alpha(const std::string& text) {
  DLPROBE_ASSIGN_OR_RETURN(const double alpha, parse_fraction(text, "--alpha"));
  if (alpha <= 0 || alpha >= 1) {
    return invalid_argument(fmt::format(
        "--alpha: {} is no significance level (accepts more than 0, less than 1, e.g. 0.05)",
        text));
  }
  return alpha;
}

Result<double> parse_noise(const std::string& text) {
  DLPROBE_ASSIGN_OR_RETURN(const double noise, parse_fraction(text, "--noise"));
  if (noise >= 1) {
    return invalid_argument(
        fmt::format("--noise: {} is all of the throughput (accepts 0 up to, not with, 1)", text));
  }
  return noise;
}

CLI::Validator decimal_integer(std::int64_t min, std::int64_t max) {
  return {[min, max](std::string& text) {
            const Result<std::int64_t> value = parse_int(text, "", min, max);
            if (!value) return value.status().message();
            text = std::to_string(*value);
            return std::string();
          },
          "", "decimal"};
}

void add_overwrite_flag(CLI::App& sub, bool& overwrite) {
  sub.add_flag(std::string(kOverwriteFlag), overwrite,
               "Let the outputs replace files that hold something (by default an output that "
               "would replace an earlier file is refused before any work)");
}

Status prepare_outputs(std::initializer_list<NamedOutput> outputs, bool overwrite,
                       const std::vector<NamedOutput>& inputs) {
  DLPROBE_RETURN_IF_ERROR(
      check_outputs(std::span(outputs.begin(), outputs.size()), overwrite, inputs));
  const bool to_stdout = std::any_of(outputs.begin(), outputs.end(),
                                     [](const NamedOutput& o) { return is_stdout_path(o.path); });
  return to_stdout ? reserve_stdout() : Status::ok();
}

Result<data::GpuPixels> parse_gpu_pixels(const std::string& text, std::string_view flag,
                                         bool on_gpu, std::string_view how) {
  if (text != "rgb" && text != "ycbcr") {
    return invalid_argument(fmt::format("{}: unknown choice '{}' (rgb or ycbcr)", flag, text));
  }
  if (text == "ycbcr" && !on_gpu) {
    return invalid_argument(
        fmt::format("{} ycbcr: only when the images are decoded on the GPU ({})", flag, how));
  }
  return text == "ycbcr" ? data::GpuPixels::ycbcr : data::GpuPixels::rgb;
}

}  // namespace dlprobe::cli
