#include "dlprobe/core/status.h"

#include <fmt/format.h>

#include "dlprobe/core/check.h"
#include "dlprobe/core/log.h"

namespace dlprobe {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::ok:
      return "ok";
    case Errc::invalid_argument:
      return "invalid argument";
    case Errc::not_found:
      return "not found";
    case Errc::unavailable:
      return "unavailable";
    case Errc::unsupported:
      return "unsupported";
    case Errc::out_of_memory:
      return "out of memory";
    case Errc::api_error:
      return "API error";
    case Errc::io_error:
      return "I/O error";
    case Errc::internal:
      return "internal error";
  }
  return "unknown";
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  return {code_, fmt::format("{}: {}", context, message_)};
}

Status error(Errc code, std::string message) {
  return {code, std::move(message)};
}

Status api_failure(std::string_view family, std::string_view call, std::string_view detail,
                   const char* file, int line, Errc code) {
  // The source location is for whoever debugs dlprobe (-v), not for the user's one-line error.
  std::string message = fmt::format("{} call {} failed: {}", family, call, detail);
  log_debug("{} ({}:{})", message, file, line);
  return {code, std::move(message)};
}

}  // namespace dlprobe
