// Starting a workload and talking to it: fork/exec in a process group of its own (so one signal
// reaches all of it), stdout and stderr through pipes that we pass on to ours as the bytes arrive
// and split into lines for the parsers, and a bounded tail of each kept in memory.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/exit_info.h"
#include "dlprobe/core/status.h"

namespace dlprobe::run {

enum class Stream { out, err };

struct SpawnOptions {
  std::vector<std::string> argv;               // argv[0] is looked up on PATH
  std::map<std::string, std::string> env_set;  // added to (or replacing in) our environment
  bool echo = true;  // copy the workload's output to our stdout / stderr as it arrives
  // Files that receive everything the workload writes (empty: none).
  std::string stdout_path;
  std::string stderr_path;
  std::size_t tail_lines = 200;  // lines kept per stream for the results
};

// How the root process ended.
class ChildProcess {
 public:
  // Forks and execs. A command that cannot be executed (not found, not executable) fails here
  // with the exec error, not later as an odd exit code.
  static Result<std::unique_ptr<ChildProcess>> spawn(const SpawnOptions& options);
  ~ChildProcess();  // kills the group if it is still running and reaps the root
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  pid_t pgid() const { return pid_; }  // the root leads its own group

  using LineSink = std::function<void(Stream, std::string_view line)>;
  // Waits up to `timeout` for output, passes it on, and calls `on_line` for every complete line
  // ('\n' or '\r' ends one, so progress bars are seen too). Returns whether any byte arrived.
  bool pump(std::chrono::milliseconds timeout, const LineSink& on_line);
  // Both pipes reached end of file (every writer, including grandchildren, closed them).
  bool output_closed() const;
  // Hands the last partial line (one without a terminator) to `on_line`.
  void flush_partial(const LineSink& on_line);

  // Reaps the root without blocking; true once it has ended. Children we adopted as a subreaper
  // are reaped too (reap_others), also after the root has ended, so they leave no zombies.
  bool poll_exit(bool reap_others);
  const std::optional<ExitInfo>& exit_info() const { return exit_; }

  // Sends `sig` to the whole process group; false when nobody was left to receive it.
  bool signal_group(int sig) const;

  const std::deque<std::string>& tail(Stream s) const {
    return s == Stream::out ? out_.tail : err_.tail;
  }

 private:
  struct Pipe {
    int fd = -1;
    int echo_fd = -1;
    int file_fd = -1;
    std::string partial;
    std::deque<std::string> tail;
    std::uint64_t bytes = 0;
    bool last_cr = false;
  };
  ChildProcess() = default;
  void read_pipe(Pipe& pipe, Stream stream, const LineSink& on_line);
  void end_line(Pipe& pipe, Stream stream, const LineSink& on_line);

  pid_t pid_ = -1;
  Pipe out_;
  Pipe err_;
  std::size_t tail_lines_ = 200;
  std::optional<ExitInfo> exit_;
};

// Enables PR_SET_CHILD_SUBREAPER for this process: orphaned grandchildren of a workload (a
// daemonised helper, a `docker run` shim) then re-parent to us instead of init, so the ppid scan
// still finds them. The caller must reap them (ChildProcess::poll_exit(true)).
Status become_subreaper();

}  // namespace dlprobe::run
