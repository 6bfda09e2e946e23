// Cost of the unit parsers, which also read the values of scripted and protocol lines.
#include <benchmark/benchmark.h>

#include "dlprobe/core/units.h"

static void BM_ParseSize(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(dlprobe::parse_size("1.5GiB").value());
}
BENCHMARK(BM_ParseSize);

static void BM_ParseDuration(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(dlprobe::parse_duration("250ms").value());
}
BENCHMARK(BM_ParseDuration);

BENCHMARK_MAIN();
