// Running the dlprobe binary from the CLI tests: a shell command's exit code and its stdout and
// stderr together, and how many one-line errors it printed.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace dlprobe::testing {

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// `command` runs through the shell; add " 2>&1" to capture stderr.
inline CliRun run_shell(const std::string& command) {
  CliRun r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr) {
    r.output += buf.data();
  }
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Lines of the form every command error takes.
inline int error_lines(const std::string& out) {
  int n = 0;
  for (std::size_t p = out.find("dlprobe: error:"); p != std::string::npos;
       p = out.find("dlprobe: error:", p + 1)) {
    ++n;
  }
  return n;
}

}  // namespace dlprobe::testing
