#include "dlprobe/core/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>

namespace dlprobe {

std::string one_line(std::string_view text) {
  std::string line;
  line.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\t') {
      line += "\\t";
    } else if (c == '\r') {
      line += "\\r";
    } else if (byte < 0x20 || byte == 0x7f) {
      line += fmt::format("\\x{:02x}", byte);
    } else {
      line += c;
    }
  }
  return line;
}
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    char y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Splits "1.5GiB" into a non-negative number and its suffix; false when no number leads.
bool split_number(std::string_view text, double& number, std::string_view& suffix) {
  std::size_t end = 0;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.')) ++end;
  if (end == 0) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + end, number);
  if (ec != std::errc() || ptr != text.data() + end) return false;
  suffix = trim(text.substr(end));
  return true;
}

struct UnitScale {
  std::string_view name;
  double scale;
};

}  // namespace

Result<std::uint64_t> parse_size(std::string_view text, std::string_view flag) {
  static constexpr double kKi = 1024.0;
  static constexpr std::array<UnitScale, 17> kUnits{{
      {"", 1.0},
      {"b", 1.0},
      {"k", kKi},
      {"kib", kKi},
      {"kb", 1e3},
      {"m", kKi * kKi},
      {"mib", kKi * kKi},
      {"mb", 1e6},
      {"g", kKi * kKi * kKi},
      {"gib", kKi * kKi * kKi},
      {"gb", 1e9},
      {"t", kKi * kKi * kKi * kKi},
      {"tib", kKi * kKi * kKi * kKi},
      {"tb", 1e12},
      {"kilobytes", 1e3},
      {"megabytes", 1e6},
      {"gigabytes", 1e9},
  }};
  const std::string_view t = trim(text);
  auto bad = [&] {
    return invalid_argument(fmt::format(
        "{}: '{}' is not a size (accepts e.g. 2GiB, 512MiB, 512MB, 1.5G, 4096)", flag, text));
  };
  double number = 0;
  std::string_view suffix;
  if (!split_number(t, number, suffix)) return bad();
  for (const auto& unit : kUnits) {
    if (!iequals(suffix, unit.name)) continue;
    const double bytes = number * unit.scale;
    if (!std::isfinite(bytes) || bytes >= 1.8e19) {
      return invalid_argument(fmt::format("{}: '{}' is too large", flag, text));
    }
    // Below 1.8e19 the rounded value fits a uint64 (2^64 is 1.845e19); llround's long long would
    // not hold the top half of that range.
    return static_cast<std::uint64_t>(std::round(bytes));
  }
  return bad();
}

std::string format_grouped(double value, int decimals) {
  const std::string digits = fmt::format("{:.{}f}", value, decimals);
  const std::size_t sign = digits[0] == '-' ? 1 : 0;
  const std::size_t dot = std::min(digits.find('.'), digits.size());
  std::string out = digits.substr(0, sign);
  for (std::size_t i = sign; i < dot; ++i) {
    if (i > sign && (dot - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out + digits.substr(dot);
}

std::optional<int> parse_cuda_index(std::string_view text) {
  if (text == "cuda") return 0;
  if (!text.starts_with("cuda:")) return std::nullopt;
  const std::string_view digits = text.substr(5);
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || index < 0) {
    return std::nullopt;
  }
  return index;
}

std::string format_size(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames{"B", "KiB", "MiB", "GiB", "TiB"};
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  const int decimals = value >= 100 ? 0 : (value >= 10 ? 1 : 2);
  return fmt::format("{:.{}f} {}", value, decimals, kNames[unit]);
}

Result<std::chrono::nanoseconds> parse_duration(std::string_view text, std::string_view flag) {
  static constexpr std::array<UnitScale, 7> kUnits{{
      {"ns", 1.0},
      {"us", 1e3},
      {"ms", 1e6},
      {"s", 1e9},
      {"m", 60e9},
      {"min", 60e9},
      {"h", 3600e9},
  }};
  const std::string_view t = trim(text);
  double number = 0;
  std::string_view suffix;
  if (!split_number(t, number, suffix)) {
    return invalid_argument(
        fmt::format("{}: '{}' is not a duration (accepts e.g. 10ms, 2s, 1.5m, 1h)", flag, text));
  }
  if (suffix.empty()) {
    return invalid_argument(
        fmt::format("{}: '{}' needs a unit (accepts e.g. 10ms, 2s, 1.5m, 1h)", flag, text));
  }
  for (const auto& unit : kUnits) {
    if (!iequals(suffix, unit.name)) continue;
    const double ns = number * unit.scale;
    if (!std::isfinite(ns) || ns > 9.2e18) {
      return invalid_argument(fmt::format("{}: '{}' is too long", flag, text));
    }
    return std::chrono::nanoseconds(std::llround(ns));
  }
  return invalid_argument(
      fmt::format("{}: '{}' has an unknown unit (accepts ns, us, ms, s, m, h)", flag, text));
}

std::string format_duration(std::chrono::nanoseconds d) {
  const auto ns = static_cast<double>(d.count());
  if (ns < 1e3) return fmt::format("{}ns", d.count());
  if (ns < 60e9) {
    static constexpr std::array<UnitScale, 3> kUnits{{{"us", 1e3}, {"ms", 1e6}, {"s", 1e9}}};
    std::size_t u = 0;
    while (u + 1 < kUnits.size() && ns >= kUnits[u + 1].scale) ++u;
    // Three digits may round up to 1000 of the unit (999.95 us): that is 1 of the next one, not
    // "1e+03us".
    if (u + 1 < kUnits.size() && std::stod(fmt::format("{:.3g}", ns / kUnits[u].scale)) >= 1000) {
      ++u;
    }
    return fmt::format("{:.3g}{}", ns / kUnits[u].scale, kUnits[u].name);
  }
  const auto total_s = static_cast<long long>(ns / 1e9);
  if (total_s < 3600) return fmt::format("{}m{:02d}s", total_s / 60, total_s % 60);
  return fmt::format("{}h{:02d}m", total_s / 3600, (total_s % 3600) / 60);
}

Result<std::vector<std::string>> parse_list(std::string_view text, std::string_view flag) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item = trim(
        text.substr(start, comma == std::string_view::npos ? text.size() - start : comma - start));
    if (item.empty()) {
      return invalid_argument(fmt::format(
          "{}: '{}' has an empty item (accepts a comma list, e.g. 16,32,64)", flag, text));
    }
    items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

Result<std::int64_t> parse_int(std::string_view text, std::string_view flag, std::int64_t min,
                               std::int64_t max) {
  const auto refuse = [&](const std::string& why) {
    return invalid_argument(flag.empty() ? why : fmt::format("{}: {}", flag, why));
  };
  const std::string_view t = trim(text);
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
  const bool whole = !t.empty() && ptr == t.data() + t.size();
  if (whole && ec == std::errc::result_out_of_range) {
    return refuse(fmt::format("{} is out of range (accepts {} to {})", t, min, max));
  }
  if (!whole || ec != std::errc()) return refuse(fmt::format("'{}' is not a whole number", text));
  if (value < min || value > max) {
    return refuse(fmt::format("{} is out of range (accepts {} to {})", value, min, max));
  }
  return value;
}

Result<double> parse_fraction(std::string_view text, std::string_view flag) {
  const std::string_view t = trim(text);
  double number = 0;
  std::string_view suffix;
  auto bad = [&] {
    return invalid_argument(
        fmt::format("{}: '{}' is not a fraction (accepts 0 to 1, e.g. 0.9, or 90%)", flag, text));
  };
  if (!split_number(t, number, suffix)) return bad();
  if (suffix == "%") {
    number /= 100.0;
  } else if (!suffix.empty()) {
    return bad();
  }
  if (number < 0.0 || number > 1.0) return bad();
  return number;
}

}  // namespace dlprobe
