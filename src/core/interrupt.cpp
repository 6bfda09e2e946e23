#include "dlprobe/core/interrupt.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

namespace dlprobe {
namespace {

std::atomic<int> g_signals{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the signal handler needs a lock-free counter");
std::atomic<bool> g_second_ends{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");
std::atomic<bool> g_owned{false};
struct sigaction g_old_int {};
struct sigaction g_old_term {};
struct sigaction g_old_hup {};

// Only async-signal-safe calls: lock-free atomics, sigaction and raise.
void on_signal(int sig) {
  const int before = g_signals.fetch_add(1, std::memory_order_relaxed);
  if (before > 0 && g_second_ends.load(std::memory_order_relaxed)) {
    // The signal is blocked while its handler runs, so the one raised here arrives as the handler
    // returns and meets the default action, which ends the process (by either signal, in either
    // order: SA_RESETHAND would reset only the one that came first).
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(sig, &default_action, nullptr);
    raise(sig);
  }
}

}  // namespace

InterruptGuard::InterruptGuard(Second second) {
  if (g_owned.exchange(true)) {
    std::fputs("dlprobe: internal error: a second InterruptGuard while one is alive\n", stderr);
    std::abort();
  }
  g_signals = 0;
  g_second_ends = second == Second::ends_process;
  struct sigaction action {};
  action.sa_handler = on_signal;
  // SA_RESTART: a write or read the signal lands in (a row being printed, a pipe being drained)
  // goes on rather than failing with EINTR.
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_old_int);
  sigaction(SIGTERM, &action, &g_old_term);
  // A closed terminal or ssh session: the run keeps what it measured, as after Ctrl-C.
  sigaction(SIGHUP, &action, &g_old_hup);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGHUP, &g_old_hup, nullptr);
  g_owned = false;
}

const std::atomic<int>* InterruptGuard::flag() const {
  return &g_signals;
}

bool InterruptGuard::interrupted() const {
  return g_signals.load() > 0;
}

}  // namespace dlprobe
