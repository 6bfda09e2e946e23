#include "dlprobe/diagnosis/diagnosis.h"
#include "dlprobe/core/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlprobe::diagnosis {

namespace {

double gib(std::uint64_t bytes) {
  return static_cast<double>(bytes) / kGiB;
}

bool is_half(const std::string& p) {
  return p == "fp16" || p == "bf16" || p == "float16" || p == "bfloat16" || p == "mixed_float16" ||
         p == "mixed_bfloat16";
}

void input_rules(const RunFacts& f, std::vector<Finding>& out) {
  if (f.data_wait_share && *f.data_wait_share >= kDataWaitModerate) {
    const bool high = *f.data_wait_share >= kDataWaitHigh;
    out.push_back({
        "input_bound",
        high ? Severity::error : Severity::warning,
        fmt::format("{} share of step time waiting for input", high ? "High" : "Moderate"),
        fmt::format("{:.0f}% of the measured step time was data wait (data_time_s / step_time_s)",
                    *f.data_wait_share * 100),
        "Load ahead of the GPU: more data-loader workers, pinned memory and non-blocking copies, "
        "prefetch (tf.data .prefetch(AUTOTUNE), DataLoader prefetch_factor), decode on the GPU "
        "(DALI) or cache decoded data",
        {{"data_wait_share", *f.data_wait_share}},
    });
  }
  // A run that failed or ran out of memory never reached its steady steps: its utilisation says
  // nothing about where its steps would spend their time.
  if (f.oom || f.failed) return;
  if (f.no_steady_phase) {
    out.push_back({
        "no_steady_phase",
        Severity::info,
        "Not enough evidence: no steady phase seen",
        fmt::format("no measured steps and no steady stretch in the telemetry ({}); GPU "
                    "utilisation and host CPU are not judged",
                    *f.no_steady_phase),
        "Print one line per step (the dlprobe line protocol, or --throughput-regex with a step "
        "group) or run the timed loop for at least a few seconds",
        {},
    });
    return;
  }
  if (!f.gpu_util_median_pct || *f.gpu_util_median_pct >= kLowGpuUtilPct) return;
  const double all_cores = 100.0 * f.host_cores;
  const bool all_busy = f.host_cpu_median_pct && f.host_cores > 0 &&
                        *f.host_cpu_median_pct >= kCpuSaturatedShare * all_cores;
  const bool one_busy =
      f.busiest_process_cpu_pct && *f.busiest_process_cpu_pct >= kCpuSaturatedShare * 100.0;
  if (all_busy || one_busy) {
    Finding finding{
        "host_bound",
        Severity::warning,
        "GPU under-used while the host CPU is saturated",
        fmt::format("median GPU utilisation {:.0f}%; workload CPU {:.0f}% of {} cores{}",
                    *f.gpu_util_median_pct, f.host_cpu_median_pct.value_or(0), f.host_cores,
                    one_busy ? fmt::format(", busiest process {:.0f}% of one core",
                                           *f.busiest_process_cpu_pct)
                             : std::string()),
        all_busy ? "Every core is busy: move preprocessing to the GPU or offline, use a faster "
                   "decoder, or give the job more cores"
                 : "One process is at 100% of a core (e.g. Python's main thread): spread input "
                   "work over worker processes, avoid per-step host syncs (.item(), printing "
                   "losses), capture the step in a graph (torch.compile, tf.function, jax.jit)",
        {{"gpu_util_median_pct", *f.gpu_util_median_pct}},
    };
    if (f.host_cpu_median_pct) finding.numbers["host_cpu_median_pct"] = *f.host_cpu_median_pct;
    if (f.busiest_process_cpu_pct) {
      finding.numbers["busiest_process_cpu_pct"] = *f.busiest_process_cpu_pct;
    }
    finding.numbers["host_cores"] = f.host_cores;
    out.push_back(std::move(finding));
  } else {
    out.push_back({
        "gpu_underused",
        Severity::info,
        "GPU utilisation below 70% without a saturated host",
        fmt::format("median GPU utilisation {:.0f}%", *f.gpu_util_median_pct),
        "Look for synchronisation or small kernels: larger batch, fused/compiled step, fewer "
        "host-device copies; profile one step",
        {{"gpu_util_median_pct", *f.gpu_util_median_pct}},
    });
  }
}

void memory_rules(const RunFacts& f, std::vector<Finding>& out) {
  if (f.attribution_device_wide) {
    out.push_back({
        "gpu_memory_device_wide",
        Severity::info,
        "GPU memory could not be attributed to the workload's processes",
        "NVML listed no process of the workload's tree and no new GPU process (a container's PID "
        "namespace can hide them), so memory figures are the device's used memory minus what "
        "was in use before the start, which includes any other process",
        "Run on an otherwise idle GPU, or run dlprobe inside the container (--pid=host lets NVML "
        "report the container's processes)",
        {},
    });
  }
  if (!f.device_total_bytes || *f.device_total_bytes == 0) return;
  const double total = static_cast<double>(*f.device_total_bytes);
  bool preallocated = false;
  const bool framework_uses_it = f.early_gpu_bytes && f.framework_peak_bytes &&
                                 static_cast<double>(*f.framework_peak_bytes) >=
                                     kPreallocUsedShare * static_cast<double>(*f.early_gpu_bytes);
  if (f.early_gpu_bytes && static_cast<double>(*f.early_gpu_bytes) >= kPreallocShare * total &&
      !framework_uses_it) {
    preallocated = true;
    out.push_back({
        "memory_preallocated",
        Severity::info,
        "The framework took most of the GPU's memory at start",
        fmt::format("{:.1f} GiB of {:.1f} GiB ({:.0f}%) held within {:.0f} s of the first "
                    "allocation",
                    gib(*f.early_gpu_bytes), gib(*f.device_total_bytes),
                    static_cast<double>(*f.early_gpu_bytes) / total * 100,
                    f.prealloc_window_s.value_or(0)),
        "NVML's figure is the framework's pool, not what the model needs: read the framework's "
        "peak (framework_peak_bytes), or turn preallocation off to measure "
        "(TF_FORCE_GPU_ALLOW_GROWTH=true, XLA_PYTHON_CLIENT_PREALLOCATE=false)",
        {{"early_gpu_bytes", static_cast<double>(*f.early_gpu_bytes)},
         {"device_total_bytes", total}},
    });
  }
  // A preallocated pool says nothing about headroom; the framework's own peak does.
  std::optional<std::uint64_t> used;
  std::string what;
  if (preallocated) {
    used = f.framework_peak_bytes;
    what = "framework peak";
  } else {
    used = f.peak_gpu_bytes;
    what = "peak GPU memory (NVML)";
  }
  if (!f.oom && used && static_cast<double>(*used) > kNearOomShare * total) {
    out.push_back({
        "near_oom",
        Severity::warning,
        "Close to running out of GPU memory",
        fmt::format("{} {:.1f} GiB of {:.1f} GiB ({:.0f}%)", what, gib(*used),
                    gib(*f.device_total_bytes), static_cast<double>(*used) / total * 100),
        "A longer sequence, another process or fragmentation may tip it over: leave headroom "
        "(smaller batch, activation checkpointing, bf16/fp16 activations)",
        {{"peak_bytes", static_cast<double>(*used)}, {"device_total_bytes", total}},
    });
  }
}

void precision_rules(const RunFacts& f, std::vector<Finding>& out) {
  if (!f.precision) return;
  const std::string& p = *f.precision;
  if ((p == "fp32" || p == "float32") && f.cc_major && *f.cc_major >= 7) {
    out.push_back({
        "fp32_on_tensor_cores",
        Severity::warning,
        "fp32 training on a GPU with tensor cores",
        fmt::format("precision fp32 on compute capability {}.x", *f.cc_major),
        "Use mixed precision (torch.autocast bf16/fp16, "
        "tf.keras.mixed_precision.set_global_policy('mixed_float16'), bf16 params in JAX) or at "
        "least TF32 matmuls (torch.backends.cuda.matmul.allow_tf32 / "
        "torch.set_float32_matmul_precision('high'))",
        {{"cc_major", static_cast<double>(*f.cc_major)}},
    });
  }
  if (is_half(p) && f.channels_last && !*f.channels_last) {
    out.push_back({
        "not_channels_last",
        Severity::warning,
        "Half precision convolutions in NCHW layout",
        fmt::format("precision {} with channels_last false", p),
        "Tensor-core convolutions want NHWC: model.to(memory_format=torch.channels_last) and "
        "inputs likewise in PyTorch; TensorFlow and JAX/XLA pick NHWC on GPU by themselves",
        {},
    });
  }
}

// "in 32% of 28 samples", and of which GPU where the run used several.
std::string share_text(const ThrottleShare& t) {
  return fmt::format("{:.0f}% of {} samples{}", t.share * 100, t.samples,
                     t.gpu ? fmt::format(" of GPU {}", *t.gpu) : "");
}

void clock_rules(const RunFacts& f, std::vector<Finding>& out) {
  if (f.power_throttle.share >= kThrottleShare) {
    out.push_back({
        "power_throttling",
        Severity::warning,
        "GPU clocks held back by the power limit",
        fmt::format("power cap or power brake active in {}", share_text(f.power_throttle)),
        "Expected under full load on some boards; compare against the board's default power "
        "limit (dlprobe doctor) and check nobody lowered it (nvidia-smi -q -d POWER)",
        {{"power_throttle_share", f.power_throttle.share}},
    });
  }
  if (f.thermal_throttle.share >= kThrottleShare) {
    out.push_back({
        "thermal_throttling",
        Severity::warning,
        "GPU clocks held back by temperature",
        fmt::format("thermal slowdown active in {}", share_text(f.thermal_throttle)),
        "Check cooling (fans, airflow, inlet temperature); results from this run understate the "
        "GPU",
        {{"thermal_throttle_share", f.thermal_throttle.share}},
    });
  }
}

void outcome_rules(const RunFacts& f, std::vector<Finding>& out) {
  if (f.oom) {
    out.push_back({
        "oom",
        Severity::error,
        "The workload ran out of GPU memory",
        fmt::format("{}: {}", f.oom_framework.value_or("unknown framework"),
                    f.oom_line.value_or("(reported by the workload)")),
        "Smaller batch (dlprobe run --max-batch finds the largest), mixed precision, activation "
        "checkpointing; with a preallocating framework make sure no other process holds memory",
        {},
    });
  } else if (f.hang) {
    out.push_back({
        "hang",
        Severity::error,
        "The workload stopped making progress",
        fmt::format("no output and no GPU activity for {:.3g} s", f.hang_after_s.value_or(0)),
        "Look for a deadlock in data loading or collective communication (NCCL_DEBUG=INFO), or "
        "a process waiting on a GPU another job holds",
        {},
    });
  } else if (f.failed) {
    // The names of docs/external.md's outcomes: a non-zero exit failed, a signal crashed.
    out.push_back({
        f.signal ? "crashed" : "failed",
        Severity::error,
        f.signal ? "The workload was ended by a signal" : "The workload exited with an error",
        f.signal ? fmt::format("ended by signal {}", *f.signal)
                 : fmt::format("exit status {}", f.exit_code.value_or(-1)),
        "See the output's last lines (kept in the results); a signal 9 without a message is "
        "often the host's out-of-memory killer (dmesg)",
        {},
    });
  } else if (f.timeout) {
    out.push_back({
        "timeout",
        Severity::warning,
        "The workload was stopped at --timeout",
        "the run reached its time limit",
        "Raise --timeout or lower the number of steps",
        {},
    });
  }
}

}  // namespace

std::vector<Finding> diagnose_shared_gpu(const std::vector<SharedCopyFacts>& copies,
                                         std::optional<std::uint64_t> device_total_bytes) {
  std::vector<Finding> out;
  if (copies.empty()) return out;
  double combined = 0;
  int ran = 0;
  std::string each;
  for (const auto& c : copies) {
    if (c.ran) {
      ++ran;
      combined += c.items_per_s.value_or(0);
    }
    each += fmt::format(
        "{}copy {}: {}, {} items/s, peak {} GiB", each.empty() ? "" : "; ", c.copy, c.outcome,
        c.items_per_s ? fmt::format("{:.1f}", *c.items_per_s) : std::string("-"),
        c.peak_gpu_bytes ? fmt::format("{:.1f}", gib(*c.peak_gpu_bytes)) : std::string("-"));
  }
  const auto n = static_cast<int>(copies.size());
  // Whether the measured windows of the copies that ran share a moment (known with two or more).
  double latest_start = -std::numeric_limits<double>::infinity();
  double earliest_end = std::numeric_limits<double>::infinity();
  int windows = 0;
  std::string spans;
  for (const auto& c : copies) {
    if (!c.ran || !c.window_start_s || !c.window_end_s) continue;
    ++windows;
    latest_start = std::max(latest_start, *c.window_start_s);
    earliest_end = std::min(earliest_end, *c.window_end_s);
    spans += fmt::format("{}copy {} {:.2f}-{:.2f} s", spans.empty() ? "" : ", ", c.copy,
                         *c.window_start_s, *c.window_end_s);
  }
  const bool apart = windows >= 2 && latest_start >= earliest_end;
  // Which copies were on which GPU, where NVML said.
  std::map<unsigned, std::vector<int>> on_gpu;
  for (const auto& c : copies) {
    if (c.gpu) on_gpu[*c.gpu].push_back(c.copy);
  }
  std::string where = "one GPU";
  if (on_gpu.size() > 1) {
    where = fmt::format("{} GPUs", on_gpu.size());
    for (const auto& [gpu, on] : on_gpu) {
      each +=
          fmt::format("; GPU {}: cop{} {}", gpu, on.size() == 1 ? "y" : "ies", fmt::join(on, ", "));
    }
  }
  Finding summary{
      "shared_gpu",
      ran == n ? Severity::info : Severity::error,
      fmt::format("{} of {} copies ran together on {}: combined {:.1f} items/s", ran, n, where,
                  combined),
      each,
      ran == n ? "The sum is what the GPU gives when shared this way; compare it with one copy "
                 "alone"
               : "A copy that could not run needs memory another held: see "
                 "shared_gpu_preallocation, or give each copy a smaller batch",
      {{"copies", n}, {"copies_ran", ran}, {"combined_items_per_s", combined}},
  };
  if (windows >= 2) {
    summary.evidence += fmt::format("; measured windows (seconds since launch): {}", spans);
    summary.numbers["windows_overlap"] = apart ? 0.0 : 1.0;
  }
  if (apart) {
    if (summary.severity == Severity::info) summary.severity = Severity::warning;
    summary.title += ", but their measured windows did not overlap";
    summary.fix =
        "The sum is not a rate the shared GPU gave: each copy had it alone while it was measured. "
        "Time more steps in each copy so that their measured phases run at the same time";
  }
  out.push_back(std::move(summary));
  for (const auto& c : copies) {
    const std::optional<std::uint64_t> total =
        c.device_total_bytes ? c.device_total_bytes : device_total_bytes;
    if (!total || *total == 0) continue;
    // The copies on its GPU; one whose GPU NVML did not show (it may have failed before taking
    // memory) may have been on any, as copies are unless each is given its own GPU.
    const auto n_here =
        static_cast<int>(std::count_if(copies.begin(), copies.end(), [&](const SharedCopyFacts& o) {
          return !c.gpu || !o.gpu || o.gpu == c.gpu;
        }));
    const double share = static_cast<double>(*total) / n_here;
    // The fraction each copy may take, with a margin for the CUDA contexts outside the pools.
    const double fraction = std::floor(0.95 / n_here * 100) / 100;
    if (!c.early_gpu_bytes || static_cast<double>(*c.early_gpu_bytes) <= share) continue;
    const std::string fw = c.framework.value_or("");
    std::string fix;
    if (fw == "tensorflow") {
      fix =
          "TF_FORCE_GPU_ALLOW_GROWTH=true in each copy's environment (or a logical device "
          "with memory_limit)";
    } else if (fw == "jax") {
      fix = fmt::format(
          "XLA_PYTHON_CLIENT_PREALLOCATE=false, or XLA_PYTHON_CLIENT_MEM_FRACTION={:.2f} for {} "
          "copies, in each copy's environment",
          fraction, n_here);
    } else {
      fix = fmt::format(
          "Turn the framework's preallocation off in each copy's environment: "
          "TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow); XLA_PYTHON_CLIENT_PREALLOCATE=false or "
          "XLA_PYTHON_CLIENT_MEM_FRACTION={:.2f} for {} copies (JAX)",
          fraction, n_here);
    }
    const bool blocked = ran < n;
    out.push_back({
        "shared_gpu_preallocation",
        blocked ? Severity::error : Severity::warning,
        fmt::format("Copy {} took more than its share of the GPU at start{}", c.copy,
                    blocked ? ", and not every copy could run" : ""),
        fmt::format("{:.1f} GiB within its first seconds, over the {:.1f} GiB share of {} copies "
                    "on a {:.1f} GiB GPU",
                    gib(*c.early_gpu_bytes), share / kGiB, n_here, gib(*total)),
        fix,
        {{"copy", c.copy},
         {"early_gpu_bytes", static_cast<double>(*c.early_gpu_bytes)},
         {"device_total_bytes", static_cast<double>(*total)}},
    });
  }
  return out;
}

std::vector<Finding> diagnose_run(const RunFacts& facts) {
  std::vector<Finding> out;
  outcome_rules(facts, out);
  input_rules(facts, out);
  memory_rules(facts, out);
  precision_rules(facts, out);
  clock_rules(facts, out);
  if (facts.no_gpu_telemetry) {
    out.push_back({"no_gpu_telemetry",
                   Severity::info,
                   "No GPU telemetry for this run",
                   "NVML could not be opened, so GPU memory, utilisation and clocks are missing",
                   "Run on the GPU host with the NVIDIA driver (dlprobe doctor says what is "
                   "missing)",
                   {}});
  }
  return out;
}

std::vector<Finding> diagnose_batch_sweep(const std::vector<SweepPointFacts>& points) {
  std::vector<Finding> out;
  std::vector<SweepPointFacts> ran;
  std::optional<std::int64_t> smallest_oom;
  for (const auto& p : points) {
    if (p.ran && p.items_per_s) ran.push_back(p);
    if (p.oom && (!smallest_oom || p.batch < *smallest_oom)) smallest_oom = p.batch;
  }
  std::sort(ran.begin(), ran.end(), [](auto& a, auto& b) { return a.batch < b.batch; });

  if (smallest_oom) {
    Finding f{"oom_batch",
              Severity::info,
              fmt::format("Out of memory from batch {}", *smallest_oom),
              "",
              "",
              {}};
    f.numbers["smallest_oom_batch"] = static_cast<double>(*smallest_oom);
    std::optional<std::int64_t> largest_ok;
    for (const auto& p : ran) {
      if (p.batch < *smallest_oom) largest_ok = p.batch;
    }
    if (largest_ok) {
      f.evidence =
          fmt::format("batch {} ran, batch {} ran out of memory", *largest_ok, *smallest_oom);
      f.numbers["largest_ok_batch"] = static_cast<double>(*largest_ok);
    } else {
      f.evidence = fmt::format("no batch below {} ran", *smallest_oom);
    }
    f.fix =
        "Use at most the largest batch that ran, or cut activation memory (mixed precision, "
        "checkpointing) to go further";
    out.push_back(std::move(f));
  }
  if (ran.size() < 2) return out;

  const auto best = std::max_element(
      ran.begin(), ran.end(), [](auto& a, auto& b) { return *a.items_per_s < *b.items_per_s; });
  const double max_rate = *best->items_per_s;
  const auto& last = ran.back();
  const auto& before = ran[ran.size() - 2];
  const double gain = *last.items_per_s / *before.items_per_s - 1.0;
  if (gain > kStillRising && !smallest_oom) {
    out.push_back({
        "batch_too_small",
        Severity::info,
        "Throughput still rising at the largest batch tried",
        fmt::format("batch {} -> {}: {:+.0f}% throughput", before.batch, last.batch, gain * 100),
        "Try larger batches (dlprobe run --max-batch) if training quality allows",
        {{"gain", gain},
         {"batch", static_cast<double>(last.batch)},
         {"items_per_s", *last.items_per_s}},
    });
  }
  std::vector<std::string> small;
  for (const auto& p : ran) {
    if (*p.items_per_s < kSmallBatchShare * max_rate) small.push_back(std::to_string(p.batch));
  }
  if (!small.empty()) {
    out.push_back({
        "small_batch_slow",
        Severity::info,
        "Small batches leave the GPU under-used",
        fmt::format("batch {} below {:.0f}% of the best throughput ({:.0f}/s at batch {})",
                    fmt::join(small, ", "), kSmallBatchShare * 100, max_rate, best->batch),
        "Prefer a batch near the best one; at small batches launch overhead dominates (CUDA "
        "graphs / torch.compile mode=reduce-overhead help)",
        {{"best_items_per_s", max_rate}, {"best_batch", static_cast<double>(best->batch)}},
    });
  }
  if (best->batch < last.batch && *last.items_per_s < kFallingShare * max_rate) {
    out.push_back({
        "throughput_falls",
        Severity::warning,
        "Throughput falls at larger batches",
        fmt::format("{:.0f}/s at batch {}, {:.0f}/s at batch {}", max_rate, best->batch,
                    *last.items_per_s, last.batch),
        "Past the best batch the step gets slower per item (memory pressure, allocator retries, "
        "algorithm choice): use batch " +
            std::to_string(best->batch),
        {{"best_batch", static_cast<double>(best->batch)},
         {"best_items_per_s", max_rate},
         {"largest_items_per_s", *last.items_per_s}},
    });
  }
  return out;
}

}  // namespace dlprobe::diagnosis
