// `dlprobe run` against the real driver: the GPU memory of a child that holds 1 GiB must be
// attributed to the workload's process tree. Run on a GPU machine with `ctest -L gpu`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "dlprobe/run/runner.h"

namespace dlprobe::run {
namespace {

// Where it was built, or, in the GPU bundle (scripts/gpu-bundle.sh), beside the bundled libraries
// on LD_LIBRARY_PATH.
std::string gpu_workload() {
  if (std::filesystem::exists(DLPROBE_GPU_WORKLOAD)) return DLPROBE_GPU_WORKLOAD;
  std::stringstream dirs(std::getenv("LD_LIBRARY_PATH") ? std::getenv("LD_LIBRARY_PATH") : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const auto candidate = std::filesystem::path(dir) / "dlprobe_gpu_workload";
    if (std::filesystem::exists(candidate)) return candidate.string();
  }
  return DLPROBE_GPU_WORKLOAD;
}

TEST(RunGpu, AttributesAChildsMemory) {
  auto nvml = nvml::Library::open();
  ASSERT_TRUE(nvml) << nvml.status().message();
  RunOptions o;
  o.argv = {gpu_workload(), "1024", "20"};
  o.echo = false;
  o.nvml = *nvml;
  o.gpus = {0};
  o.interval = std::chrono::milliseconds(50);
  o.env_set["CUDA_VISIBLE_DEVICES"] = "0";
  auto r = run_workload(o);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->outcome, Outcome::ok);
  EXPECT_TRUE(r->gpu.telemetry) << r->gpu.telemetry_note;
  EXPECT_EQ(r->gpu.attribution, Attribution::process_tree);
  ASSERT_TRUE(r->gpu.peak_bytes);
  // 1 GiB allocated plus the CUDA context (a few hundred MiB).
  EXPECT_GE(*r->gpu.peak_bytes, 1ull << 30);
  EXPECT_LT(*r->gpu.peak_bytes, 4ull << 30);
  EXPECT_EQ(r->gpu.gpus_used, std::vector<unsigned>{0});
  EXPECT_TRUE(r->gpu.device_total_bytes);
  EXPECT_EQ(r->steps.steps_seen, 20);
}

}  // namespace
}  // namespace dlprobe::run
