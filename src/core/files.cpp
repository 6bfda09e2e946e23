#include "dlprobe/core/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dlprobe {

Result<int> open_to_read(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a named pipe waits for a writer, forever if none comes; opened without
  // waiting, a pipe that nothing writes to reads as ended. The reads then wait as usual (the flag
  // is cleared), for a pipe whose writer is there.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return error(err == ENOENT ? Errc::not_found : Errc::io_error,
                 fmt::format("{}: cannot open: {}", path.string(), std::strerror(err)));
  }
  if (const int flags = ::fcntl(fd, F_GETFL);
      flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    const int err = errno;
    ::close(fd);
    return error(Errc::io_error,
                 fmt::format("{}: cannot open: {}", path.string(), std::strerror(err)));
  }
  return fd;
}

Result<std::string> read_whole_file(const std::filesystem::path& path, std::uint64_t max_bytes) {
  DLPROBE_ASSIGN_OR_RETURN(const int fd, open_to_read(path));
  const auto too_large = [&] {
    ::close(fd);
    return invalid_argument(
        fmt::format("{}: larger than {} bytes, the most accepted", path.string(), max_bytes));
  };
  std::string text;
  // A regular file says its size; a device or a pipe may never end and is cut off at the limit.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    if (static_cast<std::uint64_t>(st.st_size) > max_bytes) return too_large();
    text.reserve(static_cast<std::size_t>(st.st_size));
  }
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return error(Errc::io_error,
                   fmt::format("{}: cannot read: {}", path.string(), std::strerror(err)));
    }
    if (n == 0) break;
    if (static_cast<std::uint64_t>(n) > max_bytes - text.size()) return too_large();
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (text.empty() && S_ISFIFO(st.st_mode)) {
    return invalid_argument(
        fmt::format("{}: a pipe that gave no data (nothing writes to it)", path.string()));
  }
  return text;
}

namespace {

// Where write_file_atomic("-") writes: standard output, or the copy reserve_stdout() set aside.
std::atomic<int> g_stdout_fd{STDOUT_FILENO};

Status write_all(int fd, std::string_view content, std::string_view name) {
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return error(Errc::io_error, fmt::format("{}: cannot write: {}", name, std::strerror(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

// The file `path` ends at through symbolic links: the one to replace, so that the link stays a
// link. A link to nothing names the file it would create, as the shell's `>` does.
Result<std::filesystem::path> link_target(const std::filesystem::path& path) {
  std::filesystem::path target = path;
  // The kernel's own limit on links followed in one lookup (MAXSYMLINKS).
  for (int hops = 0; hops <= 40; ++hops) {
    struct stat st {};
    if (::lstat(target.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return target;
    std::error_code ec;
    const std::filesystem::path next = std::filesystem::read_symlink(target, ec);
    if (ec) {
      return error(Errc::io_error,
                   fmt::format("{}: cannot read the link: {}", target.string(), ec.message()));
    }
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return error(Errc::io_error, fmt::format("{}: too many levels of symbolic links", path.string()));
}

// Whether two outputs end at the same file: the same name once links and "." and ".." are
// resolved, or two names (hard links) of one existing file.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  if (is_stdout_path(a) || is_stdout_path(b)) return is_stdout_path(a) && is_stdout_path(b);
  const Result<std::filesystem::path> ta = link_target(a);
  const Result<std::filesystem::path> tb = link_target(b);
  if (!ta || !tb) return false;
  // Absolute first: weakly_canonical leaves a relative name none of whose parts exists as it is,
  // so "r.json" and "./r.json" (not yet written) would not compare equal.
  std::error_code ec_a;
  std::error_code ec_b;
  const std::filesystem::path ca =
      std::filesystem::weakly_canonical(std::filesystem::absolute(*ta, ec_a), ec_a);
  const std::filesystem::path cb =
      std::filesystem::weakly_canonical(std::filesystem::absolute(*tb, ec_b), ec_b);
  if (!ec_a && !ec_b && ca == cb) return true;
  std::error_code ec;
  return std::filesystem::equivalent(*ta, *tb, ec) && !ec;
}

}  // namespace

bool is_stdout_path(const std::filesystem::path& path) {
  return path.native() == "-";
}

Status check_writable(const std::filesystem::path& path, bool overwrite) {
  if (is_stdout_path(path)) return Status::ok();
  const Result<std::filesystem::path> target = link_target(path);
  if (!target) return invalid_argument(target.status().message());
  const std::filesystem::path folder =
      target->has_parent_path() ? target->parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) {
    return invalid_argument(
        fmt::format("{}: cannot write there: no folder {}", path.string(), folder.string()));
  }
  struct stat st {};
  if (::stat(target->c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return invalid_argument(fmt::format("{}: is a folder, not a file", path.string()));
    }
    if (!overwrite && S_ISREG(st.st_mode) && st.st_size > 0) {
      return invalid_argument(fmt::format("{}: exists and is not empty ({} replaces it)",
                                          path.string(), kOverwriteFlag));
    }
    // A device or a pipe is written in place, so it is its own permission that counts.
    if (!S_ISREG(st.st_mode)) {
      if (::access(target->c_str(), W_OK) != 0) {
        return invalid_argument(
            fmt::format("{}: cannot write: {}", path.string(), std::strerror(errno)));
      }
      return Status::ok();
    }
  }
  // The file is written beside itself and renamed over, so the folder must take new entries.
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return invalid_argument(fmt::format("{}: cannot write in {}: {}", path.string(),
                                        folder.string(), std::strerror(errno)));
  }
  return Status::ok();
}

Status check_not_inputs(std::span<const NamedOutput> outputs, std::span<const NamedOutput> inputs) {
  for (const NamedOutput& a : outputs) {
    if (a.path.empty() || is_stdout_path(a.path)) continue;
    for (const NamedOutput& in : inputs) {
      if (!in.path.empty() && same_file(a.path, in.path)) {
        return invalid_argument(
            fmt::format("{} and {} both name {}: the output would replace what the command reads",
                        in.flag, a.flag, a.path.string()));
      }
    }
  }
  return Status::ok();
}

Status check_outputs(std::span<const NamedOutput> outputs, bool overwrite,
                     std::span<const NamedOutput> inputs) {
  DLPROBE_RETURN_IF_ERROR(check_not_inputs(outputs, inputs));
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedOutput& a = outputs[i];
    if (a.path.empty()) continue;
    DLPROBE_RETURN_IF_ERROR(check_writable(a.path, overwrite).with_context(a.flag));
    for (std::size_t j = 0; j < i; ++j) {
      const NamedOutput& b = outputs[j];
      if (b.path.empty() || !same_file(a.path, b.path)) continue;
      if (is_stdout_path(a.path)) {
        return invalid_argument(
            fmt::format("{} and {} cannot both write to standard output ('-')", b.flag, a.flag));
      }
      return invalid_argument(fmt::format("{} and {} both name {}: give each a file of its own",
                                          b.flag, a.flag, a.path.string()));
    }
  }
  return Status::ok();
}

Status reserve_stdout() {
  if (g_stdout_fd.load() != STDOUT_FILENO) return Status::ok();
  std::fflush(stdout);
  // Close-on-exec: a workload that dlprobe starts must not inherit the results' stream.
  const int fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return error(Errc::io_error,
                 fmt::format("standard output: cannot set it aside: {}", std::strerror(err)));
  }
  g_stdout_fd.store(fd);
  // stdout now reaches stderr, which a terminal or a log shows as it comes: line by line, so that
  // its lines keep their order among stderr's own.
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  return Status::ok();
}

Status write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  if (is_stdout_path(path)) {
    std::fflush(stdout);
    return write_all(g_stdout_fd.load(), content, "standard output");
  }
  DLPROBE_ASSIGN_OR_RETURN(const std::filesystem::path target, link_target(path));
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    // A device or a pipe (/dev/stdout, a FIFO) has no folder to rename within.
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
      return error(Errc::io_error,
                   fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    }
    const Status written = write_all(fd, content, path.string());
    ::close(fd);
    return written;
  }
  // The temporary sits in the same directory so that rename() stays within one file system,
  // which is what makes it atomic. O_EXCL: a name that is taken, a link planted there included,
  // is never written through.
  static std::atomic<unsigned> counter{0};
  std::filesystem::path tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    // A name of its own rather than the file's with a suffix, which would not fit beside a name
    // near the file system's 255-byte limit.
    tmp = target.parent_path() / fmt::format(".dlprobe-{}-{}.tmp", ::getpid(), counter++);
    // Over an existing file the temporary starts private and takes the file's bits before any
    // byte is in it; a new file gets 0666 less the umask, as any program's new file does.
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, exists ? 0600 : 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  // The errors name the file asked for first: the temporary is ours, not the user's.
  if (fd < 0) {
    const int err = errno;
    return error(Errc::io_error,
                 fmt::format("{}: cannot create {} beside it to replace it: {}", path.string(),
                             tmp.filename().string(), std::strerror(err)));
  }
  const auto fail = [&](std::string_view what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return error(Errc::io_error, fmt::format("{}: cannot {} {}: {}", path.string(), what,
                                             tmp.filename().string(), std::strerror(err)));
  };
  if (exists && ::fchmod(fd, st.st_mode & 07777) != 0) return fail("set permissions", errno);
  if (Status s = write_all(fd, content, path.string()); !s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  // Without fsync a power loss after the rename can leave the new name pointing at empty data.
  if (::fsync(fd) != 0) return fail("flush", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return error(Errc::io_error, fmt::format("{}: cannot flush {}: {}", path.string(),
                                             tmp.filename().string(), std::strerror(err)));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return error(Errc::io_error, fmt::format("{}: cannot replace with {}: {}", path.string(),
                                             tmp.string(), std::strerror(err)));
  }
  return {};
}

Result<std::filesystem::path> xdg_file(const char* xdg_var, std::string_view home_dir,
                                       std::string_view file, std::string_view what,
                                       std::string_view flag) {
  const char* xdg = std::getenv(xdg_var);
  if (xdg != nullptr && std::filesystem::path(xdg).is_absolute()) {
    return std::filesystem::path(xdg) / "dlprobe" / file;
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    // The XDG specification ignores a relative path, as here: say so rather than "not set".
    const bool relative = xdg != nullptr && *xdg != '\0';
    return error(
        Errc::not_found,
        fmt::format(
            "no {} folder: {} HOME is not set (give {})", what,
            relative ? fmt::format("{} is relative ({}), which does not count, and", xdg_var, xdg)
                     : fmt::format("{} is not set and", xdg_var),
            flag));
  }
  return std::filesystem::path(home) / home_dir / "dlprobe" / file;
}

}  // namespace dlprobe
