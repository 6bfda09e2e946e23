// Each diagnosis rule on constructed facts: fires where the numbers say so, stays silent just
// below its threshold and when its facts are unknown.
#include <gtest/gtest.h>

#include <algorithm>

#include "dlprobe/diagnosis/diagnosis.h"

namespace dlprobe::diagnosis {
namespace {

const Finding* find(const std::vector<Finding>& v, std::string_view id) {
  auto it = std::find_if(v.begin(), v.end(), [&](const Finding& f) { return f.id == id; });
  return it == v.end() ? nullptr : &*it;
}

constexpr std::uint64_t kGiB = 1ull << 30;

TEST(Diagnosis, NothingKnownNothingSaid) {
  EXPECT_TRUE(diagnose_run(RunFacts{}).empty());
}

TEST(Diagnosis, InputWaitBands) {
  RunFacts f;
  f.data_wait_share = 0.049;
  EXPECT_EQ(find(diagnose_run(f), "input_bound"), nullptr);
  f.data_wait_share = 0.05;
  const auto moderate = diagnose_run(f);
  ASSERT_NE(find(moderate, "input_bound"), nullptr);
  EXPECT_EQ(find(moderate, "input_bound")->severity, Severity::warning);
  f.data_wait_share = 0.2;
  const auto high = diagnose_run(f);
  EXPECT_EQ(find(high, "input_bound")->severity, Severity::error);
  EXPECT_DOUBLE_EQ(find(high, "input_bound")->numbers.at("data_wait_share"), 0.2);
}

TEST(Diagnosis, LowUtilisationWithSaturatedHost) {
  RunFacts f;
  f.gpu_util_median_pct = 45;
  f.host_cores = 8;
  f.host_cpu_median_pct = 760;  // 95% of 8 cores
  ASSERT_NE(find(diagnose_run(f), "host_bound"), nullptr);
  // One process pinned at a full core (Python's main thread) counts too.
  f.host_cpu_median_pct = 110;
  f.busiest_process_cpu_pct = 99;
  EXPECT_NE(find(diagnose_run(f), "host_bound"), nullptr);
  // Not saturated: a plain under-use note instead.
  f.busiest_process_cpu_pct = 60;
  const auto v = diagnose_run(f);
  EXPECT_EQ(find(v, "host_bound"), nullptr);
  EXPECT_NE(find(v, "gpu_underused"), nullptr);
  // A run that ran out of memory or failed is judged on that, not on its utilisation.
  f.busiest_process_cpu_pct = 99;
  f.oom = true;
  EXPECT_EQ(find(diagnose_run(f), "host_bound"), nullptr);
  f.oom = false;
  f.failed = true;
  EXPECT_EQ(find(diagnose_run(f), "host_bound"), nullptr);
  EXPECT_EQ(find(diagnose_run(f), "gpu_underused"), nullptr);
  f.failed = false;
  // Busy GPU: neither.
  f.gpu_util_median_pct = 70;
  f.busiest_process_cpu_pct = 100;
  EXPECT_TRUE(diagnose_run(f).empty());
}

TEST(Diagnosis, PreallocationAndNearOom) {
  RunFacts f;
  f.device_total_bytes = 140 * kGiB;
  f.prealloc_window_s = 5;
  f.early_gpu_bytes = 98 * kGiB;  // exactly 70%
  f.peak_gpu_bytes = 135 * kGiB;
  auto v = diagnose_run(f);
  EXPECT_NE(find(v, "memory_preallocated"), nullptr);
  // A preallocated pool near the total is not "near OOM" without the framework's own peak.
  EXPECT_EQ(find(v, "near_oom"), nullptr);
  f.framework_peak_bytes = 130 * kGiB;
  EXPECT_NE(find(diagnose_run(f), "near_oom"), nullptr);
  f.framework_peak_bytes = 20 * kGiB;
  EXPECT_EQ(find(diagnose_run(f), "near_oom"), nullptr);

  f.early_gpu_bytes = 97 * kGiB;
  f.framework_peak_bytes.reset();
  EXPECT_EQ(find(diagnose_run(f), "memory_preallocated"), nullptr);

  // JAX's default: 75% of the device at start, of which the model uses a fifth.
  RunFacts jax;
  jax.device_total_bytes = 140 * kGiB;
  jax.early_gpu_bytes = 105 * kGiB;
  jax.peak_gpu_bytes = 105 * kGiB;
  jax.framework_peak_bytes = 21 * kGiB;
  EXPECT_NE(find(diagnose_run(jax), "memory_preallocated"), nullptr);
  // A large PyTorch batch that fills 75% within seconds because it needs it is no pool.
  jax.framework_peak_bytes = 90 * kGiB;
  EXPECT_EQ(find(diagnose_run(jax), "memory_preallocated"), nullptr);

  RunFacts g;
  g.device_total_bytes = 140 * kGiB;
  g.early_gpu_bytes = 10 * kGiB;
  g.peak_gpu_bytes = 127 * kGiB;  // 90.7%
  v = diagnose_run(g);
  EXPECT_EQ(find(v, "memory_preallocated"), nullptr);
  EXPECT_NE(find(v, "near_oom"), nullptr);
  g.peak_gpu_bytes = 125 * kGiB;  // 89.3%
  EXPECT_EQ(find(diagnose_run(g), "near_oom"), nullptr);
}

TEST(Diagnosis, Precision) {
  RunFacts f;
  f.precision = "fp32";
  f.cc_major = 9;
  EXPECT_NE(find(diagnose_run(f), "fp32_on_tensor_cores"), nullptr);
  f.cc_major = 6;
  EXPECT_EQ(find(diagnose_run(f), "fp32_on_tensor_cores"), nullptr);
  f.cc_major.reset();
  EXPECT_EQ(find(diagnose_run(f), "fp32_on_tensor_cores"), nullptr);

  RunFacts h;
  h.precision = "bf16";
  h.channels_last = false;
  EXPECT_NE(find(diagnose_run(h), "not_channels_last"), nullptr);
  h.channels_last = true;
  EXPECT_EQ(find(diagnose_run(h), "not_channels_last"), nullptr);
  h.channels_last.reset();
  EXPECT_EQ(find(diagnose_run(h), "not_channels_last"), nullptr);
}

TEST(Diagnosis, Throttling) {
  RunFacts f;
  f.power_throttle = {0.04, 100, std::nullopt};
  f.thermal_throttle = {0.04, 100, std::nullopt};
  EXPECT_TRUE(diagnose_run(f).empty());
  f.power_throttle = {0.3, 100, std::nullopt};
  f.thermal_throttle = {0.05, 20, 3};
  const auto v = diagnose_run(f);
  ASSERT_NE(find(v, "power_throttling"), nullptr);
  EXPECT_EQ(find(v, "power_throttling")->evidence,
            "power cap or power brake active in 30% of 100 samples");
  ASSERT_NE(find(v, "thermal_throttling"), nullptr);
  EXPECT_EQ(find(v, "thermal_throttling")->evidence,
            "thermal slowdown active in 5% of 20 samples of GPU 3");
}

TEST(Diagnosis, Outcomes) {
  RunFacts oom;
  oom.oom = true;
  oom.failed = true;
  oom.oom_framework = "pytorch";
  oom.oom_line = "torch.OutOfMemoryError: CUDA out of memory.";
  const auto v = diagnose_run(oom);
  ASSERT_NE(find(v, "oom"), nullptr);
  EXPECT_EQ(find(v, "oom")->severity, Severity::error);
  EXPECT_NE(find(v, "oom")->evidence.find("pytorch"), std::string::npos);
  EXPECT_EQ(find(v, "crashed"), nullptr);  // the OOM explains the failure
  EXPECT_EQ(find(v, "failed"), nullptr);

  RunFacts crash;
  crash.failed = true;
  crash.signal = 11;
  ASSERT_NE(find(diagnose_run(crash), "crashed"), nullptr);
  EXPECT_NE(find(diagnose_run(crash), "crashed")->evidence.find("signal 11"), std::string::npos);
  // A non-zero exit is a failure, not a crash (docs/external.md keeps "crashed" for signals).
  RunFacts exit;
  exit.failed = true;
  exit.exit_code = 2;
  EXPECT_EQ(find(diagnose_run(exit), "crashed"), nullptr);
  ASSERT_NE(find(diagnose_run(exit), "failed"), nullptr);
  EXPECT_NE(find(diagnose_run(exit), "failed")->evidence.find("exit status 2"), std::string::npos);
  RunFacts hang;
  hang.hang = true;
  hang.hang_after_s = 60;
  EXPECT_NE(find(diagnose_run(hang), "hang"), nullptr);
  RunFacts timeout;
  timeout.timeout = true;
  EXPECT_EQ(find(diagnose_run(timeout), "timeout")->severity, Severity::warning);
}

TEST(Diagnosis, AttributionAndTelemetryNotes) {
  RunFacts f;
  f.attribution_device_wide = true;
  EXPECT_NE(find(diagnose_run(f), "gpu_memory_device_wide"), nullptr);
  RunFacts g;
  g.no_gpu_telemetry = true;
  EXPECT_NE(find(diagnose_run(g), "no_gpu_telemetry"), nullptr);
}

std::vector<SweepPointFacts> sweep(std::vector<std::pair<std::int64_t, double>> ok,
                                   std::vector<std::int64_t> oom = {}) {
  std::vector<SweepPointFacts> out;
  for (auto [b, r] : ok) out.push_back({b, true, false, r});
  for (auto b : oom) out.push_back({b, false, true, std::nullopt});
  return out;
}

TEST(Diagnosis, NoSteadyPhaseReplacesTheUtilisationRules) {
  // What the run reported: medians over a start-up at 2 % with the CPU busy.
  RunFacts f;
  f.gpu_util_median_pct = 2;
  f.host_cores = 16;
  f.host_cpu_median_pct = 1550;
  ASSERT_NE(find(diagnose_run(f), "host_bound"), nullptr);
  // Without a window the runner leaves the medians out and says why.
  f.gpu_util_median_pct.reset();
  f.host_cpu_median_pct.reset();
  f.no_steady_phase = "GPU utilisation never above 5%";
  const auto v = diagnose_run(f);
  ASSERT_NE(find(v, "no_steady_phase"), nullptr);
  EXPECT_EQ(find(v, "no_steady_phase")->title, "Not enough evidence: no steady phase seen");
  EXPECT_NE(find(v, "no_steady_phase")->evidence.find("never above 5%"), std::string::npos);
  EXPECT_EQ(find(v, "host_bound"), nullptr);
  EXPECT_EQ(find(v, "gpu_underused"), nullptr);
  // A run that failed says nothing about its steady phase either.
  f.failed = true;
  EXPECT_EQ(find(diagnose_run(f), "no_steady_phase"), nullptr);
}

TEST(SharedGpuDiagnosis, CombinedThroughputAndEachCopy) {
  std::vector<SharedCopyFacts> copies = {
      {1, true, false, "ok", 800.0, 20 * kGiB, 20 * kGiB, "pytorch", std::nullopt, std::nullopt,
       std::nullopt, std::nullopt},
      {2, true, false, "ok", 700.0, 21 * kGiB, 21 * kGiB, "pytorch", std::nullopt, std::nullopt,
       std::nullopt, std::nullopt},
  };
  const auto v = diagnose_shared_gpu(copies, 140 * kGiB);
  ASSERT_NE(find(v, "shared_gpu"), nullptr);
  EXPECT_EQ(find(v, "shared_gpu")->severity, Severity::info);
  EXPECT_DOUBLE_EQ(find(v, "shared_gpu")->numbers.at("combined_items_per_s"), 1500.0);
  EXPECT_NE(find(v, "shared_gpu")->evidence.find("copy 2: ok, 700.0 items/s, peak 21.0 GiB"),
            std::string::npos);
  EXPECT_EQ(find(v, "shared_gpu_preallocation"), nullptr);  // each within its half
}

TEST(SharedGpuDiagnosis, WindowsThatDoNotOverlapAreSaid) {
  // As two JAX copies on an H200 measured: one after the other, each with the GPU to itself.
  std::vector<SharedCopyFacts> copies = {
      {1, true, false, "ok", 5508.5, 105 * kGiB, 105 * kGiB, "jax", 47.46, 48.16, std::nullopt,
       std::nullopt},
      {2, true, false, "ok", 4968.5, 33 * kGiB, 33 * kGiB, "jax", 46.57, 47.35, std::nullopt,
       std::nullopt},
  };
  auto v = diagnose_shared_gpu(copies, 140 * kGiB);
  const Finding* s = find(v, "shared_gpu");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->severity, Severity::warning);
  EXPECT_NE(s->title.find("did not overlap"), std::string::npos) << s->title;
  EXPECT_NE(s->evidence.find("copy 1 47.46-48.16 s, copy 2 46.57-47.35 s"), std::string::npos)
      << s->evidence;
  EXPECT_DOUBLE_EQ(s->numbers.at("windows_overlap"), 0.0);
  // Overlapping windows: the sum stands.
  copies[1].window_end_s = 47.7;
  v = diagnose_shared_gpu(copies, 140 * kGiB);
  EXPECT_EQ(find(v, "shared_gpu")->severity, Severity::info);
  EXPECT_EQ(find(v, "shared_gpu")->title.find("did not overlap"), std::string::npos);
  EXPECT_DOUBLE_EQ(find(v, "shared_gpu")->numbers.at("windows_overlap"), 1.0);
}

TEST(SharedGpuDiagnosis, PreallocationWithTheFrameworksSwitch) {
  // JAX's default pool (75 %) in copy 1; copy 2 could not start.
  std::vector<SharedCopyFacts> copies = {
      {1, true, false, "ok", 900.0, 105 * kGiB, 105 * kGiB, "jax", std::nullopt, std::nullopt,
       std::nullopt, std::nullopt},
      {2, false, true, "oom", std::nullopt, 0, std::nullopt, "jax", std::nullopt, std::nullopt,
       std::nullopt, std::nullopt},
  };
  auto v = diagnose_shared_gpu(copies, 140 * kGiB);
  ASSERT_NE(find(v, "shared_gpu_preallocation"), nullptr);
  EXPECT_EQ(find(v, "shared_gpu")->severity, Severity::error);
  EXPECT_DOUBLE_EQ(find(v, "shared_gpu")->numbers.at("combined_items_per_s"), 900.0);
  const Finding* p = find(v, "shared_gpu_preallocation");
  EXPECT_EQ(p->severity, Severity::error);
  EXPECT_NE(p->fix.find("XLA_PYTHON_CLIENT_PREALLOCATE=false"), std::string::npos);
  EXPECT_NE(p->fix.find("XLA_PYTHON_CLIENT_MEM_FRACTION=0.47 for 2 copies"), std::string::npos);
  EXPECT_EQ(p->fix.find("TF_FORCE"), std::string::npos);
  // TensorFlow's, with both copies running (the second fitted in what was left): a warning.
  copies[0].framework = "tensorflow";
  copies[1] = {2,        true,         false,        "ok",         100.0,        2 * kGiB,
               2 * kGiB, "tensorflow", std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  v = diagnose_shared_gpu(copies, 140 * kGiB);
  p = find(v, "shared_gpu_preallocation");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->severity, Severity::warning);
  EXPECT_NE(p->fix.find("TF_FORCE_GPU_ALLOW_GROWTH=true"), std::string::npos);
  // Unknown device size: the summary only.
  EXPECT_EQ(find(diagnose_shared_gpu(copies, std::nullopt), "shared_gpu_preallocation"), nullptr);
}

// Two copies on different GPUs, each GPU to itself: the summary names the GPUs, and a copy that
// takes 45 GiB of its own 80 GiB GPU is within its share (the whole GPU), not over half of it.
TEST(SharedGpuDiagnosis, CopiesOnDifferentGpusAreEachAlone) {
  std::vector<SharedCopyFacts> copies = {
      {1, true, false, "ok", 900.0, 45 * kGiB, 45 * kGiB, "jax", std::nullopt, std::nullopt, 0u,
       80 * kGiB},
      {2, true, false, "ok", 800.0, 10 * kGiB, 10 * kGiB, "jax", std::nullopt, std::nullopt, 2u,
       80 * kGiB},
  };
  auto v = diagnose_shared_gpu(copies, 80 * kGiB);
  const Finding* s = find(v, "shared_gpu");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->title, "2 of 2 copies ran together on 2 GPUs: combined 1700.0 items/s");
  EXPECT_NE(s->evidence.find("; GPU 0: copy 1; GPU 2: copy 2"), std::string::npos) << s->evidence;
  EXPECT_EQ(find(v, "shared_gpu_preallocation"), nullptr);
  // Both on GPU 0: 45 GiB is over the 40 GiB share of two copies there.
  copies[1].gpu = 0u;
  v = diagnose_shared_gpu(copies, 80 * kGiB);
  EXPECT_EQ(find(v, "shared_gpu")->title,
            "2 of 2 copies ran together on one GPU: combined 1700.0 items/s");
  ASSERT_NE(find(v, "shared_gpu_preallocation"), nullptr);
}

TEST(SweepDiagnosis, StillRisingAtLargestBatch) {
  auto v = diagnose_batch_sweep(sweep({{16, 1000}, {32, 1800}, {64, 2100}}));
  ASSERT_NE(find(v, "batch_too_small"), nullptr);  // +16.7%
  EXPECT_NEAR(find(v, "batch_too_small")->numbers.at("gain"), 2100.0 / 1800 - 1, 1e-12);
  v = diagnose_batch_sweep(sweep({{16, 1000}, {32, 1800}, {64, 1950}}));  // +8.3%
  EXPECT_EQ(find(v, "batch_too_small"), nullptr);
}

TEST(SweepDiagnosis, SmallBatchesBelowHalfOfBest) {
  const auto v = diagnose_batch_sweep(sweep({{8, 900}, {16, 1100}, {64, 2000}, {128, 2050}}));
  ASSERT_NE(find(v, "small_batch_slow"), nullptr);
  EXPECT_NE(find(v, "small_batch_slow")->evidence.find("batch 8"), std::string::npos);
  EXPECT_EQ(find(v, "small_batch_slow")->evidence.find("16"), std::string::npos);
}

TEST(SweepDiagnosis, ThroughputFalls) {
  auto v = diagnose_batch_sweep(sweep({{64, 2000}, {128, 2500}, {256, 2300}}));
  ASSERT_NE(find(v, "throughput_falls"), nullptr);
  EXPECT_DOUBLE_EQ(find(v, "throughput_falls")->numbers.at("best_batch"), 128);
  v = diagnose_batch_sweep(sweep({{64, 2000}, {128, 2500}, {256, 2400}}));  // within 5%
  EXPECT_EQ(find(v, "throughput_falls"), nullptr);
}

TEST(SweepDiagnosis, OomWithLargestThatRan) {
  const auto v = diagnose_batch_sweep(sweep({{64, 2000}, {128, 2600}}, {512, 256}));
  const Finding* f = find(v, "oom_batch");
  ASSERT_NE(f, nullptr);
  EXPECT_DOUBLE_EQ(f->numbers.at("smallest_oom_batch"), 256);
  EXPECT_DOUBLE_EQ(f->numbers.at("largest_ok_batch"), 128);
  // With an OOM above, "still rising" would advise a batch that does not fit.
  EXPECT_EQ(find(v, "batch_too_small"), nullptr);
}

}  // namespace
}  // namespace dlprobe::diagnosis
