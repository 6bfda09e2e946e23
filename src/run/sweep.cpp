#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "dlprobe/core/units.h"
#include "dlprobe/run/runner.h"

namespace dlprobe::run {

Result<SweepAxis> parse_sweep(std::string_view text) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return invalid_argument(
        fmt::format("--sweep: '{}' is not KEY=V1,V2,... (e.g. batch=16,32)", text));
  }
  SweepAxis axis;
  axis.key = std::string(text.substr(0, eq));
  for (char c : axis.key) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
      return invalid_argument(
          fmt::format("--sweep: key '{}' may hold only letters, digits and '_'", axis.key));
    }
  }
  DLPROBE_ASSIGN_OR_RETURN(axis.values, parse_list(text.substr(eq + 1), "--sweep " + axis.key));
  return axis;
}

std::vector<std::map<std::string, std::string>> sweep_points(const std::vector<SweepAxis>& axes) {
  std::vector<std::map<std::string, std::string>> points{{}};
  for (const auto& axis : axes) {
    std::vector<std::map<std::string, std::string>> next;
    for (const auto& point : points) {
      for (const auto& value : axis.values) {
        auto p = point;
        p[axis.key] = value;
        next.push_back(std::move(p));
      }
    }
    points = std::move(next);
  }
  return points;
}

std::vector<std::string> substitute(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& params) {
  std::vector<std::string> out;
  out.reserve(argv.size());
  for (std::string arg : argv) {
    for (const auto& [key, value] : params) {
      const std::string token = "{" + key + "}";
      for (auto at = arg.find(token); at != std::string::npos;
           at = arg.find(token, at + value.size())) {
        arg.replace(at, token.size(), value);
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

bool mentions(const std::vector<std::string>& argv, std::string_view key) {
  const std::string token = fmt::format("{{{}}}", key);
  return std::any_of(argv.begin(), argv.end(),
                     [&](const std::string& a) { return a.find(token) != std::string::npos; });
}

std::string point_label(const std::map<std::string, std::string>& point) {
  std::string out;
  for (const auto& [key, value] : point)
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, value);
  return out;
}

}  // namespace dlprobe::run
