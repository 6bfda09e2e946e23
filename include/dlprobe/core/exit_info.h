// How a child process ended, from waitpid's status, in the words every command prints it with.
#pragma once

#include <optional>
#include <string>

namespace dlprobe {

struct ExitInfo {
  std::optional<int> exit_code;  // when it exited
  std::optional<int> signal;     // when a signal ended it
  bool core_dumped = false;
};

// Decodes waitpid's `status` of a process that has ended.
ExitInfo exit_info_of(int status);
std::string describe_exit(const ExitInfo& info);  // "exit 0", "exit 1", "signal 9 (SIGKILL)"

}  // namespace dlprobe
