// Prices per GPU-hour from the config file: per GPU model, a default, the flag over both, and a
// one-line error naming the file and the JSON path for each bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "common/temp_folder.h"
#include "dlprobe/history/text.h"
#include "dlprobe/history/trend.h"

namespace dlprobe::history {
namespace {

class Price : public ::testing::Test {
 protected:
  std::filesystem::path config(const std::string& text) {
    const auto path = dir_ / "config.json";
    std::ofstream(path) << text;
    return path;
  }
  std::string error_of(const std::string& text) {
    auto p = read_prices(config(text));
    EXPECT_FALSE(p.has_value()) << text;
    return p ? "" : p.status().message();
  }
  dlprobe::testing::TempFolder dir_;
};

TEST_F(Price, PerGpuModelThenTheDefault) {
  auto p = read_prices(config(R"({"price_per_gpu_hour": {"default": 2.5, "NVIDIA H200": 3.9}})"));
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->of("NVIDIA H200"), 3.9);
  EXPECT_EQ(p->of("NVIDIA H100 80GB HBM3"), 2.5);
  p->flat = 1.25;  // --price-per-hour wins over the file
  EXPECT_EQ(p->of("NVIDIA H200"), 1.25);
}

TEST_F(Price, WithoutADefaultOtherModelsHaveNoPrice) {
  auto p = read_prices(config(R"({"price_per_gpu_hour": {"NVIDIA H200": 3.9}})"));
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->of("NVIDIA A100-SXM4-80GB"), std::nullopt);
  EXPECT_TRUE(p->any());
}

TEST_F(Price, AMissingFileOrKeyIsNoPrice) {
  auto none = read_prices(dir_ / "absent.json");
  ASSERT_TRUE(none) << none.status().message();
  EXPECT_FALSE(none->any());
  auto other = read_prices(config(R"({"something_else": 1})"));
  ASSERT_TRUE(other) << other.status().message();
  EXPECT_FALSE(other->any());
}

TEST_F(Price, EachBadInputIsOneLineNamingTheFileAndPath) {
  const std::string f = (dir_ / "config.json").string();
  EXPECT_EQ(error_of("{\"price_per_gpu_hour\": {"), "config " + f + ": not JSON");
  EXPECT_EQ(error_of(""), "config " + f + ": not JSON");
  EXPECT_EQ(error_of("[1, 2]"), "config " + f + ": (top level): expected an object");
  EXPECT_EQ(error_of(R"({"price_per_gpu_hour": 2.5})"),
            "config " + f + ": price_per_gpu_hour: expected an object of GPU models and dollars");
  EXPECT_EQ(error_of(R"({"price_per_gpu_hour": {"NVIDIA H200": "3.9"}})"),
            "config " + f +
                ": price_per_gpu_hour.NVIDIA H200: \"3.9\" is not a price (dollars per GPU-hour, "
                "e.g. 2.49)");
  EXPECT_EQ(
      error_of(R"({"price_per_gpu_hour": {"default": -1}})"),
      "config " + f +
          ": price_per_gpu_hour.default: -1 is not a price (dollars per GPU-hour, e.g. 2.49)");
  EXPECT_EQ(error_of(R"({"price_per_gpu_hour": {"default": 0}})"),
            "config " + f +
                ": price_per_gpu_hour.default: 0 is not a price (dollars per GPU-hour, e.g. 2.49)");
  EXPECT_EQ(error_of(R"({"price_per_gpu_hour": {"default": null}})"),
            "config " + f +
                ": price_per_gpu_hour.default: null is not a price (dollars per GPU-hour, e.g. "
                "2.49)");
}

TEST_F(Price, AFolderIsNoConfigFile) {
  std::filesystem::create_directories(dir_ / "folder.json");
  auto p = read_prices(dir_ / "folder.json");
  ASSERT_FALSE(p);
  EXPECT_EQ(p.status().message(), "config " + (dir_ / "folder.json").string() + ": cannot read it");
}

TEST(PriceText, EachRowIsCostedAtItsGpusPrice) {
  Entry h200;
  h200.id = 1;
  h200.gpu = "NVIDIA H200";
  h200.throughput = 1000;
  Entry h100 = h200;
  h100.id = 2;
  h100.gpu = "NVIDIA H100 80GB HBM3";
  Prices p;
  p.per_gpu["NVIDIA H200"] = 3.6;
  const std::string text = render_list({h200, h100}, p);
  // 1,000 img/s at $3.60 per hour: $1 per million images; the H100 has no price.
  EXPECT_NE(text.find("1.000"), std::string::npos) << text;
  EXPECT_NE(text.find("cost per GPU-hour: $3.6 on NVIDIA H200, none on NVIDIA H100 80GB HBM3; "),
            std::string::npos)
      << text;
  EXPECT_EQ(render_list({h200}, Prices{}).find("$"), std::string::npos);
  // The same throughput on two GPUs costs twice as much.
  Entry pair = h200;
  pair.gpus = 2;
  EXPECT_NE(render_list({pair}, p).find("2.000"), std::string::npos) << render_list({pair}, p);
}

// A machine name with a terminal's escape sequence and a newline (a results file edited by hand)
// is listed with them shown, never sent: no row is forged and the terminal is left as it was.
TEST(HistoryText, ControlCharactersAreShownNotSent) {
  Entry e;
  e.id = 1;
  e.machine = "evil\x1b]0;pwned\x07\nFAKE ROW";
  e.throughput = 1000;
  const std::string text = render_list({e}, Prices{});
  EXPECT_NE(text.find("evil\\x1b]0;pwned\\x07\\nFAKE ROW"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;  // the header and the row
  const std::string changes =
      render_changes({{.what = "machine", .before = "a", .after = "b\x1b[2J"}});
  EXPECT_NE(changes.find("a -> b\\x1b[2J"), std::string::npos) << changes;
}

}  // namespace
}  // namespace dlprobe::history
