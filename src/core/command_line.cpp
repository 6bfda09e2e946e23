#include "dlprobe/core/command_line.h"

#include "dlprobe/core/files.h"
#include "dlprobe/core/log.h"

namespace dlprobe {

std::vector<std::string> split_command_line(std::string_view text) {
  std::vector<std::string> args;
  while (!text.empty()) {
    const auto end = text.find('\0');
    args.emplace_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return args;
}

Result<std::vector<std::string>> read_command_line(const std::filesystem::path& path) {
  DLPROBE_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  return split_command_line(text);
}

const std::vector<std::string>& own_command_line() {
  // A function-local static: read once, and safely when two threads ask first at the same time.
  static const std::vector<std::string> args = [] {
    auto read = read_command_line("/proc/self/cmdline");
    if (!read) {
      log_warn("results will not record the command line: {}", read.status().message());
      return std::vector<std::string>{};
    }
    return std::move(read).value();
  }();
  return args;
}

}  // namespace dlprobe
