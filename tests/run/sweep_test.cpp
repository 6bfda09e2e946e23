#include <gtest/gtest.h>

#include "dlprobe/run/runner.h"
#include "dlprobe/run/session.h"

namespace dlprobe::run {
namespace {

TEST(Sweep, ParsesAxes) {
  auto a = parse_sweep("batch=16, 32,64");
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_EQ(a->key, "batch");
  EXPECT_EQ(a->values, (std::vector<std::string>{"16", "32", "64"}));
  EXPECT_FALSE(parse_sweep("batch"));
  EXPECT_FALSE(parse_sweep("=1,2"));
  EXPECT_FALSE(parse_sweep("batch="));
  EXPECT_FALSE(parse_sweep("ba-tch=1"));
  EXPECT_FALSE(parse_sweep("batch=1,,2"));
}

TEST(Sweep, CartesianProductFirstAxisSlowest) {
  const auto points = sweep_points({{"amp", {"fp16", "bf16"}}, {"batch", {"8", "16", "32"}}});
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0].at("amp"), "fp16");
  EXPECT_EQ(points[0].at("batch"), "8");
  EXPECT_EQ(points[2].at("batch"), "32");
  EXPECT_EQ(points[3].at("amp"), "bf16");
  EXPECT_EQ(sweep_points({}).size(), 1u);
}

TEST(Sweep, SubstitutesOnlyKnownKeys) {
  const std::vector<std::string> argv{"python3",         "train.py",        "--batch={batch}",
                                      "{batch}x{batch}", "print({'a': 1})", "{other}"};
  const auto out = substitute(argv, {{"batch", "64"}});
  EXPECT_EQ(out, (std::vector<std::string>{"python3", "train.py", "--batch=64", "64x64",
                                           "print({'a': 1})", "{other}"}));
  EXPECT_TRUE(mentions(argv, "batch"));
  EXPECT_FALSE(mentions(argv, "amp"));
}

TEST(Sweep, PointLabelsInKeyOrder) {
  EXPECT_EQ(point_label({{"batch", "64"}, {"amp", "bf16"}}), "amp=bf16 batch=64");
  EXPECT_EQ(point_label({}), "");
}

// A plan that does not fit its command is refused before anything runs or is written.
TEST(Session, RefusesPlansThatDoNotFitTheCommand) {
  const auto refused = [](SessionPlan p) {
    auto s = Session::start(std::move(p), {});
    EXPECT_FALSE(s.has_value());
    return s ? std::string() : s.status().message();
  };
  SessionPlan p;
  EXPECT_NE(refused(p).find("no command"), std::string::npos);
  p.command = {"train", "--batch", "{batch}"};
  p.axes = {{"amp", {"fp16"}}};
  EXPECT_NE(refused(p).find("'{amp}' does not appear"), std::string::npos);
  p.axes = {{"batch", {"8"}}, {"batch", {"16"}}};
  EXPECT_NE(refused(p).find("given twice"), std::string::npos);
  p.axes = {{"batch", {"8"}}};
  p.max_batch = MaxBatchPlan{};
  EXPECT_NE(refused(p).find("drop --sweep batch"), std::string::npos);
  p.axes.clear();
  p.max_batch->limit = 8;
  EXPECT_NE(refused(p).find("below --max-batch-start"), std::string::npos);
  p.max_batch = MaxBatchPlan{.start = 16, .limit = 50, .step = 100};
  EXPECT_NE(refused(p).find("--max-batch-step: no multiple of 100 lies between --max-batch-start "
                            "16 and --max-batch-limit 50"),
            std::string::npos)
      << refused(p);
  p.command = {"train"};
  EXPECT_NE(refused(p).find("needs '{batch}'"), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::run
