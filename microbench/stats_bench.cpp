// Cost of the bootstrap behind `dlprobe compare` and every results file's throughput interval, by
// the number of timed steps per run: 2,000 resamples of at most kMaxBootstrapBlocks blocks, so the
// time stops growing with the steps past that (a 100 MB results file holds about 6.3 million).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "dlprobe/stats/statistics.h"

namespace {

// Step times of a run: 10 ms with a slow drift and a little jitter, 64 items each.
void make_run(std::size_t steps, double scale, std::vector<double>& seconds,
              std::vector<double>& items) {
  seconds.clear();
  items.assign(steps, 64);
  for (std::size_t i = 0; i < steps; ++i) {
    seconds.push_back(scale * (0.01 + 1e-4 * static_cast<double>(i / 1000 % 5) +
                               1e-5 * static_cast<double>(i % 7)));
  }
}

void BM_ThroughputRatio(benchmark::State& state) {
  std::vector<double> base_s;
  std::vector<double> base_n;
  std::vector<double> new_s;
  std::vector<double> new_n;
  make_run(static_cast<std::size_t>(state.range(0)), 1.0, base_s, base_n);
  make_run(static_cast<std::size_t>(state.range(0)), 0.99, new_s, new_n);
  for (auto _ : state) {
    benchmark::DoNotOptimize(dlprobe::stats::throughput_ratio(base_s, base_n, new_s, new_n));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_ThroughputRatio)
    ->Arg(1'000)
    ->Arg(100'000)
    ->Arg(6'300'000)
    ->Unit(benchmark::kMillisecond);

void BM_Summarize(benchmark::State& state) {
  std::vector<double> seconds;
  std::vector<double> items;
  make_run(static_cast<std::size_t>(state.range(0)), 1.0, seconds, items);
  for (auto _ : state) benchmark::DoNotOptimize(dlprobe::stats::summarize(seconds, items));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Summarize)->Arg(1'000)->Arg(100'000)->Arg(6'300'000)->Unit(benchmark::kMillisecond);

void BM_MannWhitney(benchmark::State& state) {
  std::vector<double> a;
  std::vector<double> b;
  std::vector<double> items;
  make_run(static_cast<std::size_t>(state.range(0)), 1.0, a, items);
  make_run(static_cast<std::size_t>(state.range(0)), 0.99, b, items);
  for (auto _ : state) benchmark::DoNotOptimize(dlprobe::stats::mann_whitney_u(a, b));
  state.SetItemsProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_MannWhitney)->Arg(1'000)->Arg(6'300'000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
