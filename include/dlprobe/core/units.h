// Parsing and printing of the units users type and read: sizes (2GiB, 512MB, 1.5G), durations
// (100ms, 2s, 1m), and comma lists (16,32,64); and text from files made safe to print. Parse
// errors are one line that names the flag and what it accepts.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe {

// `text` with its control characters escaped (\n, \t, \r, \xNN): an error quotes the values it
// refuses, and one that holds a line break must not break the error's one line; text read from a
// file (a results file edited by hand) must not send escape sequences to the terminal.
std::string one_line(std::string_view text);

// Sizes: "2GiB", "512MiB" are binary; "512MB", "2GB" are decimal; a bare suffix "1.5G", "64k" is
// binary, as docker and the frameworks read it; a bare number is bytes.
Result<std::uint64_t> parse_size(std::string_view text, std::string_view flag = "size");
// "1.50 GiB", "512 B": binary units, three significant digits.
std::string format_size(std::uint64_t bytes);
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;
// `bytes` rounded up to a multiple of `multiple` (> 0): block, segment and alignment sizes.
constexpr std::uint64_t round_up(std::uint64_t bytes, std::uint64_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

// Durations: ns, us, ms, s, m, h, with decimals ("1.5s"). A bare number is refused: "-i 100" could
// mean milliseconds or seconds, and guessing wrong skews every sample.
Result<std::chrono::nanoseconds> parse_duration(std::string_view text,
                                                std::string_view flag = "duration");
// "250ms", "1.50s", "2m05s".
std::string format_duration(std::chrono::nanoseconds d);

// 12345.6 -> "12,345.6" with `decimals` digits after the point: throughputs are read at a
// glance, and thousands separators help.
std::string format_grouped(double value, int decimals);

// "cuda" -> 0, "cuda:N" -> N; nullopt for anything else (the device flags' CUDA part).
std::optional<int> parse_cuda_index(std::string_view text);

// "16,32,64" -> {"16","32","64"}; items are trimmed; an empty item is an error.
Result<std::vector<std::string>> parse_list(std::string_view text, std::string_view flag = "list");

// A whole integer in [min, max], in base 10; "1e3", "0x10" and "12abc" are refused. The error
// names `flag` first, unless it is empty.
Result<std::int64_t> parse_int(std::string_view text, std::string_view flag, std::int64_t min,
                               std::int64_t max);
// A fraction in [0, 1] given as "0.9" or "90%".
Result<double> parse_fraction(std::string_view text, std::string_view flag);

}  // namespace dlprobe
