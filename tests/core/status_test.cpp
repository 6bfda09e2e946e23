#include <gtest/gtest.h>

#include "dlprobe/core/check.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/status.h"

namespace dlprobe {
namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument("odd");
  return x / 2;
}

Result<int> quarter(int x) {
  DLPROBE_ASSIGN_OR_RETURN(int h, half(x));
  return half(h);
}

Status fake_api(int rc) {
  DLPROBE_API_CHECK("FAKE", rc + 0, rc_ == 0, rc_ == 7 ? "seven" : "other");
  return Status::ok();
}

TEST(Status, OkAndError) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = invalid_argument("bad batch");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_EQ(s.with_context("--batch").message(), "--batch: bad batch");
}

TEST(Result, PropagatesValueAndError) {
  EXPECT_EQ(quarter(8).value(), 2);
  auto r = quarter(6);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(), "odd");
  EXPECT_EQ(half(3).value_or(-1), -1);
}

TEST(ApiCheck, NamesCallFamilyAndLogsTheLocation) {
  EXPECT_TRUE(fake_api(0).is_ok());
  const LogLevel before = log_level();
  log_set_level(LogLevel::debug);
  ::testing::internal::CaptureStderr();
  Status s = fake_api(7);
  const std::string logged = ::testing::internal::GetCapturedStderr();
  log_set_level(before);
  EXPECT_EQ(s.code(), Errc::api_error);
  EXPECT_EQ(s.message(), "FAKE call rc + 0 failed: seven");
  // The user's message holds no source path; the debug log (-v) does.
  EXPECT_NE(logged.find("status_test.cpp:"), std::string::npos) << logged;
}

}  // namespace
}  // namespace dlprobe
