// Throughput in the forms scripts print on their own, read from captured output (tests/run/data).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dlprobe/run/workload_output.h"

namespace dlprobe::run {
namespace {

using Kind = PrintedFigure::Kind;

struct Expected {
  Kind kind;
  double value;
  bool summary;
  std::string_view format;
};

std::vector<PrintedFigure> figures_in(const std::string& name) {
  std::ifstream in(std::string(DLPROBE_RUN_TEST_DATA) + "/" + name);
  EXPECT_TRUE(in) << name;
  std::vector<PrintedFigure> out;
  std::string line;
  while (std::getline(in, line)) {
    if (auto f = match_printed_figure(line)) out.push_back(*f);
  }
  return out;
}

void expect_figures(const std::string& name, const std::vector<Expected>& expected) {
  const auto got = figures_in(name);
  ASSERT_EQ(got.size(), expected.size()) << name;
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(name + " figure " + std::to_string(i));
    EXPECT_EQ(got[i].kind, expected[i].kind);
    EXPECT_NEAR(got[i].value, expected[i].value, 1e-9);
    EXPECT_EQ(got[i].summary, expected[i].summary);
    EXPECT_EQ(got[i].format, expected[i].format);
  }
}

TEST(PrintedFigure, SeedScript) {
  expect_figures("seed_tf.txt", {{Kind::items_per_s, 1234.56, true, "throughput"},
                                 {Kind::step_time_s, 0.1037, true, "average_step_time"},
                                 {Kind::batch, 128, false, "batch_size"}});
}

// The unit read with or without a space before it: "103.7 ms" is not 103.7 s.
TEST(PrintedFigure, AverageStepTimeUnits) {
  for (const auto& [line, seconds] :
       std::vector<std::pair<std::string, double>>{{"Average Step Time: 103.7ms", 0.1037},
                                                   {"Average Step Time: 103.7 ms", 0.1037},
                                                   {"Average Step Time: 0.1037 s", 0.1037},
                                                   {"Average Step Time: 0.1037s", 0.1037}}) {
    const auto f = match_printed_figure(line);
    ASSERT_TRUE(f) << line;
    EXPECT_EQ(f->kind, Kind::step_time_s) << line;
    EXPECT_NEAR(f->value, seconds, 1e-12) << line;
  }
}

TEST(PrintedFigure, KerasFitProgress) {
  expect_figures("keras_fit.txt", {{Kind::step_time_s, 0.152, false, "keras"},
                                   {Kind::step_time_s, 0.148, false, "keras"},
                                   {Kind::step_time_s, 0.146, false, "keras"}});
}

TEST(PrintedFigure, TfCnnBenchmarks) {
  expect_figures("tf_cnn_benchmarks.txt",
                 {{Kind::batch, 256, false, "batch_size"},
                  {Kind::items_per_s, 2398.1, false, "tf_cnn_benchmarks"},
                  {Kind::items_per_s, 2405.3, false, "tf_cnn_benchmarks"},
                  {Kind::items_per_s, 2404.9, false, "tf_cnn_benchmarks"},
                  {Kind::items_per_s, 2403.8, false, "tf_cnn_benchmarks"},
                  {Kind::items_per_s, 2403.31, true, "tf_cnn_benchmarks"}});
}

TEST(PrintedFigure, HuggingFaceTrainer) {
  expect_figures("hf_trainer.txt", {{Kind::items_per_s, 104.516, true, "hf_trainer"},
                                    {Kind::items_per_s, 104.516, true, "hf_trainer"}});
}

TEST(PrintedFigure, TqdmAndLightning) {
  expect_figures("tqdm_lightning.txt", {{Kind::steps_per_s, 1.98, false, "tqdm"},
                                        {Kind::steps_per_s, 2.89, false, "tqdm"},
                                        {Kind::steps_per_s, 3.21, false, "tqdm"},
                                        {Kind::step_time_s, 1.27, false, "tqdm"}});
}

TEST(PrintedFigure, InvalidValuesAreReturnedForTheCallerToRefuse) {
  const auto got = figures_in("invalid_throughput.txt");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(std::isnan(got[0].value));
  EXPECT_DOUBLE_EQ(got[1].value, -12.5);
  EXPECT_TRUE(std::isinf(got[2].value));
}

TEST(PrintedFigure, OrdinaryLinesAreNot) {
  for (std::string_view line :
       {"Epoch 1/3", "Throughput: see the table below", "loss: 6.91 - accuracy: 0.001",
        "Step\tImg/sec\ttotal_loss", "Instantaneous batch size per device = 64",
        "downloaded 12 MB at 3 MB/s", "it/s", "s/step", "Throughput: 12 items"}) {
    EXPECT_FALSE(match_printed_figure(line)) << line;
  }
}

TEST(PrintedFigure, HugeLinesInLinearTime) {
  // A megabyte of digits and near-misses: every form is looked for once, so this is quick even
  // under the sanitizers.
  std::string line(1 << 20, '7');
  for (std::size_t i = 0; i + 8 < line.size(); i += 4096) line.replace(i, 8, "batch si");
  line += " 12.5it/s";
  const auto f = match_printed_figure(line);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->format, "tqdm");
  EXPECT_DOUBLE_EQ(f->value, 12.5);
}

}  // namespace
}  // namespace dlprobe::run
