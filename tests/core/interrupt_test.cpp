// The interrupt guard: signals count while it lives, the second one ends the process unless the
// owner counts them, the handlers before it come back, and there is one guard at a time.
#include "dlprobe/core/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <csignal>
#include <cstdlib>

namespace dlprobe {
namespace {

volatile std::sig_atomic_t g_before_calls = 0;
void before_handler(int) {
  g_before_calls = g_before_calls + 1;
}

TEST(InterruptGuard, TheFirstSignalOnlyCounts) {
  InterruptGuard guard;
  EXPECT_FALSE(guard.interrupted());
  ASSERT_EQ(raise(SIGINT), 0);
  EXPECT_TRUE(guard.interrupted());
  EXPECT_EQ(guard.flag()->load(), 1);
}

TEST(InterruptGuard, SigtermCountsToo) {
  InterruptGuard guard;
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_EQ(guard.flag()->load(), 1);
}

// A closed terminal or ssh session: the run keeps what it measured, as after Ctrl-C.
TEST(InterruptGuard, SighupCountsToo) {
  InterruptGuard guard;
  ASSERT_EQ(raise(SIGHUP), 0);
  EXPECT_EQ(guard.flag()->load(), 1);
}

TEST(InterruptGuard, ANewGuardStartsFromZero) {
  {
    InterruptGuard guard;
    ASSERT_EQ(raise(SIGINT), 0);
  }
  InterruptGuard guard;
  EXPECT_FALSE(guard.interrupted());
}

TEST(InterruptGuardDeathTest, TheSecondSignalEndsTheProcess) {
  EXPECT_EXIT(
      {
        InterruptGuard guard;
        raise(SIGINT);
        raise(SIGINT);
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
  // Either signal in either order.
  EXPECT_EXIT(
      {
        InterruptGuard guard;
        raise(SIGINT);
        raise(SIGTERM);
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

TEST(InterruptGuard, CountedSignalsAllCount) {
  InterruptGuard guard(InterruptGuard::Second::counted);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(raise(i % 2 == 0 ? SIGINT : SIGTERM), 0);
  EXPECT_EQ(guard.flag()->load(), 3);
}

TEST(InterruptGuard, PutsBackTheHandlersBeforeIt) {
  struct sigaction mine {};
  mine.sa_handler = before_handler;
  sigemptyset(&mine.sa_mask);
  struct sigaction old_int {};
  struct sigaction old_term {};
  ASSERT_EQ(sigaction(SIGINT, &mine, &old_int), 0);
  ASSERT_EQ(sigaction(SIGTERM, &mine, &old_term), 0);
  g_before_calls = 0;
  {
    InterruptGuard guard;
    ASSERT_EQ(raise(SIGINT), 0);
    EXPECT_EQ(g_before_calls, 0);
  }
  ASSERT_EQ(raise(SIGINT), 0);
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_EQ(g_before_calls, 2);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
}

TEST(InterruptGuardDeathTest, OneGuardAtATime) {
  EXPECT_DEATH(
      {
        InterruptGuard first;
        InterruptGuard second;
      },
      "a second InterruptGuard");
}

}  // namespace
}  // namespace dlprobe
