#include "commands.h"

#include <algorithm>
#include <cstdio>
#include <span>

namespace dlprobe::cli {

int report_error(const Status& status) {
  std::fprintf(stderr, "dlprobe: error: %s\n", status.message().c_str());
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
