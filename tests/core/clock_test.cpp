// ISO-8601 UTC times as the history's filters and the report's time axis read them.
#include "dlprobe/core/clock.h"

#include <gtest/gtest.h>

#include <chrono>

namespace dlprobe {
namespace {

std::int64_t ms_of(std::string_view text) {
  const auto t = parse_utc_time(text);
  EXPECT_TRUE(t.has_value()) << text;
  return t ? t->time_since_epoch().count() : -1;
}

TEST(ParseUtcTime, DatesAndTimesAsWritten) {
  // 2026-03-01 is day 20,513 since 1970.
  constexpr std::int64_t kDay = 20'513LL * 86'400'000;
  EXPECT_EQ(ms_of("2026-03-01"), kDay);
  EXPECT_EQ(ms_of("2026-03-01T12"), kDay + 12 * 3'600'000);
  EXPECT_EQ(ms_of("2026-03-01T12:30Z"), kDay + 12 * 3'600'000 + 30 * 60'000);
  EXPECT_EQ(ms_of("2026-03-01T12:30:15Z"), kDay + 12 * 3'600'000 + 30 * 60'000 + 15'000);
  EXPECT_EQ(ms_of("2026-03-01T12:30:15.25Z"), kDay + 12 * 3'600'000 + 30 * 60'000 + 15'250);
  EXPECT_EQ(ms_of("2024-02-29"), 19'782LL * 86'400'000);  // a leap day
}

TEST(ParseUtcTime, WhatIsNoTimeIsNone) {
  for (const char* text :
       {"", "2026", "2026-13-01", "2026-00-10", "2026-02-30", "2025-02-29", "2026-3-01",
        "2026/03/01", "2026-03-01T24:00:00Z", "2026-03-01T12:60", "2026-03-01T12:00:61Z",
        "2026-03-01 12:00", "2026-03-01T12:00:00ZZ", "2026-03-01T12:00:00+01:00",
        "2026-03-01T12:00:00.Z", "2026-03-01T12.5", "2026-03-01x", "2026-03-01Z"}) {
    EXPECT_FALSE(parse_utc_time(text).has_value()) << text;
  }
}

}  // namespace
}  // namespace dlprobe
