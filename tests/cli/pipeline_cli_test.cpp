// dlprobe pipeline and pipeline make-dataset as a user runs them: the binary, its exit code, stdout
// and stderr, and the JSON file.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/run_dlprobe.h"
#include "common/temp_folder.h"

namespace dlprobe {
namespace {

using testing::error_lines;
using testing::quote;
using testing::slurp;

testing::ProcessResult run(const std::string& args) {
  return testing::run_dlprobe(testing::split_args("pipeline " + args));
}

void expect_error(const std::string& args, const std::string& needle) {
  const testing::ProcessResult r = run(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

class PipelineCli : public ::testing::Test {
 protected:
  // A dataset of 8 images in 2 classes, made once per test.
  void SetUp() override {
    data_ = (dir_ / "data").string();
    const auto r = testing::run_dlprobe(
        testing::split_args("pipeline make-dataset " + quote(data_) + " --images 8 --classes 2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.out.find("8 images in 2 classes"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("bytes/pixel"), std::string::npos) << r.out;
  }

  testing::TempFolder dir_;
  std::string data_;
};

TEST_F(PipelineCli, MeasuresTheCurveAndWritesJson) {
  const std::string json = (dir_ / "out.json").string();
  const auto r = run(quote(data_) +
                     " --threads 1,2 --min-time 20ms --batch 4 --size 32 --step-rate 5000 --json " +
                     quote(json));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("decode+augment"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("8 images, 2 classes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("read once before timing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("feeding 5,000 img/s takes"), std::string::npos) << r.out;
  const auto doc = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(doc["schema"], "dlprobe.pipeline/1");
  EXPECT_EQ(doc["dataset"]["images"], 8);
  EXPECT_EQ(doc["dataset"]["classes"], 2);
  EXPECT_EQ(doc["dataset"]["page_cache_warmed"], true);
  ASSERT_EQ(doc["points"].size(), 4u);
  EXPECT_EQ(doc["points"][0]["stage"], "decode");
  EXPECT_EQ(doc["points"][3]["stage"], "decode+augment");
  EXPECT_EQ(doc["points"][3]["threads"], 2);
  for (const auto& p : doc["points"]) {
    EXPECT_GT(p["images_per_second"].get<double>(), 0) << p;
    EXPECT_GT(p["bytes_read_per_second"].get<double>(), 0) << p;
  }
  EXPECT_GT(doc["cores_needed"]["cores"].get<double>(), 0);
  EXPECT_EQ(doc["skipped"].size(), 0u);
  // An earlier file is not replaced unasked, before any work.
  expect_error(quote(data_) + " --json " + quote(json), "--json: " + json);
}

// Ctrl-C: the point being measured finishes, no other starts, and the points measured are printed
// and written (they had all been lost).
TEST_F(PipelineCli, InterruptedKeepsThePointsMeasured) {
  const std::string json = (dir_ / "cut.json").string();
  testing::ProcessOptions options;
  options.interrupt_after = std::chrono::milliseconds(2000);
  const auto r = testing::run_dlprobe(
      testing::split_args("pipeline " + quote(data_) +
                          " --threads 1,2 --min-time 5s --batch 4 --size 32 --json " + quote(json)),
      options);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dlprobe pipeline: interrupted; the points measured are above"),
            std::string::npos)
      << r.output;
  const auto doc = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(doc["interrupted"], true);
  ASSERT_EQ(doc["points"].size(), 1u);
  EXPECT_GT(doc["points"][0]["images_per_second"].get<double>(), 0);
}

TEST_F(PipelineCli, BadFilesAreListedOrStrictlyAnError) {
  const std::string bad = (std::filesystem::path(data_) / "class_0001/zz_bad.jpg").string();
  std::ofstream(bad) << "not a jpeg";
  const auto r = run(quote(data_) + " --threads 1 --stages augment --min-time 10ms --size 32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("skipped 1 file(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(bad + ": not a JPEG file"), std::string::npos) << r.out;
  expect_error(quote(data_) + " --threads 1 --min-time 10ms --size 32 --strict", bad);
}

// A dataset none of whose files decodes: the points measured (0 img/s) are printed and written,
// and the run fails with one line naming the stage and a file.
TEST_F(PipelineCli, ADatasetWithNoImageFailsAfterKeepingWhatItMeasured) {
  const std::filesystem::path only = dir_ / "bad" / "class_0000";
  std::filesystem::create_directories(only);
  std::ofstream(only / "a.jpg") << "not a jpeg";
  std::ofstream(only / "b.jpg") << "";
  const std::string json = (dir_ / "bad.json").string();
  const auto r =
      run(quote((dir_ / "bad").string()) +
          " --threads 1 --stages decode --min-time 10ms --size 32 --json " + quote(json));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.err.find("decode gave no image (2 file(s) skipped; the first, "), std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("skipped 2 file(s)"), std::string::npos) << r.out;
  const auto doc = nlohmann::json::parse(slurp(json));
  ASSERT_EQ(doc["points"].size(), 1u);
  EXPECT_EQ(doc["points"][0]["images_per_second"].get<double>(), 0);
}

TEST_F(PipelineCli, RefusesBadInputWithOneLine) {
  expect_error(quote((dir_ / "missing").string()), (dir_ / "missing").string());
  expect_error("", "name the dataset folder");
  expect_error(quote(data_) + " --dtype fp8", "--dtype: unknown sample type 'fp8'");
  expect_error(quote(data_) + " --layout chwn", "--layout: unknown layout 'chwn'");
  expect_error(quote(data_) + " --stages resize", "--stages: unknown stage 'resize'");
  expect_error(quote(data_) + " --threads 0", "--threads");
  expect_error(quote(data_) + " --threads 1,2,1", "--threads: '1' is given twice");
  expect_error(quote(data_) + " --threads 01,1", "--threads: '01' and '1' are the same");
  expect_error(quote(data_) + " --stages decode,decode", "--stages: 'decode' is given twice");
  expect_error(quote(data_) + " --min-time 5", "--min-time");
  expect_error("make-dataset " + quote(data_), data_ + ": not empty");
  expect_error("make-dataset " + quote((dir_ / "x").string()) + " --images 0", "--images");
  expect_error("make-dataset " + quote((dir_ / "x").string()) + " --images 3 --classes 5",
               "--classes: 5 is more than --images 3 (each class holds at least one image)");
  expect_error(quote(data_) + " --device tpu:0", "--device: unknown device 'tpu:0'");
  expect_error(quote(data_) + " --cuda-decoder", "--cuda-decoder: only with --device cuda:N");
  expect_error(quote(data_) + " --device cuda:0 --decode cpu --cuda-decoder",
               "--cuda-decoder: only with --device cuda:N, decoding on the GPU");
  expect_error(quote(data_) + " --decode gpu", "--decode gpu: needs --device cuda:N");
  expect_error(quote(data_) + " --gpu-pixels ycbcr",
               "--gpu-pixels ycbcr: only when the images are decoded on the GPU (--device cuda:N "
               "with --decode gpu or auto)");
  expect_error(quote(data_) + " --device cuda:0 --decode cpu --gpu-pixels ycbcr",
               "--gpu-pixels ycbcr: only when the images are decoded on the GPU (--device cuda:N "
               "with --decode gpu or auto)");
  expect_error(quote(data_) + " --gpu-pixels nv12", "--gpu-pixels: unknown choice 'nv12'");
  expect_error(quote(data_) + " --decode fpga", "--decode: unknown choice 'fpga'");
  expect_error(quote(data_) + " --device cuda:0 --decode cpu --stages decode",
               "sending batches to the device needs the augment stage");
  expect_error(quote(data_) + " --device cuda:0 --stages read", "the read stage has no GPU form");
  expect_error(quote(data_) + " --device cuda:0 --cache 1GiB", "for the host path only");
}

// Here (no GPU, or no CUDA in the build) the host path's copy to a device is refused with what is
// missing, before any point is measured.
TEST_F(PipelineCli, CopyToADeviceWithoutAGpuIsOneLine) {
  const testing::ProcessResult r =
      run(quote(data_) + " --device cuda:0 --decode cpu --min-time 10ms");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("CUDA"), std::string::npos) << r.output;
  EXPECT_EQ(r.out.find("decode+augment"), std::string::npos) << "no point measured: " << r.out;
}

// Here (no GPU, no nvJPEG; or no CUDA in the build) the GPU path is refused with what is missing.
TEST_F(PipelineCli, GpuPathWithoutAGpuIsOneLine) {
  const testing::ProcessResult r = run(quote(data_) + " --device cuda:0 --min-time 10ms");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  EXPECT_TRUE(r.output.find("nvJPEG is not available") != std::string::npos ||
              r.output.find("built without CUDA") != std::string::npos ||
              r.output.find("CUDA device") != std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace dlprobe
