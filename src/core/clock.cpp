#include "dlprobe/core/clock.h"

#include <cctype>

namespace dlprobe {
namespace {

// The number the digits of text[at, at + n) spell, or -1 where one is not a digit.
int digits(std::string_view text, std::size_t at, std::size_t n) {
  if (text.size() < at + n) return -1;
  int value = 0;
  for (std::size_t i = at; i < at + n; ++i) {
    if (std::isdigit(static_cast<unsigned char>(text[i])) == 0) return -1;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

}  // namespace

std::optional<std::chrono::sys_time<std::chrono::milliseconds>> parse_utc_time(
    std::string_view text) {
  using namespace std::chrono;
  const int year = digits(text, 0, 4);
  const int month = digits(text, 5, 2);
  const int day = digits(text, 8, 2);
  if (year < 0 || month < 0 || day < 0 || text[4] != '-' || text[7] != '-') return std::nullopt;
  const year_month_day ymd{std::chrono::year(year),
                           std::chrono::month(static_cast<unsigned>(month)),
                           std::chrono::day(static_cast<unsigned>(day))};
  if (!ymd.ok()) return std::nullopt;
  milliseconds in_day{0};
  std::size_t at = 10;
  const int limits[] = {23, 59, 60};
  const milliseconds units[] = {hours(1), minutes(1), seconds(1)};
  int part = 0;
  for (; part < 3 && at < text.size() && text[at] != 'Z'; ++part) {
    if (text[at] != (part == 0 ? 'T' : ':')) return std::nullopt;
    const int value = digits(text, at + 1, 2);
    if (value < 0 || value > limits[part]) return std::nullopt;
    in_day += value * units[part];
    at += 3;
  }
  // Fractions of a second, after the seconds only.
  if (part == 3 && at < text.size() && text[at] == '.') {
    std::size_t end = at + 1;
    double scale = 100;
    double fraction = 0;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])) != 0) {
      fraction += (text[end] - '0') * scale;
      scale /= 10;
      ++end;
    }
    if (end == at + 1) return std::nullopt;
    in_day += milliseconds(static_cast<std::int64_t>(fraction));
    at = end;
  }
  // "Z" names the zone of a time, not of a bare date.
  const bool ends = at == text.size() || (part > 0 && text[at] == 'Z' && at + 1 == text.size());
  if (!ends) return std::nullopt;
  return sys_days{ymd} + in_day;
}

}  // namespace dlprobe
