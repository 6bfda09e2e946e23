// The command line of this process as typed, for the context of a results file: main() hands argv
// to the flag parser only, and Linux keeps a copy in /proc/self/cmdline.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe {

// This process's arguments, argv[0] first: /proc/self/cmdline, read at the first call and kept.
// Where that file cannot be read (no /proc in a sandbox, another OS) the list is empty and one
// warning says that results will not record the command line.
const std::vector<std::string>& own_command_line();

// The arguments in a cmdline file: Errc::not_found or Errc::io_error when it cannot be read.
Result<std::vector<std::string>> read_command_line(const std::filesystem::path& path);

// The arguments in a cmdline file's text: each one ends with a NUL, so an empty argument is an
// empty string; a last one without its NUL (a process that rewrote its argv) counts too.
std::vector<std::string> split_command_line(std::string_view text);

}  // namespace dlprobe
