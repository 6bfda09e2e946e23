#include <gtest/gtest.h>

#include "dlprobe/core/units.h"

namespace dlprobe {
namespace {

using std::chrono::nanoseconds;

TEST(ParseSize, BinaryDecimalAndBare) {
  EXPECT_EQ(parse_size("2GiB").value(), 2ULL << 30);
  EXPECT_EQ(parse_size("512MB").value(), 512'000'000ULL);
  EXPECT_EQ(parse_size("512mib").value(), 512ULL << 20);
  EXPECT_EQ(parse_size("1.5G").value(), 3ULL << 29);
  EXPECT_EQ(parse_size("64k").value(), 65536ULL);
  EXPECT_EQ(parse_size("4096").value(), 4096ULL);
  EXPECT_EQ(parse_size(" 16 GiB ").value(), 16ULL << 30);
}

TEST(ParseSize, RejectsWithFlagName) {
  for (const char* bad : {"", "GiB", "-1GiB", "2XB", "1.2.3G", "abc"}) {
    auto r = parse_size(bad, "--limit");
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.status().code(), Errc::invalid_argument);
    EXPECT_EQ(r.status().message().rfind("--limit: ", 0), 0U) << r.status().message();
    EXPECT_NE(r.status().message().find("accepts"), std::string::npos);
  }
  EXPECT_FALSE(parse_size("99999999TiB").has_value());
}

// Found by the units fuzz target: a count above 2^63 went through llround, whose long long it
// overflows, and came back as 2^63.
TEST(ParseSize, CountsAbove2To63AreExact) {
  EXPECT_EQ(parse_size("9999999999999999999").value(), 10'000'000'000'000'000'000ULL);
  EXPECT_EQ(parse_size("15000000TiB").value(), 16'492'674'416'640'000'000ULL);
}

TEST(FormatSize, PicksUnit) {
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(1536), "1.50 KiB");
  EXPECT_EQ(format_size(11ULL << 30), "11.0 GiB");
  EXPECT_EQ(format_size(140ULL << 30), "140 GiB");
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(parse_duration("100ms").value(), nanoseconds(100'000'000));
  EXPECT_EQ(parse_duration("2s").value(), nanoseconds(2'000'000'000));
  EXPECT_EQ(parse_duration("1m").value(), nanoseconds(60'000'000'000));
  EXPECT_EQ(parse_duration("1.5s").value(), nanoseconds(1'500'000'000));
  EXPECT_EQ(parse_duration("10us").value(), nanoseconds(10'000));
  EXPECT_EQ(parse_duration("1h").value(), nanoseconds(3'600'000'000'000));
}

TEST(ParseDuration, RejectsBareNumbersAndUnknownUnits) {
  auto bare = parse_duration("100", "-i");
  ASSERT_FALSE(bare.has_value());
  EXPECT_NE(bare.status().message().find("needs a unit"), std::string::npos);
  EXPECT_FALSE(parse_duration("5 parsecs").has_value());
  EXPECT_FALSE(parse_duration("ms").has_value());
  EXPECT_FALSE(parse_duration("-2s").has_value());
}

TEST(FormatDuration, Readable) {
  EXPECT_EQ(format_duration(nanoseconds(250'000'000)), "250ms");
  EXPECT_EQ(format_duration(nanoseconds(1'500'000'000)), "1.5s");
  EXPECT_EQ(format_duration(nanoseconds(125'000'000'000)), "2m05s");
}

// A value that rounds up to 1000 of its unit is written in the next unit: "{:.3g}" printed
// 999.95 us as "1e+03us", which is neither readable nor a duration parse_duration takes.
TEST(FormatDuration, RoundingUpMovesToTheNextUnit) {
  EXPECT_EQ(format_duration(nanoseconds(999'950)), "1ms");
  EXPECT_EQ(format_duration(nanoseconds(999'999)), "1ms");
  EXPECT_EQ(format_duration(nanoseconds(999'999'999)), "1s");
  EXPECT_EQ(format_duration(nanoseconds(999'400)), "999us");
  for (const std::int64_t ns : {999'950LL, 999'999'999LL, 59'999'999'999LL}) {
    EXPECT_TRUE(parse_duration(format_duration(nanoseconds(ns))).has_value()) << ns;
  }
}

TEST(ParseList, SplitsAndTrims) {
  EXPECT_EQ(parse_list("fp32, tf32,fp16").value(),
            (std::vector<std::string>{"fp32", "tf32", "fp16"}));
  EXPECT_FALSE(parse_list("16,,32").has_value());
  EXPECT_FALSE(parse_list("").has_value());
}

TEST(ParseInt, Range) {
  EXPECT_EQ(parse_int("7", "-c", 1, 10).value(), 7);
  EXPECT_FALSE(parse_int("0", "-c", 1, 10).has_value());
  EXPECT_FALSE(parse_int("1e3", "-c", 1, 10000).has_value());
  EXPECT_FALSE(parse_int("12abc", "-c", 1, 100).has_value());
}

TEST(ParseFraction, DecimalOrPercent) {
  EXPECT_DOUBLE_EQ(parse_fraction("0.9", "f").value(), 0.9);
  EXPECT_DOUBLE_EQ(parse_fraction("90%", "f").value(), 0.9);
  EXPECT_FALSE(parse_fraction("1.5", "f").has_value());
  EXPECT_FALSE(parse_fraction("90 percent", "f").has_value());
}

TEST(FormatGrouped, ThousandsSeparatorsAndDecimals) {
  EXPECT_EQ(format_grouped(5810.6, 1), "5,810.6");
  EXPECT_EQ(format_grouped(1234567.0, 0), "1,234,567");
  EXPECT_EQ(format_grouped(999.96, 1), "1,000.0");
  EXPECT_EQ(format_grouped(12.5, 2), "12.50");
  EXPECT_EQ(format_grouped(-1234.5, 1), "-1,234.5");
  EXPECT_EQ(format_grouped(0.0, 1), "0.0");
}

TEST(ParseCudaIndex, CudaAndCudaN) {
  EXPECT_EQ(parse_cuda_index("cuda"), 0);
  EXPECT_EQ(parse_cuda_index("cuda:3"), 3);
  for (const char* bad : {"cuda:", "cuda:-1", "cuda:1x", "cuda1", "cpu", "CUDA:0", ""}) {
    EXPECT_FALSE(parse_cuda_index(bad).has_value()) << bad;
  }
}

// Control characters are shown, never passed on: a line stays one line and the terminal is left as
// it was; other bytes (UTF-8 too) pass as they are.
TEST(OneLine, EscapesControlCharacters) {
  EXPECT_EQ(one_line("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(one_line("x\x1b]0;t\x07\x7f"), "x\\x1b]0;t\\x07\\x7f");
  EXPECT_EQ(one_line("H200 \xc2\xb5s"), "H200 \xc2\xb5s");
}

}  // namespace
}  // namespace dlprobe
