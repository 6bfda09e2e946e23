#include "dlprobe/run/child_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dlprobe/core/log.h"
#include "dlprobe/core/process_env.h"

extern char** environ;

namespace dlprobe::run {

namespace {

// A line longer than this is cut for parsing and the tail; the bytes still pass through whole.
constexpr std::size_t kMaxLine = 1 << 20;
constexpr std::size_t kMaxTailLine = 4096;

// False when `fd` failed for good (EPIPE: the reader of our stdout went away; dlprobe ignores
// SIGPIPE). A full non-blocking descriptor (EAGAIN) drops the rest of this block and is not final.
// The workload goes on regardless: its measurement and results do not depend on the echo.
bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

Status become_subreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    return error(Errc::api_error,
                 fmt::format("prctl(PR_SET_CHILD_SUBREAPER): {}", strerror(errno)));
  }
  return Status::ok();
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const SpawnOptions& options) {
  if (options.argv.empty() || options.argv.front().empty()) {
    return invalid_argument("no command to run");
  }
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  child->tail_lines_ = options.tail_lines;

  // Everything the child needs is built before fork: after fork only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    const std::string key(entry.substr(0, entry.find('=')));
    // What dlprobe set for its own GPU work is not the workload's (process_env.h).
    if (options.env_set.count(key) == 0 && !set_by_dlprobe(key)) env_storage.emplace_back(entry);
  }
  for (const auto& [key, value] : options.env_set) env_storage.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  auto open_log = [](const std::string& path, int& fd) -> Status {
    if (path.empty()) return Status::ok();
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return error(Errc::io_error, fmt::format("cannot write '{}': {}", path, strerror(errno)));
    }
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(open_log(options.stdout_path, child->out_.file_fd));
  DLPROBE_RETURN_IF_ERROR(open_log(options.stderr_path, child->err_.file_fd));

  int out_pipe[2];
  int err_pipe[2];
  int exec_pipe[2];
  // EMFILE is the usual cause (ulimit -n): strerror names it.
  const auto pipe_failed = [] {
    return error(Errc::api_error, fmt::format("pipe2 failed: {}", std::strerror(errno)));
  };
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return pipe_failed();
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    const Status failed = pipe_failed();
    close(out_pipe[0]);
    close(out_pipe[1]);
    return failed;
  }
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const Status failed = pipe_failed();
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return failed;
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0], exec_pipe[1],
                   null_fd}) {
      if (fd >= 0) close(fd);
    }
    return error(Errc::api_error, fmt::format("fork: {}", strerror(err)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // The workload starts with default signal handling whatever dlprobe installed or ignored.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGQUIT, SIGHUP, SIGCHLD, SIGXFSZ}) {
      signal(sig, SIG_DFL);
    }
    // stdin is /dev/null: a process group that is not the terminal's foreground would be stopped
    // (SIGTTIN) the moment it read from the terminal.
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] const auto n = write(exec_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  // Also here, so that signalling the group cannot race the child's own setpgid.
  setpgid(pid, pid);
  child->pid_ = pid;
  for (int fd : {out_pipe[1], err_pipe[1], exec_pipe[1], null_fd}) {
    if (fd >= 0) close(fd);
  }
  child->out_.fd = out_pipe[0];
  child->err_.fd = err_pipe[0];
  fcntl(child->out_.fd, F_SETFL, O_NONBLOCK);
  fcntl(child->err_.fd, F_SETFL, O_NONBLOCK);
  if (options.echo) {
    child->out_.echo_fd = STDOUT_FILENO;
    child->err_.echo_fd = STDERR_FILENO;
  }

  int exec_errno = 0;
  ssize_t n = 0;
  do {
    n = read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    int status = 0;
    waitpid(pid, &status, 0);
    child->exit_ = ExitInfo{WIFEXITED(status) ? std::optional(WEXITSTATUS(status)) : std::nullopt,
                            std::nullopt, false};
    return error(
        exec_errno == ENOENT ? Errc::not_found : Errc::api_error,
        fmt::format("cannot execute '{}': {}", options.argv.front(), strerror(exec_errno)));
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exit_) {
    kill(-pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  for (Pipe* p : {&out_, &err_}) {
    close_fd(p->fd);
    close_fd(p->file_fd);
  }
}

void ChildProcess::end_line(Pipe& pipe, Stream stream, const LineSink& on_line) {
  if (on_line) on_line(stream, pipe.partial);
  if (tail_lines_ > 0) {
    pipe.tail.push_back(pipe.partial.size() > kMaxTailLine ? pipe.partial.substr(0, kMaxTailLine)
                                                           : pipe.partial);
    while (pipe.tail.size() > tail_lines_) pipe.tail.pop_front();
  }
  pipe.partial.clear();
}

void ChildProcess::read_pipe(Pipe& pipe, Stream stream, const LineSink& on_line) {
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(pipe.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: drained for now
    if (n == 0) {
      close_fd(pipe.fd);
      return;
    }
    const auto size = static_cast<std::size_t>(n);
    pipe.bytes += size;
    if (pipe.echo_fd >= 0 && !write_all(pipe.echo_fd, buffer, size)) {
      log_warn("cannot pass the workload's {} on ({}): measuring without it",
               stream == Stream::out ? "stdout" : "stderr", strerror(errno));
      pipe.echo_fd = -1;
    }
    if (pipe.file_fd >= 0) write_all(pipe.file_fd, buffer, size);
    for (std::size_t i = 0; i < size; ++i) {
      const char c = buffer[i];
      const bool after_cr = pipe.last_cr;
      pipe.last_cr = c == '\r';
      if (c == '\n' || c == '\r') {
        // "\r\n" ends one line, not two.
        if (c == '\n' && after_cr) continue;
        end_line(pipe, stream, on_line);
      } else if (pipe.partial.size() < kMaxLine) {
        pipe.partial.push_back(c);
      }
    }
  }
}

bool ChildProcess::pump(std::chrono::milliseconds timeout, const LineSink& on_line) {
  pollfd fds[2];
  nfds_t count = 0;
  for (Pipe* p : {&out_, &err_}) {
    if (p->fd >= 0) fds[count++] = {p->fd, POLLIN, 0};
  }
  if (count == 0) {
    if (timeout.count() > 0) usleep(static_cast<useconds_t>(timeout.count()) * 1000U);
    return false;
  }
  const int ready = poll(fds, count, static_cast<int>(timeout.count()));
  if (ready <= 0) return false;
  const std::uint64_t before = out_.bytes + err_.bytes;
  if (out_.fd >= 0) read_pipe(out_, Stream::out, on_line);
  if (err_.fd >= 0) read_pipe(err_, Stream::err, on_line);
  return out_.bytes + err_.bytes != before;
}

bool ChildProcess::output_closed() const {
  return out_.fd < 0 && err_.fd < 0;
}

void ChildProcess::flush_partial(const LineSink& on_line) {
  if (!out_.partial.empty()) end_line(out_, Stream::out, on_line);
  if (!err_.partial.empty()) end_line(err_, Stream::err, on_line);
}

bool ChildProcess::poll_exit(bool reap_others) {
  auto record = [&](int status) { exit_ = exit_info_of(status); };
  int status = 0;
  if (reap_others) {
    pid_t r = 0;
    // Also after the root has ended: the rest of the tree is reaped as it is killed.
    while ((r = waitpid(-1, &status, WNOHANG)) > 0) {
      if (r == pid_) record(status);
    }
  } else if (!exit_ && waitpid(pid_, &status, WNOHANG) == pid_) {
    record(status);
  }
  return exit_.has_value();
}

bool ChildProcess::signal_group(int sig) const {
  return pid_ > 0 && kill(-pid_, sig) == 0;
}

}  // namespace dlprobe::run
