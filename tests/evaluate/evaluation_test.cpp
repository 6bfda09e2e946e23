// doctor's findings in an evaluation: the missing driver is information when the CPU is evaluated
// by choice or for want of a GPU, and an error when a GPU was asked for.
#include "dlprobe/evaluate/evaluation.h"

#include <gtest/gtest.h>

#include "dlprobe/evaluate/summary.h"

namespace dlprobe::evaluate {
namespace {

doctor::Report driverless(bool gpu_found) {
  doctor::Report r;
  r.gpu_found = gpu_found;
  r.findings.push_back({Severity::error, "no_driver", "no NVIDIA driver is loaded: CUDA cannot run",
                        "install an NVIDIA driver"});
  r.findings.push_back({Severity::info, "no_gpu", "no GPU found", ""});
  return r;
}

bench::Sweep on(DeviceKind kind) {
  bench::Sweep s;
  s.device = device::Device{kind, 0};
  return s;
}

Severity driver_severity(const std::vector<results::Finding>& findings) {
  for (const results::Finding& f : findings) {
    if (f.id == "doctor.no_driver") return f.severity;
  }
  ADD_FAILURE() << "no doctor.no_driver among the findings";
  return Severity::info;
}

TEST(DoctorFindings, MissingDriverIsInformationOnTheCpu) {
  const device::Device cpu{DeviceKind::cpu, 0};
  // Asked for the CPU, whatever the machine has.
  EXPECT_EQ(driver_severity(doctor_findings(driverless(true), on(DeviceKind::cpu), cpu)),
            Severity::info);
  // No GPU at all: the CPU is all there is.
  const auto none = doctor_findings(driverless(false), on(DeviceKind::cpu), std::nullopt);
  EXPECT_EQ(driver_severity(none), Severity::info);
  EXPECT_EQ(none.front().id, "doctor.no_driver");
  EXPECT_NE(none.front().message.find("runs on the CPU"), std::string::npos);
  // The summary counts no error for it.
  const std::string summary =
      evaluation_summary(driverless(false), on(DeviceKind::cpu), {}, none, "folder");
  EXPECT_NE(summary.find("findings  0 errors"), std::string::npos) << summary;
}

TEST(DoctorFindings, MissingDriverIsAnErrorWhenAGpuIsWanted) {
  // A GPU asked for.
  EXPECT_EQ(driver_severity(doctor_findings(driverless(true), on(DeviceKind::cuda),
                                            device::Device{DeviceKind::cuda, 0})),
            Severity::error);
  // A GPU is there, and the evaluation fell back to the CPU because CUDA could not use it.
  const auto fallen = doctor_findings(driverless(true), on(DeviceKind::cpu), std::nullopt);
  EXPECT_EQ(driver_severity(fallen), Severity::error);
  const std::string summary =
      evaluation_summary(driverless(true), on(DeviceKind::cpu), {}, fallen, "folder");
  EXPECT_NE(summary.find("findings  1 errors"), std::string::npos) << summary;
}

TEST(DoctorFindings, OtherErrorsStay) {
  doctor::Report r = driverless(false);
  r.findings.push_back({Severity::error, "ceilings_failed", "failed: out of memory", ""});
  const auto out = doctor_findings(r, on(DeviceKind::cpu), device::Device{DeviceKind::cpu, 0});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].id, "doctor.ceilings_failed");
  EXPECT_EQ(out[2].severity, Severity::error);
}

results::Configuration measured(std::int64_t batch, const std::string& input, double throughput) {
  results::Configuration c;
  c.settings.model = "resnet18";
  c.settings.batch = batch;
  c.settings.device = "cpu";
  c.settings.input = input;
  stats::Summary s;
  s.throughput = throughput;
  s.throughput_ci = {throughput * 0.99, throughput * 1.01};
  s.total_items = 1000;
  c.statistics = s;
  return c;
}

// With --data, each configuration is followed by its run from JPEGs: the best line names the best
// synthetic run and its own JPEG twin, not a faster twin of another batch.
TEST(Summary, TheBestRunSaysWhatItsJpegTwinReached) {
  const std::vector<results::Configuration> runs = {
      measured(8, "", 100), measured(8, "jpeg-cpu", 90), measured(16, "", 120),
      measured(16, "jpeg-cpu", 60)};
  const std::string summary =
      evaluation_summary(driverless(false), on(DeviceKind::cpu), runs, {}, "folder");
  EXPECT_NE(summary.find("bs=16"), std::string::npos) << summary;
  EXPECT_NE(summary.find("from JPEGs (jpeg-cpu) 60.0 img/s = 50.0%"), std::string::npos) << summary;

  // A twin as fast as its run, within the noise, is still said beside it, not picked as the best.
  std::vector<results::Configuration> close = runs;
  close[3] = measured(16, "jpeg-cpu", 123);
  const std::string even =
      evaluation_summary(driverless(false), on(DeviceKind::cpu), close, {}, "folder");
  EXPECT_NE(even.find("bs=16"), std::string::npos) << even;
  EXPECT_NE(even.find(": 120.0 img/s (95%"), std::string::npos) << even;
  EXPECT_NE(even.find("= 102.5%"), std::string::npos) << even;

  // A twin that failed says so; without --data there is no such clause.
  std::vector<results::Configuration> failed = runs;
  failed[3].status = results::RunStatus::failed;
  EXPECT_NE(evaluation_summary(driverless(false), on(DeviceKind::cpu), failed, {}, "folder")
                .find("from JPEGs (jpeg-cpu): failed"),
            std::string::npos);
  const std::vector<results::Configuration> plain = {runs[0], runs[2]};
  EXPECT_EQ(
      evaluation_summary(driverless(false), on(DeviceKind::cpu), plain, {}, "folder").find("JPEG"),
      std::string::npos);
}

// Runs from scratch (the CPU sweep runs each configuration three times): the best line gives the
// interval between them beside the one within the steps.
TEST(Summary, TheBestRunGivesTheSpreadBetweenRuns) {
  std::vector<results::Configuration> runs = {measured(8, "", 100)};
  const std::string one =
      evaluation_summary(driverless(false), on(DeviceKind::cpu), runs, {}, "folder");
  EXPECT_NE(one.find("(95% CI 99.0 - 101.0)"), std::string::npos) << one;
  stats::RunSpread spread;
  spread.runs = 3;
  spread.ci = {80, 120};
  runs[0].run_spread = spread;
  const std::string three =
      evaluation_summary(driverless(false), on(DeviceKind::cpu), runs, {}, "folder");
  EXPECT_NE(three.find("(95% CI 99.0 - 101.0 within the steps; 80.0 - 120.0 between 3 runs)"),
            std::string::npos)
      << three;
}

}  // namespace
}  // namespace dlprobe::evaluate
