// bench --repeat-process: starting the processes. Each is this executable again (/proc/self/exe),
// so that the measurement is the same code as the parent's, not a second tool on the PATH.
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "dlprobe/bench/processes.h"
#include "dlprobe/core/exit_info.h"

namespace dlprobe::bench {
namespace {

// Runs this executable with `args` (argv[0] first), its standard output discarded (the parent
// prints the merged results), and waits for it.
Result<int> run_self(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return error(Errc::api_error,
                 fmt::format("--repeat-process: cannot start /proc/self/exe: {}", strerror(rc)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return error(Errc::api_error, fmt::format("--repeat-process: waitpid: {}", strerror(errno)));
    }
  }
  return status;
}

}  // namespace

std::vector<std::string> process_arguments(const std::vector<std::string>& own,
                                           const std::string& results) {
  static constexpr std::array<std::string_view, 5> kWithValue = {"--repeat-process", "--json",
                                                                 "--csv", "--md", "--history"};
  static constexpr std::array<std::string_view, 4> kAlone = {"--overwrite", "--no-history", "-q",
                                                             "--quiet"};
  std::vector<std::string> out;
  for (std::size_t i = 0; i < own.size(); ++i) {
    const std::string_view a = own[i];
    const auto named = [&](std::string_view flag) {
      return a == flag || (a.starts_with(flag) && a.size() > flag.size() && a[flag.size()] == '=');
    };
    if (std::any_of(kWithValue.begin(), kWithValue.end(), named)) {
      if (a.find('=') == std::string_view::npos) ++i;  // the value is the next argument
      continue;
    }
    if (std::find(kAlone.begin(), kAlone.end(), a) != kAlone.end()) continue;
    out.emplace_back(a);
  }
  out.insert(out.end(), {"--json", results, "--quiet", "--no-history"});
  return out;
}

Result<std::vector<ProcessRun>> run_processes(const std::vector<std::string>& own, int count,
                                              const std::function<bool(int)>& starting) {
  if (own.empty()) {
    return error(Errc::unsupported, "--repeat-process: cannot read this command line (/proc)");
  }
  std::error_code no_tmp;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(no_tmp);
  if (no_tmp) {
    return error(Errc::io_error,
                 fmt::format("--repeat-process: no folder for the processes' results (TMPDIR): {}",
                             no_tmp.message()));
  }
  std::string folder = (tmp / "dlprobe-processes-XXXXXX").string();
  if (::mkdtemp(folder.data()) == nullptr) {
    return error(Errc::io_error,
                 fmt::format("--repeat-process: cannot create {}: {}", folder, strerror(errno)));
  }
  std::vector<ProcessRun> processes;
  std::error_code ignored;
  for (int i = 0; i < count && starting(i); ++i) {
    const std::string results = fmt::format("{}/process-{}.json", folder, i + 1);
    ProcessRun p;
    auto status = run_self(process_arguments(own, results));
    if (!status) {
      std::filesystem::remove_all(folder, ignored);
      return status.status();
    }
    // Empty when it exited 0.
    if (const ExitInfo end = exit_info_of(*status); end.exit_code != 0)
      p.failure = describe_exit(end);
    if (auto document = results::read_file(results)) {
      p.document = std::move(document).value();
    } else if (p.failure.empty()) {
      p.failure = fmt::format("no results: {}", document.status().message());
    }
    processes.push_back(std::move(p));
  }
  std::filesystem::remove_all(folder, ignored);
  return processes;
}

}  // namespace dlprobe::bench
