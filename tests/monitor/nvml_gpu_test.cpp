// The NVML loader against the real driver: only on a machine with an NVIDIA GPU (label gpu).
#include <gtest/gtest.h>

#include "dlprobe/monitor/nvml.h"
#include "dlprobe/monitor/sampler.h"

namespace dlprobe::nvml {
namespace {

using namespace std::chrono_literals;

TEST(NvmlGpu, RealDriverGivesTheFieldsAHopperHas) {
  auto lib = Library::open();
  ASSERT_TRUE(lib) << lib.status().message();
  EXPECT_TRUE((*lib)->driver_version());
  EXPECT_TRUE((*lib)->cuda_driver_version());
  auto count = (*lib)->device_count();
  ASSERT_TRUE(count) << count.status().message();
  ASSERT_GE(*count, 1U);
  auto info = (*lib)->device_info(0);
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_FALSE(info->name.empty());
  EXPECT_EQ(info->uuid.rfind("GPU-", 0), 0U) << info->uuid;
  EXPECT_FALSE(info->pci_bus_id.empty());
  ASSERT_TRUE(info->memory_total_bytes);
  EXPECT_GT(*info->memory_total_bytes, 1ULL << 30);
  ASSERT_TRUE(info->cc_major);
  ASSERT_TRUE(info->power_limit_w);
  EXPECT_GT(*info->power_limit_w, 50.0);

  auto s = (*lib)->sample(0);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_TRUE(s->gpu_util_pct);
  ASSERT_TRUE(s->mem_used_bytes);
  EXPECT_LE(*s->mem_used_bytes, *info->memory_total_bytes);
  EXPECT_TRUE(s->mem_reserved_bytes) << "nvmlDeviceGetMemoryInfo_v2 not used";
  ASSERT_TRUE(s->power_w);
  EXPECT_GT(*s->power_w, 10.0);
  EXPECT_LT(*s->power_w, 2000.0);
  EXPECT_TRUE(s->temperature_c);
  EXPECT_TRUE(s->sm_clock_mhz);
  EXPECT_TRUE(s->clock_event_reasons);
  if (*info->cc_major >= 7) {
    EXPECT_TRUE(s->energy_mj);
    EXPECT_TRUE((*lib)->energy_counter(0).available) << (*lib)->energy_counter(0).why_not;
  }
  auto processes = (*lib)->processes(0);
  EXPECT_TRUE(processes) << processes.status().message();
}

TEST(NvmlGpu, SamplerEnergyGrowsOnARealGpu) {
  auto lib = Library::open();
  ASSERT_TRUE(lib) << lib.status().message();
  monitor::SamplerOptions options;
  options.gpus = {0};
  options.interval = 50ms;
  options.max_ticks = 21;
  auto sampler = monitor::Sampler::start(*lib, options);
  ASSERT_TRUE(sampler) << sampler.status().message();
  ASSERT_TRUE((*sampler)->wait_for(10s));
  const auto summary = (*sampler)->summary();
  ASSERT_EQ(summary.gpus.size(), 1U);
  ASSERT_TRUE(summary.gpus[0].energy_j);
  // An idle H200 draws ~70 W or more: 1 s of it is tens of joules, never zero or kilojoules.
  EXPECT_GT(*summary.gpus[0].energy_j, 5.0);
  EXPECT_LT(*summary.gpus[0].energy_j, 2000.0);
  EXPECT_LT((*sampler)->overhead().mean_tick, 20ms);
}

}  // namespace
}  // namespace dlprobe::nvml
