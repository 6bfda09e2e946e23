// The history at 10,000 results (100 configurations, 2 machines, 100 nights, 200 steps each):
// listing everything, listing with filters, and the trend of every configuration with its
// regression test, each with its text as `dlprobe history` prints it. Targets: list and filter
// within 200 ms, the trend within 2 s. Filling the database (10,000 transactions) is timed once,
// as BM_Fill, which the others need first (they run in this order). The trend judges its series on
// every core: its CPU time is the process's, all threads together.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <utility>

#include "dlprobe/history/history.h"
#include "dlprobe/history/text.h"
#include "dlprobe/history/trend.h"
#include "dlprobe/stats/statistics.h"

namespace {

using namespace dlprobe;

constexpr int kNights = 100;
constexpr int kSteps = 200;

results::Document night(int machine, int day, int configuration) {
  results::Document d;
  d.context.dlprobe_version = "0.1.0";
  d.context.date = fmt::format("2026-{:02d}-{:02d}T03:00:00Z", 1 + day / 28, 1 + day % 28);
  d.context.hostname = fmt::format("node{}", machine);
  // The last night a new driver makes every configuration 5% slower: the trend's worst case, every
  // series flagged, its step times read and tested.
  const bool last = day == kNights - 1;
  d.context.driver_version = last ? "590.10" : "580.65.06";
  d.context.cuda_runtime_version = "13.0";
  d.context.libraries = {{"cuDNN", "9.19.0", ""}, {"cuBLAS", "13.0.0", ""}};
  results::Gpu g;
  g.name = machine == 0 ? "NVIDIA H200" : "NVIDIA H100 80GB HBM3";
  d.context.gpus.push_back(g);
  // Three step-time patterns (the night of the cycle) per configuration; their statistics, a
  // bootstrap each, are computed once, so that BM_Fill times the history and not the generator.
  static std::map<std::pair<int, int>, results::Configuration> made;
  auto [it, fresh] = made.try_emplace({configuration, last ? 3 : day % 3});
  results::Configuration& c = it->second;
  if (fresh) {
    c.settings.model = configuration % 2 == 0 ? "resnet50" : "resnet18";
    c.settings.batch = 32 << (configuration / 2 % 5);
    c.settings.precision = configuration / 10 % 2 == 0 ? "bf16" : "fp32";
    c.settings.mode = "train";
    c.settings.layout = "nhwc";
    c.settings.device = "cuda:0";
    c.settings.optimizer = "sgd";
    c.settings.image_size = 224 - 32 * (configuration / 20);
    for (int i = 0; i < kSteps; ++i) {
      c.samples.step_seconds.push_back(0.1 * (last ? 1.05 : 1 + 0.002 * (day % 3)) *
                                       (1 + 0.001 * (i % 7)));
      c.samples.step_items.push_back(static_cast<double>(c.settings.batch));
    }
    c.statistics = stats::summarize(c.samples.step_seconds, c.samples.step_items).value();
  }
  d.configurations.push_back(c);
  return d;
}

const std::filesystem::path& database() {
  static const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                            fmt::format("dlprobe-history-bench-{}", getpid()) /
                                            "history.sqlite";
  return path;
}

// 10,000 rows, each added in a transaction of its own as the measuring commands add them.
void BM_Fill(benchmark::State& state) {
  for (auto _ : state) {
    std::filesystem::remove_all(database().parent_path());
    auto h = history::History::open(database()).value();
    for (int day = 0; day < kNights; ++day) {
      for (int machine = 0; machine < 2; ++machine) {
        for (int c = 0; c < 50; ++c) benchmark::DoNotOptimize(h.add(night(machine, day, c)));
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * kNights * 100);
}
BENCHMARK(BM_Fill)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_ListAll(benchmark::State& state) {
  auto h = history::History::open(database()).value();
  for (auto _ : state) {
    auto rows = h.list().value();
    benchmark::DoNotOptimize(history::render_list(rows, history::Prices{2.5, {}, {}}));
    state.counters["rows"] = static_cast<double>(rows.size());
  }
}
BENCHMARK(BM_ListAll)->Unit(benchmark::kMillisecond);

void BM_ListFiltered(benchmark::State& state) {
  auto h = history::History::open(database()).value();
  history::Filter f;
  f.gpu = "h200";
  f.model = "resnet50";
  f.precision = "bf16";
  f.since = "2026-02-01";
  for (auto _ : state) {
    auto rows = h.list(f).value();
    benchmark::DoNotOptimize(history::render_list(rows, history::Prices{2.5, {}, {}}));
    state.counters["rows"] = static_cast<double>(rows.size());
  }
}
BENCHMARK(BM_ListFiltered)->Unit(benchmark::kMillisecond);

// Up to the night before the new driver: every series steady, decided on its rows alone.
void BM_TrendSteady(benchmark::State& state) {
  auto h = history::History::open(database()).value();
  history::Filter before;
  before.until = "2026-04-15";
  for (auto _ : state) {
    auto series = history::trend(h, before).value();
    benchmark::DoNotOptimize(history::render_trend(series, history::Prices{2.5, {}, {}}));
    state.counters["series"] = static_cast<double>(series.size());
    state.counters["flagged"] = history::any_regression(series) ? 1 : 0;
  }
}
BENCHMARK(BM_TrendSteady)->MeasureProcessCPUTime()->UseRealTime()->Unit(benchmark::kMillisecond);

// Every night: all 100 series flagged a regression, each tested on its step times.
void BM_TrendAllRegressed(benchmark::State& state) {
  auto h = history::History::open(database()).value();
  for (auto _ : state) {
    auto series = history::trend(h, {}).value();
    benchmark::DoNotOptimize(history::render_trend(series, history::Prices{2.5, {}, {}}));
    state.counters["series"] = static_cast<double>(series.size());
    int flagged = 0;
    for (const auto& s : series) flagged += s.flag == history::Flag::regression ? 1 : 0;
    state.counters["flagged"] = flagged;
  }
}
BENCHMARK(BM_TrendAllRegressed)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::filesystem::remove_all(database().parent_path());
  return 0;
}
