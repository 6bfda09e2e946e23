// Logging to stderr with a level; results go to stdout, progress and diagnostics to stderr.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace dlprobe {

enum class LogLevel { debug, info, warn, error, quiet };

void log_set_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, std::string_view message);

template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::debug)
    log_write(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::info)
    log_write(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::warn)
    log_write(LogLevel::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::error)
    log_write(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dlprobe
