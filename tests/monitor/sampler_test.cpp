// The sampler against the fake NVML, and its statistics over hand-made rounds.
#include <gtest/gtest.h>

#include <atomic>

#include "dlprobe/monitor/sampler.h"
#include "fake_script.h"

namespace dlprobe::monitor {
namespace {

using namespace std::chrono_literals;
using dlprobe::testing::FakeScript;
using dlprobe::testing::kH200Script;

std::shared_ptr<nvml::Library> open_fake(const char* path = DLPROBE_FAKE_NVML) {
  auto lib = nvml::Library::open(path);
  EXPECT_TRUE(lib.has_value()) << lib.status().message();
  return lib.has_value() ? *lib : nullptr;
}

std::unique_ptr<Sampler> run_to_end(std::shared_ptr<nvml::Library> lib, SamplerOptions options) {
  auto sampler = Sampler::start(std::move(lib), std::move(options));
  EXPECT_TRUE(sampler.has_value()) << sampler.status().message();
  if (!sampler) return nullptr;
  EXPECT_TRUE((*sampler)->wait_for(10s));
  return std::move(sampler).value();
}

Tick tick_at(std::int64_t t_ns, std::optional<double> power_w,
             std::optional<std::uint64_t> energy_mj, std::optional<unsigned> util) {
  Tick t;
  t.timestamp_ns = t_ns;
  GpuReading& r = t.gpus.emplace_back();
  r.sample.timestamp_ns = t_ns;
  r.sample.power_w = power_w;
  r.sample.energy_mj = energy_mj;
  r.sample.gpu_util_pct = util;
  return t;
}

TEST(Summarize, MinMedianMaxSkippingUnavailable) {
  const std::vector<Tick> ticks = {tick_at(0, 100, {}, 10), tick_at(1'000'000'000, 300, {}, {}),
                                   tick_at(2'000'000'000, 200, {}, 90),
                                   tick_at(3'000'000'000, 200, {}, 40)};
  const Summary s = summarize(ticks);
  EXPECT_EQ(s.ticks, 4U);
  EXPECT_EQ(s.first_ns, 0);
  EXPECT_EQ(s.last_ns, 3'000'000'000);
  ASSERT_EQ(s.gpus.size(), 1U);
  const auto& util = s.gpus[0].column(Column::gpu_util_pct);
  ASSERT_TRUE(util);
  EXPECT_EQ(util->count, 3U);  // the missing value is not a zero
  EXPECT_EQ(util->min, 10);
  EXPECT_EQ(util->median, 40);
  EXPECT_EQ(util->max, 90);
  const auto& power = s.gpus[0].column(Column::power_w);
  ASSERT_TRUE(power);
  EXPECT_EQ(power->median, 200);  // even count: mean of the middle two (200, 200)
  EXPECT_FALSE(s.gpus[0].column(Column::temperature_c));
  // No counter: trapezoids, (100+300)/2 + (300+200)/2 + (200+200)/2 J over 1 s steps.
  EXPECT_EQ(s.gpus[0].energy_source, EnergySource::power_integral);
  EXPECT_DOUBLE_EQ(*s.gpus[0].energy_j, 200.0 + 250.0 + 200.0);
}

TEST(Summarize, EnergyPrefersTheCounter) {
  const std::vector<Tick> ticks = {tick_at(0, 100, 5'000, 1), tick_at(1'000'000'000, 100, {}, 1),
                                   tick_at(2'000'000'000, 100, 12'500, 1)};
  const Summary s = summarize(ticks);
  EXPECT_EQ(s.gpus[0].energy_source, EnergySource::counter);
  EXPECT_DOUBLE_EQ(*s.gpus[0].energy_j, 7.5);
  const Summary one = summarize({tick_at(0, {}, {}, 1)});
  EXPECT_FALSE(one.gpus[0].energy_j);
  EXPECT_EQ(one.gpus[0].energy_source, EnergySource::none);
  EXPECT_EQ(summarize({}).ticks, 0U);
}

TEST(Sampler, StatisticsOverScriptedSamples) {
  FakeScript script(kH200Script);
  std::atomic<int> sunk{0};
  SamplerOptions options;
  options.interval = 10ms;
  options.max_ticks = 3;
  options.energy_interval = std::chrono::nanoseconds(0);  // the counter every round
  options.sink = [&](const Tick& t) { EXPECT_EQ(t.index, static_cast<std::uint64_t>(sunk++)); };
  auto sampler = run_to_end(open_fake(), options);
  ASSERT_TRUE(sampler);
  EXPECT_TRUE(sampler->status().is_ok());
  EXPECT_EQ(sunk.load(), 3);
  const Summary s = sampler->summary();
  ASSERT_EQ(s.ticks, 3U);
  ASSERT_EQ(s.gpus.size(), 1U);
  const GpuSummary& g = s.gpus[0];
  EXPECT_EQ(g.column(Column::gpu_util_pct)->min, 10);
  EXPECT_EQ(g.column(Column::gpu_util_pct)->median, 50);
  EXPECT_EQ(g.column(Column::gpu_util_pct)->max, 90);
  EXPECT_EQ(g.column(Column::power_w)->median, 200);
  EXPECT_EQ(g.column(Column::mem_used_mib)->max, 3072);
  EXPECT_EQ(g.column(Column::sm_clock_mhz)->min, 1755);
  EXPECT_FALSE(g.column(Column::pcie_rx_kbps));  // not asked for
  EXPECT_EQ(g.energy_source, EnergySource::counter);
  EXPECT_DOUBLE_EQ(*g.energy_j, 50.0);

  const auto ticks = sampler->window(s.first_ns, s.last_ns);
  ASSERT_EQ(ticks.size(), 3U);
  EXPECT_DOUBLE_EQ(*ticks[0].gpus[0].energy_since_start_j, 0.0);
  EXPECT_DOUBLE_EQ(*ticks[1].gpus[0].energy_since_start_j, 30.0);
  EXPECT_DOUBLE_EQ(*ticks[2].gpus[0].energy_since_start_j, 50.0);
  // A window around the middle round only.
  EXPECT_EQ(sampler->summary(ticks[1].timestamp_ns, ticks[1].timestamp_ns).ticks, 1U);
  // Rounds follow the 10 ms schedule (wake-up jitter aside), not back to back.
  EXPECT_GE(ticks[2].timestamp_ns - ticks[0].timestamp_ns, 15'000'000);

  const Overhead o = sampler->overhead();
  EXPECT_EQ(o.ticks, 3U);
  EXPECT_GT(o.mean_tick.count(), 0);
  EXPECT_GE(o.max_tick, o.mean_tick);
  EXPECT_GT(o.thread_cpu.count(), 0);
  EXPECT_GE(o.wall, 20ms);
}

TEST(Sampler, EnergyFromPowerWithoutCounter) {
  FakeScript script(kH200Script);
  SamplerOptions options;
  options.interval = 10ms;
  options.max_ticks = 3;
  auto sampler = run_to_end(open_fake(DLPROBE_FAKE_NVML_LEGACY), options);
  ASSERT_TRUE(sampler);
  const auto ticks = sampler->window(0, INT64_MAX);
  ASSERT_EQ(ticks.size(), 3U);
  auto seconds = [&](int a, int b) {
    return static_cast<double>(ticks[b].gpus[0].sample.timestamp_ns -
                               ticks[a].gpus[0].sample.timestamp_ns) /
           1e9;
  };
  const double expected = 200.0 * seconds(0, 1) + 250.0 * seconds(1, 2);
  EXPECT_DOUBLE_EQ(*ticks[2].gpus[0].energy_since_start_j, expected);
  const Summary s = sampler->summary();
  EXPECT_FALSE(ticks[2].gpus[0].energy_from_counter);
  EXPECT_EQ(s.gpus[0].energy_source, EnergySource::power_integral);
  EXPECT_DOUBLE_EQ(*s.gpus[0].energy_j, expected);
}

TEST(Sampler, SlowEnergyCounterIsReadOnlyEveryEnergyInterval) {
  FakeScript script(kH200Script);
  SamplerOptions options;
  options.interval = 10ms;
  options.max_ticks = 3;
  options.energy_interval = 1h;
  auto sampler = run_to_end(open_fake(), options);
  ASSERT_TRUE(sampler);
  const auto ticks = sampler->window(0, INT64_MAX);
  ASSERT_EQ(ticks.size(), 3U);
  EXPECT_EQ(ticks[0].gpus[0].sample.energy_mj, 1000000ULL);
  EXPECT_FALSE(ticks[1].gpus[0].sample.energy_mj);  // not asked for, so not a reading of 0
  EXPECT_FALSE(ticks[2].gpus[0].sample.energy_mj);
  // Counter at the first round, power (100, 300, 200 W) integrated after it.
  auto seconds = [&](int a, int b) {
    return static_cast<double>(ticks[b].gpus[0].sample.timestamp_ns -
                               ticks[a].gpus[0].sample.timestamp_ns) /
           1e9;
  };
  const double expected = 200.0 * seconds(0, 1) + 250.0 * seconds(1, 2);
  EXPECT_DOUBLE_EQ(*ticks[2].gpus[0].energy_since_start_j, expected);
  // Read and taken at the first round only.
  EXPECT_TRUE(ticks[0].gpus[0].energy_from_counter);
  EXPECT_FALSE(ticks[2].gpus[0].energy_from_counter);
  // The counter read once, at the start: the summary's energy is the power's, and says so.
  const Summary s = sampler->summary();
  EXPECT_EQ(s.gpus[0].energy_source, EnergySource::power_integral);
  EXPECT_DOUBLE_EQ(*s.gpus[0].energy_j, expected);
}

// Power's estimate between two counter readings may run ahead of the counter (here 200 W against
// a counter that barely moves); the energy since start never falls at the next reading, since
// Prometheus reads a counter that falls as a reset.
TEST(Sampler, EnergySinceStartNeverFalls) {
  std::string text(kH200Script);
  const auto replace_line = [&](std::string_view key, std::string_view line) {
    const std::size_t at = text.find(std::string(key) + " ");
    ASSERT_NE(at, std::string::npos) << key;
    text.replace(at, text.find('\n', at) - at, line);
  };
  replace_line("power_mw", "power_mw 200000");
  replace_line("energy_mj", "energy_mj 1000000 1000001 1000002 1000003");
  FakeScript script(text);
  SamplerOptions options;
  options.interval = 10ms;
  options.max_ticks = 9;
  options.energy_interval = 25ms;
  auto sampler = run_to_end(open_fake(), options);
  ASSERT_TRUE(sampler);
  const auto ticks = sampler->window(0, INT64_MAX);
  ASSERT_EQ(ticks.size(), 9U);
  int counter_reads = 0;
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    if (ticks[i].gpus[0].sample.energy_mj) ++counter_reads;
    if (i == 0) continue;
    ASSERT_TRUE(ticks[i].gpus[0].energy_since_start_j && ticks[i - 1].gpus[0].energy_since_start_j);
    EXPECT_GE(*ticks[i].gpus[0].energy_since_start_j, *ticks[i - 1].gpus[0].energy_since_start_j)
        << "round " << i;
  }
  EXPECT_GE(counter_reads, 2);  // the counter was read again within the rounds
}

TEST(Sampler, RingIsBounded) {
  FakeScript script(kH200Script);
  SamplerOptions options;
  options.interval = 10ms;
  options.max_ticks = 8;
  options.ring_capacity = 3;
  auto sampler = run_to_end(open_fake(), options);
  ASSERT_TRUE(sampler);
  const auto ticks = sampler->window(0, INT64_MAX);
  ASSERT_EQ(ticks.size(), 3U);
  EXPECT_EQ(ticks[0].index, 5U);
  EXPECT_EQ(ticks[2].index, 7U);
  EXPECT_EQ(sampler->latest()->index, 7U);
  EXPECT_TRUE(sampler->wrapped());
  EXPECT_EQ(sampler->overhead().ticks, 8U);
}

TEST(Sampler, ProcessRowsCarryTheLatestUtilisation) {
  FakeScript script(kH200Script);
  SamplerOptions options;
  options.interval = 10ms;
  options.max_ticks = 2;
  options.processes = true;
  auto sampler = run_to_end(open_fake(), options);
  ASSERT_TRUE(sampler);
  const auto ticks = sampler->window(0, INT64_MAX);
  ASSERT_EQ(ticks.size(), 2U);
  for (const Tick& t : ticks) {
    const auto& rows = t.gpus[0].processes;
    ASSERT_EQ(rows.size(), 2U);
    EXPECT_EQ(rows[0].pid, 4242U);
    EXPECT_EQ(rows[0].used_bytes, 1073741824ULL);
    EXPECT_EQ(rows[0].sm_util_pct, 77U);  // the second round gets no new NVML sample
    EXPECT_EQ(rows[1].pid, 4343U);
    EXPECT_FALSE(rows[1].used_bytes);
    EXPECT_FALSE(rows[1].sm_util_pct);
  }
}

TEST(Sampler, StopsCleanlyWhenAsked) {
  FakeScript script(kH200Script);
  SamplerOptions options;
  options.interval = 10ms;
  auto sampler = Sampler::start(open_fake(), options);
  ASSERT_TRUE(sampler) << sampler.status().message();
  EXPECT_FALSE((*sampler)->wait_for(30ms));
  (*sampler)->stop();
  EXPECT_TRUE((*sampler)->wait_for(0ms));
  EXPECT_GE((*sampler)->overhead().ticks, 1U);
  EXPECT_TRUE((*sampler)->status().is_ok());
}

TEST(Sampler, LostGpuEndsSamplingWithTheError) {
  FakeScript script("device\ngpu_util 1\nmem_util 1\nfail nvmlDeviceGetPowerUsage 15\n");
  auto sampler = run_to_end(open_fake(), SamplerOptions{});
  ASSERT_TRUE(sampler);
  EXPECT_FALSE(sampler->status().is_ok());
  EXPECT_NE(sampler->status().message().find("GPU is lost"), std::string::npos);
  EXPECT_EQ(sampler->overhead().ticks, 0U);
}

TEST(Sampler, RejectsBadOptions) {
  FakeScript script(kH200Script);
  auto lib = open_fake();
  SamplerOptions fast;
  fast.interval = 5ms;
  auto a = Sampler::start(lib, fast);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.status().code(), Errc::invalid_argument);
  SamplerOptions missing;
  missing.gpus = {0, 3};
  auto b = Sampler::start(lib, missing);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.status().message(), "GPU 3 does not exist (NVML sees 1 GPU)");
}

}  // namespace
}  // namespace dlprobe::monitor
