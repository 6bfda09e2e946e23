// How every CLI test starts a program: the dlprobe binary (run_dlprobe, start_dlprobe) or another
// one (run_process: Chromium for the report tests). Fork and exec with no shell in between, the
// child in a process group of its own, stdin from a string, extra environment variables, stdout
// and stderr read through pipes while it runs, an optional SIGINT (Ctrl-C) after a delay, and a
// timeout after which it and everything it started are killed.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace dlprobe::testing {

using namespace std::chrono_literals;

struct ProcessOptions {
  // Variables set in the child's environment (nullopt: removed); it inherits the rest of the
  // test's own.
  std::vector<std::pair<std::string, std::optional<std::string>>> env{};
  // What the child reads on stdin, then end of file (empty: /dev/null).
  std::string stdin_text{};
  // SIGINT, as Ctrl-C sends it, this long after the start.
  std::optional<std::chrono::milliseconds> interrupt_after{};
  // Killed, with everything it started, when it still runs this long after the start.
  std::chrono::milliseconds timeout = 10min;
};

struct ProcessResult {
  int exit_code = -1;  // the exit status, or 128 + the signal that ended it (as a shell says)
  int signal = 0;      // the signal that ended it; 0 when it exited
  bool timed_out = false;
  std::string out;
  std::string err;
  std::string output;  // stdout and stderr together, in the order they arrived
};

enum class Stream { out, err };

// The words of `line` as a POSIX shell splits them, for argument lists written as one string:
// blanks separate words, '...' keeps its characters as they are, and a backslash (anywhere but
// inside '...') or "..." escapes. No expansion of any kind.
inline std::vector<std::string> split_args(std::string_view line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::exchange(word, {}));
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const std::size_t end = line.find('\'', i + 1);
      word += line.substr(i + 1, end - i - 1);
      i = end == std::string_view::npos ? line.size() : end;
    } else if (c == '"') {
      for (++i; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) ++i;
        word += line[i];
      }
    } else if (c == '\\' && i + 1 < line.size()) {
      word += line[++i];
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// `s` as a single word for split_args (and for a shell).
inline std::string quote(std::string_view s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// The whole of a file (one a run wrote), or "" when it cannot be read.
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// How many of the one-line errors every dlprobe command prints `text` holds.
inline int error_lines(const std::string& text) {
  int n = 0;
  for (std::size_t p = text.find("dlprobe: error:"); p != std::string::npos;
       p = text.find("dlprobe: error:", p + 1)) {
    ++n;
  }
  return n;
}

// A running child. Its output is read while the test waits on it (a child that fills a pipe, 64
// KiB, in the meantime waits until then); the destructor kills what still runs.
class Process {
 public:
  Process(std::vector<std::string> argv, ProcessOptions options)
      : options_(std::move(options)), start_(std::chrono::steady_clock::now()) {
    // Everything the child needs is made here: between fork and exec only async-signal-safe calls
    // may run, and the test process may have other threads.
    argv[0] = find_program(argv[0]);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    std::vector<std::string> env_strings = environment();
    std::vector<char*> env;
    for (std::string& e : env_strings) env.push_back(e.data());
    env.push_back(nullptr);
    const int in = stdin_fd();
    std::array<int, 2> out{-1, -1};
    std::array<int, 2> err{-1, -1};
    if (in >= 0 && pipe2(out.data(), O_CLOEXEC) == 0 && pipe2(err.data(), O_CLOEXEC) == 0) {
      pid_ = fork();
      if (pid_ == 0) {
        setpgid(0, 0);
        dup2(in, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        execve(args[0], args.data(), env.data());
        constexpr std::string_view kFailed = "run_dlprobe.h: exec failed\n";
        [[maybe_unused]] const auto n = write(STDERR_FILENO, kFailed.data(), kFailed.size());
        _exit(127);
      }
    }
    if (pid_ > 0) {
      // Both sides set the group, so that it exists whichever runs first.
      setpgid(pid_, pid_);
    } else {
      spawn_error_ = std::string("cannot start ") + argv[0] + ": " + std::strerror(errno) + "\n";
    }
    for (int fd : {in, out[1], err[1]}) {
      if (fd >= 0) close(fd);
    }
    fds_ = {out[0], err[0]};
  }
  Process(Process&& other) noexcept
      : options_(std::move(other.options_)),
        start_(other.start_),
        pid_(std::exchange(other.pid_, -1)),
        fds_(std::exchange(other.fds_, {-1, -1})),
        interrupted_(other.interrupted_),
        result_(std::move(other.result_)),
        spawn_error_(std::move(other.spawn_error_)) {}
  Process& operator=(Process&&) = delete;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() {
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  void signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // Waits until the child ends, up to `timeout` and no longer than the options' timeout (which
  // kills it); its exit code, or -1 while it still runs.
  int wait(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) step(deadline);
    if (pid_ > 0) return -1;
    drain();
    return result_.exit_code;
  }

  // Waits until `pattern` shows up in the child's stdout or stderr; false after `timeout`.
  bool wait_for_output(const std::regex& pattern, Stream stream,
                       std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::regex_search(stream == Stream::out ? result_.out : result_.err, pattern)) {
        return true;
      }
      if (pid_ <= 0) {
        drain();
        return std::regex_search(stream == Stream::out ? result_.out : result_.err, pattern);
      }
      step(deadline);
    }
    return false;
  }

  // What it printed so far.
  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }

  // Waits for the end (the options' timeout kills it) and returns everything.
  ProcessResult finish() {
    while (pid_ > 0) step(std::chrono::steady_clock::time_point::max());
    drain();
    return result_;
  }

 private:
  static std::string find_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const std::string candidate = dir + "/" + name;
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return name;
  }

  std::vector<std::string> environment() const {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const auto& [key, value] : options_.env) replaced = replaced || key == name;
      if (!replaced) env.emplace_back(entry);
    }
    for (const auto& [key, value] : options_.env) {
      if (value) env.push_back(key + "=" + *value);
    }
    return env;
  }

  // The child's stdin: the text in an anonymous file, read from its start.
  int stdin_fd() const {
    if (options_.stdin_text.empty()) return open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int fd = memfd_create("dlprobe-test-stdin", MFD_CLOEXEC);
    if (fd < 0) return fd;
    const auto written = write(fd, options_.stdin_text.data(), options_.stdin_text.size());
    if (written != static_cast<ssize_t>(options_.stdin_text.size()) ||
        lseek(fd, 0, SEEK_SET) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // Reads what the pipes hold, waiting up to `wait` for something to arrive; false when nothing
  // did. A pipe at end of file is closed.
  bool read_ready(std::chrono::milliseconds wait) {
    std::array<pollfd, 2> polled{};
    nfds_t n = 0;
    for (int fd : fds_) {
      if (fd >= 0) polled[n++] = {fd, POLLIN, 0};
    }
    if (n == 0) return false;
    if (poll(polled.data(), n, static_cast<int>(wait.count())) <= 0) return false;
    for (nfds_t i = 0; i < n; ++i) {
      if (polled[i].revents == 0) continue;
      std::array<char, 4096> buf{};
      const ssize_t got = read(polled[i].fd, buf.data(), buf.size());
      const std::size_t which = polled[i].fd == fds_[0] ? 0 : 1;
      if (got <= 0) {
        close(fds_[which]);
        fds_[which] = -1;
        continue;
      }
      const std::string_view text(buf.data(), static_cast<std::size_t>(got));
      (which == 0 ? result_.out : result_.err) += text;
      result_.output += text;
    }
    return true;
  }

  // One round of waiting while the child runs: output read, the interrupt and the timeout sent
  // when due, the exit collected.
  void step(std::chrono::steady_clock::time_point deadline) {
    const auto now = std::chrono::steady_clock::now();
    if (options_.interrupt_after && !interrupted_ && now - start_ >= *options_.interrupt_after) {
      interrupted_ = true;
      kill(pid_, SIGINT);
    }
    if (now - start_ >= options_.timeout) {
      result_.timed_out = true;
      kill(-pid_, SIGKILL);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    // With both pipes closed there is nothing to poll: sleep instead of spinning.
    if (!read_ready(std::clamp(left, 0ms, 10ms)) && fds_[0] < 0 && fds_[1] < 0) usleep(10'000);
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return;
    pid_ = -1;
    if (WIFEXITED(status)) {
      result_.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      result_.signal = WTERMSIG(status);
      result_.exit_code = 128 + result_.signal;
    }
  }

  // After the exit: what is left in the pipes (a grandchild that keeps them open gets a moment,
  // not a hang), and why the child never started, if it did not.
  void drain() {
    const auto until = std::chrono::steady_clock::now() + 2s;
    while ((fds_[0] >= 0 || fds_[1] >= 0) && std::chrono::steady_clock::now() < until &&
           read_ready(100ms)) {
    }
    if (!spawn_error_.empty()) {
      result_.err += spawn_error_;
      result_.output += spawn_error_;
      spawn_error_.clear();
    }
  }

  ProcessOptions options_;
  std::chrono::steady_clock::time_point start_;
  pid_t pid_ = -1;
  std::array<int, 2> fds_{-1, -1};  // the read ends of its stdout and stderr
  bool interrupted_ = false;
  ProcessResult result_;
  std::string spawn_error_;
};

// Runs `argv` (argv[0] a path, or a name looked up in PATH) to its end.
inline ProcessResult run_process(std::vector<std::string> argv, ProcessOptions options = {}) {
  return Process(std::move(argv), std::move(options)).finish();
}

// The dlprobe binary of this build (each CLI test target defines DLPROBE_BINARY) with `args`.
// Its history goes under the temporary directory unless the test or CTest (XDG_DATA_HOME) says
// where: a test run by hand must not add to the home's history either, nor read its config.
inline Process start_dlprobe(std::vector<std::string> args, ProcessOptions options = {}) {
  args.insert(args.begin(), DLPROBE_BINARY);
  const bool placed = std::getenv("XDG_DATA_HOME") != nullptr ||
                      std::any_of(options.env.begin(), options.env.end(),
                                  [](const auto& e) { return e.first == "XDG_DATA_HOME"; });
  if (!placed) {
    options.env.emplace_back(
        "XDG_DATA_HOME", (std::filesystem::temp_directory_path() / "dlprobe-test-data").string());
  }
  // Nor read the home's config file (its prices would change what history prints).
  const bool configured = std::getenv("XDG_CONFIG_HOME") != nullptr ||
                          std::any_of(options.env.begin(), options.env.end(),
                                      [](const auto& e) { return e.first == "XDG_CONFIG_HOME"; });
  if (!configured) {
    options.env.emplace_back(
        "XDG_CONFIG_HOME",
        (std::filesystem::temp_directory_path() / "dlprobe-test-config").string());
  }
  return Process(std::move(args), std::move(options));
}
inline ProcessResult run_dlprobe(std::vector<std::string> args, ProcessOptions options = {}) {
  return start_dlprobe(std::move(args), std::move(options)).finish();
}

}  // namespace dlprobe::testing
