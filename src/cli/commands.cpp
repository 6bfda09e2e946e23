#include "commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <span>

namespace dlprobe::cli {

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

int report_error(const Status& status) {
  std::fprintf(stderr, "dlprobe: error: %s\n", one_line(status.message()).c_str());
  return kExitError;
}

void add_overwrite_flag(CLI::App& sub, bool& overwrite) {
  sub.add_flag(std::string(kOverwriteFlag), overwrite,
               "Let the outputs replace files that hold something (by default an output that "
               "would replace an earlier file is refused before any work)");
}

Status prepare_outputs(std::initializer_list<NamedOutput> outputs, bool overwrite) {
  DLPROBE_RETURN_IF_ERROR(check_outputs(std::span(outputs.begin(), outputs.size()), overwrite));
  const bool to_stdout = std::any_of(outputs.begin(), outputs.end(),
                                     [](const NamedOutput& o) { return is_stdout_path(o.path); });
  return to_stdout ? reserve_stdout() : Status::ok();
}

}  // namespace dlprobe::cli
