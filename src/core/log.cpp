#include "dlprobe/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace dlprobe {
namespace {
std::atomic<LogLevel> g_level{LogLevel::warn};
std::mutex g_write_mutex;  // keeps lines from the sampler thread and the main thread whole

const char* level_prefix(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warning";
    case LogLevel::error:
      return "error";
    case LogLevel::quiet:
      return "";
  }
  return "";
}
}  // namespace

void log_set_level(LogLevel level) {
  g_level.store(level);
}
LogLevel log_level() {
  return g_level.load();
}

void log_write(LogLevel level, std::string_view message) {
  std::lock_guard lock(g_write_mutex);
  std::fprintf(stderr, "dlprobe %s: %.*s\n", level_prefix(level), static_cast<int>(message.size()),
               message.data());
}

}  // namespace dlprobe
