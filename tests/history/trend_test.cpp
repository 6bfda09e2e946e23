#include "dlprobe/history/trend.h"

#include <gtest/gtest.h>

#include "common/temp_folder.h"
#include "dlprobe/history/text.h"
#include "history/sample.h"

namespace dlprobe::history {
namespace {

using testing::document;
using testing::RunSpec;

TEST(Cost, DollarsPerMillionImagesAndPerEpoch) {
  // 1,000 img/s at $3.60 per GPU-hour: $0.001 per 1,000 images.
  auto c = cost_at(1000.0, 3.6);
  ASSERT_TRUE(c);
  EXPECT_NEAR(c->dollars_per_million_images, 1.0, 1e-12);
  EXPECT_NEAR(c->dollars_per_epoch, 1.281167, 1e-12);
  EXPECT_FALSE(cost_at(std::nullopt, 3.6));
  EXPECT_FALSE(cost_at(0.0, 3.6));
  EXPECT_FALSE(cost_at(1000.0, 0));
}

TEST(Cost, JoulesPerImageOnlyWithMeasuredEnergy) {
  Entry e;
  e.items = 1000;
  EXPECT_FALSE(joules_per_image(e));
  e.energy_j = 250;
  EXPECT_DOUBLE_EQ(joules_per_image(e).value(), 0.25);
}

TEST(EnvironmentDiff, NamesTheOneChange) {
  const auto a = testing::context(RunSpec());
  auto b = a;
  EXPECT_TRUE(environment_diff(a, b).empty());
  b.driver_version = "590.10";
  const auto changes = environment_diff(a, b);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], (Change{"driver", "580.65.06", "590.10"}));
  EXPECT_EQ(render_changes(changes), "the one change: driver: 580.65.06 -> 590.10\n");
  b.libraries[0].version = "9.20.0";
  results::DeviceState s;
  s.power_limit_w = 700;
  b.device_state.push_back(s);
  const auto more = environment_diff(a, b);
  ASSERT_EQ(more.size(), 3u);
  EXPECT_EQ(more[1], (Change{"cuDNN", "9.19.0", "9.20.0"}));
  EXPECT_EQ(more[2], (Change{"GPU 0 power limit (W)", "", "700"}));
}

TEST(EnvironmentDiff, ANewImageIsOneChangeOfNameAndDigest) {
  const results::Container old_image{"docker", "nvcr.io/nvidia/pytorch:24.05-py3", "sha256:aa"};
  const auto a = testing::context(RunSpec().inside(old_image));
  auto b = a;
  b.container->image = "nvcr.io/nvidia/pytorch:24.06-py3";
  b.container->digest = "sha256:bb";
  const auto changes = environment_diff(a, b);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(render_changes(changes),
            "the one change: container image: nvcr.io/nvidia/pytorch:24.05-py3 (sha256:aa) -> "
            "nvcr.io/nvidia/pytorch:24.06-py3 (sha256:bb)\n");
  // The same tag rebuilt: only the digest tells.
  b.container->image = old_image.image;
  ASSERT_EQ(environment_diff(a, b).size(), 1u);
  EXPECT_EQ(environment_diff(a, b)[0].after, "nvcr.io/nvidia/pytorch:24.05-py3 (sha256:bb)");
  // Out of the container: its runtime and image both go.
  b.container.reset();
  EXPECT_EQ(environment_diff(a, b),
            (std::vector<Change>{
                {"container", "docker", ""},
                {"container image", "nvcr.io/nvidia/pytorch:24.05-py3 (sha256:aa)", ""}}));
}

class Trend : public ::testing::Test {
 protected:
  void SetUp() override {
    auto h = History::open(dir_ / "h.sqlite");
    ASSERT_TRUE(h) << h.status().message();
    history_.emplace(std::move(h).value());
  }
  void add(RunSpec spec) { ASSERT_TRUE(history_->add(document(spec))); }
  // Five days at 0.100 s per step, each day's clock a little different.
  void steady_days(int steps = 40) {
    const double days[] = {0.1000, 0.1004, 0.0997, 0.1002, 0.0999};
    for (int i = 0; i < 5; ++i) {
      add(RunSpec()
              .at("2026-03-0" + std::to_string(i + 1) + "T03:00:00Z")
              .stepping(days[i])
              .timing(steps));
    }
  }
  std::vector<Series> series() {
    auto t = trend(*history_, {});
    EXPECT_TRUE(t) << t.status().message();
    return t ? *t : std::vector<Series>{};
  }
  dlprobe::testing::TempFolder dir_;
  std::optional<History> history_;
};

TEST_F(Trend, ASteadyConfigurationIsNoChange) {
  steady_days();
  add(RunSpec().at("2026-03-06T03:00:00Z").stepping(0.1001));
  const auto s = series();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].points.size(), 6u);
  EXPECT_EQ(s[0].flag, Flag::no_change);
  EXPECT_EQ(s[0].window, 5);
  EXPECT_FALSE(any_regression(s));
}

TEST_F(Trend, AClearlySlowerLatestIsARegressionNamingWhatChanged) {
  steady_days();
  add(RunSpec().at("2026-03-06T03:00:00Z").driven_by("590.10").stepping(0.110));
  const auto s = series();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].flag, Flag::regression);
  ASSERT_TRUE(s[0].ratio);
  EXPECT_NEAR(*s[0].ratio, 0.909, 0.005);
  ASSERT_TRUE(s[0].ratio_ci);
  EXPECT_LT(s[0].ratio_ci->high, 1);
  EXPECT_TRUE(any_regression(s));
  ASSERT_EQ(s[0].changes.size(), 1u);
  EXPECT_EQ(s[0].changes[0].what, "driver");
  const std::string text = render_trend(s, Prices{2.5, {}, {}});
  EXPECT_NE(text.find("REGRESSION"), std::string::npos) << text;
  EXPECT_NE(text.find("the one change: driver: 580.65.06 -> 590.10"), std::string::npos) << text;
  EXPECT_NE(text.find("$/epoch"), std::string::npos) << text;
}

TEST_F(Trend, ARegressionAfterANewImageNamesTheImage) {
  const results::Container before{"podman", "localhost/train:7", "5e1f"};
  const double days[] = {0.1000, 0.1004, 0.0997, 0.1002, 0.0999};
  for (int i = 0; i < 5; ++i) {
    add(RunSpec()
            .at("2026-03-0" + std::to_string(i + 1) + "T03:00:00Z")
            .stepping(days[i])
            .inside(before));
  }
  add(RunSpec()
          .at("2026-03-06T03:00:00Z")
          .stepping(0.110)
          .inside({"podman", "localhost/train:8", "77c0"}));
  const auto s = series();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].flag, Flag::regression);
  const std::string text = render_trend(s, Prices{});
  EXPECT_NE(text.find("the one change: container image: localhost/train:7 (5e1f) -> "
                      "localhost/train:8 (77c0)"),
            std::string::npos)
      << text;
}

TEST_F(Trend, ADropWithinTheSpreadBetweenRunsIsNoRegression) {
  steady_days(400);
  // Significantly slower than the window's steps pooled, and beyond a noise threshold of 0, but
  // not slower than the slowest day of the window (0.1004 s).
  const RunSpec latest = RunSpec().at("2026-03-06T03:00:00Z").stepping(0.1003).timing(400);
  add(latest);
  TrendOptions strict;
  strict.noise = 0;
  auto t = trend(*history_, {}, strict);
  ASSERT_TRUE(t) << t.status().message();
  ASSERT_TRUE((*t)[0].ratio);
  EXPECT_LT(*(*t)[0].ratio, 1);
  EXPECT_EQ((*t)[0].flag, Flag::no_change);
  // The pooled test alone would call it slower.
  std::vector<double> base_s, base_n;
  for (const auto& e : (*t)[0].points) {
    if (e.date == latest.date) continue;
    const auto d = history_->document(e.id).value();
    const auto& samples = d.configurations.front().samples;
    base_s.insert(base_s.end(), samples.step_seconds.begin(), samples.step_seconds.end());
    base_n.insert(base_n.end(), samples.step_items.begin(), samples.step_items.end());
  }
  const auto last = testing::configuration(latest).samples;
  EXPECT_LT(stats::throughput_ratio(base_s, base_n, last.step_seconds, last.step_items)->ci.high,
            1);
  EXPECT_LT(stats::mann_whitney_u(base_s, last.step_seconds)->p_value, 0.05);
}

TEST_F(Trend, AFasterLatestIsAnImprovement) {
  steady_days();
  add(RunSpec().at("2026-03-06T03:00:00Z").stepping(0.090));
  EXPECT_EQ(series()[0].flag, Flag::improvement);
}

TEST_F(Trend, OneResultIsTooFewAndFailedRunsAreNotCompared) {
  add(RunSpec());
  EXPECT_EQ(series()[0].flag, Flag::too_few);
}

TEST_F(Trend, ConfigurationsAndMachinesAreSeriesOfTheirOwn) {
  add(RunSpec().on("a"));
  add(RunSpec().on("b"));
  add(RunSpec().on("a").at("2026-03-02T12:00:00Z").in("fp32"));
  EXPECT_EQ(series().size(), 3u);
}

TEST_F(Trend, EverySeriesIsJudgedWhenManyAreFlaggedAtOnce) {
  // Eight machines, each slower on its last night: the series are judged side by side.
  for (int m = 0; m < 8; ++m) {
    const std::string machine = "node" + std::to_string(m);
    for (int day = 1; day <= 5; ++day) {
      add(RunSpec().on(machine).at("2026-03-0" + std::to_string(day) + "T03:00:00Z"));
    }
    add(RunSpec().on(machine).at("2026-03-06T03:00:00Z").stepping(0.11));
  }
  const auto s = series();
  ASSERT_EQ(s.size(), 8u);
  for (const auto& one : s) {
    EXPECT_EQ(one.flag, Flag::regression) << one.machine;
    EXPECT_EQ(one.points.size(), 6u);
  }
}

TEST_F(Trend, TheWindowLimitsHowFarBackTheLatestLooks) {
  // A slow first day, then five steady ones: with a window of five the slow day is out of it.
  add(RunSpec().at("2026-02-28T03:00:00Z").stepping(0.2));
  steady_days();
  TrendOptions three;
  three.window = 3;
  auto t = trend(*history_, {}, three);
  ASSERT_TRUE(t);
  EXPECT_EQ((*t)[0].window, 3);
  EXPECT_EQ((*t)[0].flag, Flag::no_change);
  three.window = 0;
  EXPECT_FALSE(trend(*history_, {}, three));
}

}  // namespace
}  // namespace dlprobe::history
