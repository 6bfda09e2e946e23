// The max-batch search: its logic on made-up thresholds, its prediction on simulations, and the
// whole chain verified by measured steps on the reference backend under a limit.
#include <gtest/gtest.h>

#include <cmath>

#include "analysis_test_util.h"
#include "dlprobe/memory/max_batch.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/memory/session.h"

namespace dlprobe::memory {
namespace {

using testing::small_config;

TEST(SearchLargest, FindsTheBoundaryFromAnyGuess) {
  const std::int64_t upper = 50;
  for (std::int64_t threshold = 0; threshold <= 52; ++threshold) {
    for (std::int64_t guess = -1; guess <= 55; ++guess) {
      std::vector<std::pair<std::int64_t, bool>> probes;
      Result<std::int64_t> r = search_largest(
          guess, upper, [&](std::int64_t b) -> Result<bool> { return b <= threshold; }, &probes);
      ASSERT_TRUE(r.has_value());
      const std::int64_t want = std::min(threshold, upper);
      ASSERT_EQ(*r, want) << "threshold " << threshold << " guess " << guess;
      // The answer was seen to fit and the next batch seen to fail (unless at a bound).
      if (want >= 1) {
        EXPECT_NE(std::find(probes.begin(), probes.end(), std::pair{want, true}), probes.end());
      }
      if (want < upper) {
        EXPECT_NE(std::find(probes.begin(), probes.end(), std::pair{want + 1, false}),
                  probes.end());
      }
      EXPECT_LE(probes.size(), 16u);
    }
  }
}

TEST(SearchLargest, AGoodGuessCostsTwoProbes) {
  int probes = 0;
  auto fits = [&](std::int64_t b) -> Result<bool> {
    ++probes;
    return b <= 700;
  };
  EXPECT_EQ(search_largest(700, 1 << 16, fits).value(), 700);
  EXPECT_EQ(probes, 2);
  probes = 0;
  EXPECT_EQ(search_largest(701, 1 << 16, fits).value(), 700);
  EXPECT_EQ(probes, 2);
}

TEST(SearchLargest, StopsOnErrorsAndKeepsItsPromiseWithoutMonotony) {
  auto broken = [](std::int64_t) -> Result<bool> { return error(Errc::api_error, "cudnn failed"); };
  EXPECT_EQ(search_largest(4, 10, broken).status().code(), Errc::api_error);
  // Only batches between the largest that fitted and the smallest that did not are probed, so
  // even a test that is not monotone ends with a batch that fits and a next one that does not.
  auto odd = [](std::int64_t b) -> Result<bool> { return b % 2 == 1; };
  std::vector<std::pair<std::int64_t, bool>> probes;
  const std::int64_t r = search_largest(4, 10, odd, &probes).value();
  EXPECT_TRUE(odd(r).value());
  EXPECT_FALSE(odd(r + 1).value());
  EXPECT_EQ(search_largest(1, 0, odd).status().code(), Errc::invalid_argument);
}

// A large device takes batches past any fixed cap: the search's bound is the batch whose input
// images alone fill the limit (a bound of 65,536 once answered 65,536 for 141 GiB and ResNet-18 at
// 32x32, where 131,072 was predicted to fit).
TEST(PredictMaxBatch, ALargeDeviceIsNotCappedByTheSearch) {
  engine::StepConfig c = small_config();
  c.precision = engine::Precision::fp16;
  const std::uint64_t limit = std::uint64_t{141} << 30;
  EXPECT_EQ(max_batch_bound(c, limit),
            static_cast<std::int64_t>(limit / (3 * 32 * 32 * sizeof(float))));
  Result<std::int64_t> found = predict_max_batch(c, limit, nullptr);
  ASSERT_TRUE(found.has_value()) << found.status().message();
  EXPECT_GT(*found, std::int64_t{1} << 17);
  EXPECT_LT(*found, max_batch_bound(c, limit));
}

TEST(PredictMaxBatch, TheBatchFoundFitsTheSimulationAndTheNextDoesNot) {
  const engine::StepConfig c = small_config();
  SimulationOptions at6;
  at6.step = small_config(6);
  Result<StepMemory> six = simulate_step(at6);
  ASSERT_TRUE(six.has_value());
  const auto limit = static_cast<std::uint64_t>(six->reserved_peak_bytes) + (1u << 20);
  Result<std::int64_t> found = predict_max_batch(c, limit, nullptr, 1024);
  ASSERT_TRUE(found.has_value()) << found.status().message();
  EXPECT_GE(*found, 6);
  auto simulate = [&](std::int64_t b) {
    SimulationOptions o;
    o.step = small_config(b);
    o.allocator.mode = Mode::limit;
    o.allocator.limit_bytes = limit;
    return simulate_step(o);
  };
  EXPECT_TRUE(simulate(*found).has_value());
  EXPECT_EQ(simulate(*found + 1).status().code(), Errc::out_of_memory);
  // What the process holds outside the allocator comes off the limit.
  Calibration cal;
  cal.model = model::model_name(c.model);
  cal.precision = "fp32";
  cal.outside_allocator_bytes = static_cast<std::int64_t>(limit);
  EXPECT_EQ(predict_max_batch(c, limit, &cal).status().code(), Errc::invalid_argument);
}

// A planned step reserves its arena whole: unlimited, batch 8 may reserve more than a limit
// under which batches far above 8 run. The search is not misled into batch 1 (which a 32x32 image
// cannot train at) by the batch-8 figure.
TEST(PredictMaxBatch, AnArenaOverTheLimitAtBatch8DoesNotEndTheSearch) {
  const engine::StepConfig c =
      small_config(1, engine::MemoryPlan::planned, engine::Precision::bf16);
  auto simulate = [&](std::int64_t b, std::uint64_t limit) {
    SimulationOptions o;
    o.step = c;
    o.step.batch = b;
    if (limit > 0) {
      o.allocator.mode = Mode::limit;
      o.allocator.limit_bytes = limit;
    }
    return simulate_step(o);
  };
  const Result<StepMemory> free8 = simulate(8, 0);
  ASSERT_TRUE(free8.has_value()) << free8.status().message();
  const Result<StepMemory> free4 = simulate(4, 0);
  ASSERT_TRUE(free4.has_value()) << free4.status().message();
  // Between what batch 4 needs allocated and what batch 8 reserves unlimited.
  const auto limit = static_cast<std::uint64_t>(free4->peak.allocated_bytes) + (2u << 20);
  ASSERT_LT(limit, static_cast<std::uint64_t>(free8->reserved_peak_bytes));
  ASSERT_TRUE(simulate(2, limit).has_value());
  Result<std::int64_t> found = predict_max_batch(c, limit, nullptr, 4096);
  ASSERT_TRUE(found.has_value()) << found.status().message();
  EXPECT_GE(*found, 2);
  EXPECT_TRUE(simulate(*found, limit).has_value());
  EXPECT_EQ(simulate(*found + 1, limit).status().code(), Errc::out_of_memory);
}

TEST(MaxBatch, VerifiedByMeasuredStepsUnderALimit) {
  SimulationOptions at5;
  at5.step = small_config(5);
  Result<StepMemory> five = simulate_step(at5);
  ASSERT_TRUE(five.has_value());
  const auto limit = static_cast<std::uint64_t>(five->reserved_peak_bytes) + (1u << 20);
  SessionOptions so;
  so.allocator.mode = Mode::limit;
  so.allocator.limit_bytes = limit;
  Result<std::unique_ptr<Session>> session = Session::open(so);
  ASSERT_TRUE(session.has_value()) << session.status().message();
  Result<Measurement> cal = (*session)->measure(small_config(2));
  ASSERT_TRUE(cal.has_value()) << cal.status().message();
  Result<MaxBatchResult> r =
      find_max_batch(**session, small_config(), limit, &cal->calibration, 64);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  // The reference backend takes no workspace, so the prediction is the answer.
  EXPECT_EQ(r->found, r->predicted);
  EXPECT_GE(r->found, 5);
  EXPECT_TRUE(r->next_fails);
  ASSERT_TRUE(r->at_found.has_value());
  EXPECT_EQ(r->at_found->step.batch, r->found);
  EXPECT_LE(static_cast<std::uint64_t>(r->at_found->memory.reserved_peak_bytes), limit);
  bool fit = false;
  bool next_failed = false;
  for (const MaxBatchTrial& t : r->trials) {
    if (t.batch == r->found && t.fits) fit = true;
    if (t.batch == r->found + 1 && !t.fits) {
      next_failed = true;
      EXPECT_NE(t.why.find("cannot allocate"), std::string::npos) << t.why;
    }
  }
  EXPECT_TRUE(fit);
  EXPECT_TRUE(next_failed);
  // The session still runs after the failed trial.
  EXPECT_TRUE((*session)->measure(small_config(2)).has_value());
  EXPECT_EQ((*session)->allocator().stats().reserved_bytes, 0);
  // A session that does not run the same limit is refused.
  EXPECT_EQ(find_max_batch(**session, small_config(), limit + 1, nullptr).status().code(),
            Errc::invalid_argument);
}

TEST(Session, StaysUsableAfterRunningOutOfMemory) {
  SimulationOptions at4;
  at4.step = small_config(4);
  Result<StepMemory> four = simulate_step(at4);
  ASSERT_TRUE(four.has_value());
  SessionOptions so;
  so.allocator.mode = Mode::limit;
  so.allocator.limit_bytes = static_cast<std::uint64_t>(four->reserved_peak_bytes) + (4u << 20);
  Result<std::unique_ptr<Session>> session = Session::open(so);
  ASSERT_TRUE(session.has_value()) << session.status().message();
  Session& s = **session;
  Result<Measurement> big = s.measure(small_config(64));
  ASSERT_FALSE(big.has_value());
  EXPECT_EQ(big.status().code(), Errc::out_of_memory);
  const std::string& why = big.status().message();
  for (std::string_view part :
       {"cannot allocate", " of ", "limit", "allocated", "reserved", "largest free block",
        "smaller batch", "mixed precision", "planned"}) {
    EXPECT_NE(why.find(part), std::string::npos) << part << " not in: " << why;
  }
  EXPECT_EQ(s.allocator().stats().all.allocated_bytes, 0);
  EXPECT_EQ(s.allocator().stats().reserved_bytes, 0);
  Result<Measurement> small = s.measure(small_config(2));
  ASSERT_TRUE(small.has_value()) << small.status().message();
  EXPECT_GT(small->memory.peak.allocated_bytes, 0);
  // Out of memory while planning (the arena, the long-lived state) is as clean.
  Result<Measurement> planned = s.measure(small_config(256, engine::MemoryPlan::planned));
  ASSERT_FALSE(planned.has_value());
  EXPECT_EQ(planned.status().code(), Errc::out_of_memory);
  EXPECT_NE(planned.status().message().find("arena"), std::string::npos)
      << planned.status().message();
  EXPECT_EQ(s.allocator().stats().all.allocated_bytes, 0);
  EXPECT_TRUE(s.measure(small_config(2, engine::MemoryPlan::planned)).has_value());
}

}  // namespace
}  // namespace dlprobe::memory
