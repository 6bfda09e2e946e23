#include "dlprobe/core/exit_info.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstring>

namespace dlprobe {

ExitInfo exit_info_of(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) info.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    info.signal = WTERMSIG(status);
    info.core_dumped = WCOREDUMP(status);
  }
  return info;
}

std::string describe_exit(const ExitInfo& info) {
  if (info.signal) {
    const char* name = sigabbrev_np(*info.signal);
    return fmt::format("signal {} ({}{}){}", *info.signal, name != nullptr ? "SIG" : "?",
                       name != nullptr ? name : "", info.core_dumped ? ", core dumped" : "");
  }
  if (info.exit_code) return fmt::format("exit {}", *info.exit_code);
  return "running";
}

}  // namespace dlprobe
