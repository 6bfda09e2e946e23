// Throughput of the caching allocator's malloc/free on the fake source, so the cost measured is the
// policy and its bookkeeping (best-fit lookup, split, coalesce, stats, the lock), not the device.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "dlprobe/allocator/caching_allocator.h"

namespace {

using dlprobe::memory::CachingAllocator;
using dlprobe::memory::Category;
using dlprobe::memory::FakeMemorySource;

std::unique_ptr<CachingAllocator> make_allocator() {
  return CachingAllocator::create(std::make_unique<FakeMemorySource>()).value();
}

// One size, allocated and freed at once: the cached block is taken and given back each time.
void BM_MallocFreeSameSize(benchmark::State& state) {
  auto al = make_allocator();
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = al->allocate(bytes, Category::temporaries).value();
    benchmark::DoNotOptimize(p);
    (void)al->deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MallocFreeSameSize)->Arg(4 << 10)->Arg(64 << 20);

// A window of live blocks of mixed sizes, freed in random order: splitting and coalescing on most
// calls, as in a training step. The owner label is set, as the engine sets it.
void BM_MallocFreeMixed(benchmark::State& state) {
  auto al = make_allocator();
  const auto window = static_cast<std::size_t>(state.range(0));
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> log_size(6.0, 26.0);  // 64 B to 64 MiB
  std::vector<std::size_t> sizes(4096);
  for (auto& s : sizes) s = static_cast<std::size_t>(std::exp2(log_size(rng)));
  std::vector<std::size_t> victims(4096);
  for (auto& v : victims) v = rng() % window;
  std::vector<void*> live(window, nullptr);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t slot = victims[i % victims.size()];
    (void)al->deallocate(live[slot]);
    live[slot] =
        al->allocate(sizes[i % sizes.size()], Category::activations, "layer3.2.conv2").value();
    ++i;
  }
  for (void* p : live) (void)al->deallocate(p);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MallocFreeMixed)->Arg(16)->Arg(256);

// What a sampler pays to read the counters.
void BM_Stats(benchmark::State& state) {
  auto al = make_allocator();
  for (auto _ : state) benchmark::DoNotOptimize(al->stats());
}
BENCHMARK(BM_Stats);

}  // namespace

BENCHMARK_MAIN();
