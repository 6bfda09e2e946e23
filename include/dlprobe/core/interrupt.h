// Ctrl-C for long jobs. While an InterruptGuard lives, SIGINT, SIGTERM and SIGHUP (a closed
// terminal or ssh session) only count: the handler
// adds one to a lock-free counter (all a signal handler may safely do), and the job polls the
// count between its steps, finishes the step it is on, keeps what it measured and writes it.
//
// What a second signal does is the owner's choice:
// - Second::ends_process: a second signal (any of the three) meets the default action and ends the
//   process at once, for a user who will not wait for the step to end.
// - Second::counted: every signal counts, for a job whose work runs in child processes that it
//   must stop itself (ending dlprobe would leave them running); it can act on the second one.
//
// Single owner: the handler and the counter belong to the process, so one guard at a time; a
// second guard while one lives ends the process with a message (a programming error).
#pragma once

#include <atomic>
#include <string_view>

namespace dlprobe {

// How a configuration or run that a guard cut short is recorded.
inline constexpr std::string_view kInterrupted = "interrupted (Ctrl-C or SIGTERM/SIGHUP)";

class InterruptGuard {
 public:
  enum class Second { ends_process, counted };

  // Installs the handler for SIGINT, SIGTERM and SIGHUP and sets the count to 0.
  explicit InterruptGuard(Second second = Second::ends_process);
  // Puts back the handlers that were there before.
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // The signals received since the guard began, for code that polls it (run::RunOptions).
  const std::atomic<int>* flag() const;
  bool interrupted() const;
};

}  // namespace dlprobe
