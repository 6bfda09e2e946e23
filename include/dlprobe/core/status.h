// Status and Result<T>: how every dlprobe library call reports failure. Errors are values, not
// exceptions, so a sweep can record a failed configuration and go on.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dlprobe {

enum class Errc {
  ok,
  invalid_argument,  // bad input from the user: a flag value, a file, a size
  not_found,         // a file, library, symbol or device that is not there
  unavailable,       // the platform cannot give this (no GPU, NVML field unsupported)
  unsupported,       // we do not implement this combination
  out_of_memory,
  api_error,  // a CUDA / cuDNN / cuBLAS / NVML / system call failed
  io_error,
  internal,
};

std::string_view errc_name(Errc code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == Errc::ok; }
  explicit operator bool() const { return is_ok(); }
  Errc code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("loading weights: ") so the one-line message says where it failed.
  Status with_context(std::string_view context) const;

 private:
  Errc code_ = Errc::ok;
  std::string message_;
};

Status error(Errc code, std::string message);
inline Status invalid_argument(std::string message) {
  return error(Errc::invalid_argument, std::move(message));
}

// A value or the Status saying why there is none (std::expected is C++23; g++ 12 lacks it).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).is_ok() && "a Result cannot hold an ok Status");
  }

  bool has_value() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return has_value(); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Status& status() const {
    static const Status kOk;
    return has_value() ? kOk : std::get<Status>(v_);
  }
  T value_or(T fallback) const { return has_value() ? value() : std::move(fallback); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace dlprobe

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define DLPROBE_RETURN_IF_ERROR(expr)                     \
  do {                                                    \
    ::dlprobe::Status dlprobe_status_ = (expr);           \
    if (!dlprobe_status_.is_ok()) return dlprobe_status_; \
  } while (0)

#define DLPROBE_CONCAT_INNER(a, b) a##b
#define DLPROBE_CONCAT(a, b) DLPROBE_CONCAT_INNER(a, b)

// `DLPROBE_ASSIGN_OR_RETURN(auto x, make_x());` binds the value or returns the error.
#define DLPROBE_ASSIGN_OR_RETURN(decl, expr) \
  DLPROBE_ASSIGN_OR_RETURN_IMPL(DLPROBE_CONCAT(dlprobe_result_, __LINE__), decl, expr)
#define DLPROBE_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.has_value()) return tmp.status();           \
  decl = std::move(tmp).value()
