#include "dlprobe/core/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dlprobe {

Result<std::string> read_whole_file(const std::filesystem::path& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return error(err == ENOENT ? Errc::not_found : Errc::io_error,
                 fmt::format("{}: cannot open: {}", path.string(), std::strerror(err)));
  }
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
  return text;
}

Status check_writable(const std::filesystem::path& path) {
  const std::filesystem::path folder =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) {
    return invalid_argument(
        fmt::format("{}: cannot write there: no folder {}", path.string(), folder.string()));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return invalid_argument(fmt::format("{}: is a folder, not a file", path.string()));
  }
  // The file is written beside itself and renamed over, so the folder must take new entries.
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return invalid_argument(fmt::format("{}: cannot write in {}: {}", path.string(),
                                        folder.string(), std::strerror(errno)));
  }
  return Status::ok();
}

Status write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  // The temporary sits in the same directory so that rename() stays within one file system,
  // which is what makes it atomic.
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return error(Errc::io_error,
                 fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return error(Errc::io_error,
                   fmt::format("{}: cannot write: {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  // Without fsync a power loss after the rename can leave the new name pointing at empty data.
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    const int err = synced ? errno : sync_err;
    ::unlink(tmp.c_str());
    return error(Errc::io_error,
                 fmt::format("{}: cannot flush: {}", tmp.string(), std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return error(Errc::io_error, fmt::format("{}: cannot replace with {}: {}", path.string(),
                                             tmp.string(), std::strerror(err)));
  }
  return {};
}

}  // namespace dlprobe
