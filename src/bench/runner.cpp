#include "dlprobe/bench/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dlprobe/bench/host_cpu.h"
#include "dlprobe/core/clock.h"
#include "dlprobe/core/log.h"
#include "dlprobe/data/cuda_queues.h"
#include "dlprobe/engine/safetensors.h"
#include "dlprobe/models/resnet.h"

namespace dlprobe::bench {
namespace {

using Clock = std::chrono::steady_clock;
// Timed steps queued ahead of the device at most (see the timed loop).
constexpr std::int64_t kInFlight = 4;

bool interrupted(const std::atomic<int>* flag) {
  return flag != nullptr && flag->load() > 0;
}

}  // namespace

Status check_protocol(const Protocol& p) {
  if (p.warmup_steps < 0) {
    return invalid_argument(fmt::format("warm-up steps must be >= 0, got {}", p.warmup_steps));
  }
  if (!(p.warmup_seconds >= 0) || !std::isfinite(p.warmup_seconds)) {
    return invalid_argument(fmt::format("warm-up time must be >= 0 s, got {}", p.warmup_seconds));
  }
  if (p.min_steps < 1) {
    return invalid_argument(fmt::format("timed steps must be >= 1, got {}", p.min_steps));
  }
  if (!(p.min_seconds >= 0) || !std::isfinite(p.min_seconds)) {
    return invalid_argument(fmt::format("timed window must be >= 0 s, got {}", p.min_seconds));
  }
  if (p.repeat < 1) return invalid_argument(fmt::format("repeat must be >= 1, got {}", p.repeat));
  if (p.max_steps < p.min_steps) {
    return invalid_argument(fmt::format("at most {} steps per window, fewer than the {} asked for",
                                        p.max_steps, p.min_steps));
  }
  if (p.warmup_max_steps < p.warmup_steps) {
    return invalid_argument(fmt::format("at most {} warm-up steps, fewer than the {} asked for",
                                        p.warmup_max_steps, p.warmup_steps));
  }
  if (p.max_restarts < 0) {
    return invalid_argument(fmt::format("restarts must be >= 0, got {}", p.max_restarts));
  }
  if (p.steady.window < 4 || !(p.steady.slow_step > 1) || !(p.steady.min_fall >= 0) ||
      !(p.steady.alpha > 0 && p.steady.alpha < 1)) {
    return invalid_argument(
        "steady-state rule out of range (window >= 4 steps, slow step > 1, fall >= 0, alpha in "
        "(0, 1))");
  }
  return Status::ok();
}

Result<Warmup> warm_up(const Protocol& p, const std::function<Result<double>()>& step,
                       const std::atomic<int>* interrupt,
                       const std::function<void(std::int64_t, double)>& progress) {
  Warmup w;
  for (;;) {
    const auto steps = static_cast<std::int64_t>(w.step_seconds.size());
    if (p.until_steady) {
      if (steps >= p.warmup_steps && stats::steady_state(w.step_seconds, p.steady).steady) {
        w.steady = true;
        break;
      }
      if (steps >= p.warmup_max_steps || w.seconds >= p.warmup_seconds) break;
    } else if (steps >= p.warmup_steps && w.seconds >= p.warmup_seconds) {
      break;
    }
    if (interrupted(interrupt)) {
      w.interrupted = true;
      break;
    }
    DLPROBE_ASSIGN_OR_RETURN(const double seconds, step());
    w.step_seconds.push_back(seconds);
    w.seconds += seconds;
    if (progress) progress(steps + 1, w.seconds);
  }
  return w;
}

std::int64_t BenchResult::timed_steps() const {
  std::int64_t n = 0;
  for (const Window& w : windows) n += static_cast<std::int64_t>(w.step_seconds.size());
  return n;
}

std::vector<double> BenchResult::step_seconds() const {
  std::vector<double> out;
  for (const Window& w : windows)
    out.insert(out.end(), w.step_seconds.begin(), w.step_seconds.end());
  return out;
}

double BenchResult::timed_seconds() const {
  double s = 0;
  for (const Window& w : windows) {
    for (double t : w.step_seconds) s += t;
  }
  return s;
}

Result<BenchResult> run_bench(device::Engine& e, const BenchOptions& o, const Hooks& hooks) {
  DLPROBE_RETURN_IF_ERROR(check_protocol(o.protocol));
  if (o.profile_steps < 0) {
    return invalid_argument(fmt::format("profile steps must be >= 0, got {}", o.profile_steps));
  }
  DLPROBE_RETURN_IF_ERROR(e.supports(o.step.precision));
  // A missing or unreadable weights file is reported before any memory is taken.
  safetensors::File weights;
  if (!o.weights.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(weights, safetensors::read_file(o.weights));
  }
  const auto report = [&](Progress p) {
    if (hooks.progress) hooks.progress(p);
  };
  report({});
  // A clean start: whatever the last configuration cached goes back to the device, and the peaks
  // are this configuration's alone.
  DLPROBE_RETURN_IF_ERROR(e.allocator().empty_cache());
  e.allocator().reset_peak_stats();

  BenchResult r;
  const auto setup_start = Clock::now();
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<engine::TrainingStep> step,
                           engine::TrainingStep::create(o.step, e.backend(), e.allocator()));
  if (!o.weights.empty()) {
    const Status loaded = step->load_state_dict(weights);
    if (!loaded.is_ok()) return loaded.with_context(o.weights);
  }
  const engine::StepConfig& c = o.step;
  const Shape image_shape{c.batch, 3, c.model.image_size, c.model.image_size};
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc image_desc, TensorDesc::make(image_shape, DType::fp32));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc label_desc, TensorDesc::make(Shape{c.batch}, DType::int64));
  const HostTensor images = HostTensor::random(image_desc, o.data_seed, -2.0, 2.0);
  const HostTensor labels =
      HostTensor::random(label_desc, o.data_seed + 1, 0.0, static_cast<double>(c.model.classes));
  DLPROBE_RETURN_IF_ERROR(step->set_input(images, labels));
  log_debug("bench: input drawn and uploaded");
  std::unique_ptr<InputFeed> feed;
  if (o.data != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(feed, open_jpeg_feed(*o.data, *step, e.device()));
    r.input.emplace();
    r.input->input = feed->input();
    r.input->decoder = feed->decoder();
    r.input->threads = feed->threads();
    if (r.input->input == "jpeg-gpu") r.input->cuda_queues = data::narrow_cuda_queues();
  }
  // The next batch from the feed, if any; its fetch time counted while `timed`.
  const auto next_input = [&](bool timed) -> Status {
    if (!feed) return Status::ok();
    DLPROBE_ASSIGN_OR_RETURN(const FeedTimes times, feed->feed(*step));
    if (timed) {
      r.input->fetch_seconds += times.ready;
      r.input->upload_seconds += times.upload;
      ++r.input->batches;
    }
    return Status::ok();
  };
  DLPROBE_RETURN_IF_ERROR(e.backend().synchronize());
  r.setup_seconds = seconds_since(setup_start);

  const Protocol& p = o.protocol;
  const auto batch = static_cast<double>(c.batch);
  {
    // Warm-up is not timed, so each step may wait for its end: otherwise the host's clock passes
    // warmup_seconds while the device is still hundreds of queued steps behind.
    const auto one_step = [&]() -> Result<double> {
      DLPROBE_RETURN_IF_ERROR(next_input(false));
      const auto begin = Clock::now();
      DLPROBE_RETURN_IF_ERROR(step->enqueue());
      DLPROBE_RETURN_IF_ERROR(e.backend().synchronize());
      return seconds_since(begin);
    };
    DLPROBE_ASSIGN_OR_RETURN(
        Warmup warmup, warm_up(p, one_step, o.interrupt, [&](std::int64_t steps, double seconds) {
          report({Progress::Phase::warmup, 0, steps, seconds, 0.0});
        }));
    r.warmup_steps = static_cast<std::int64_t>(warmup.step_seconds.size());
    r.warmup_seconds = warmup.seconds;
    r.warmup_step_seconds = std::move(warmup.step_seconds);
    r.until_steady = p.until_steady;
    r.warmup_steady = warmup.steady;
    r.interrupted = warmup.interrupted;
    if (r.warmup_steps > 0) DLPROBE_RETURN_IF_ERROR(step->collect().status());
    DLPROBE_RETURN_IF_ERROR(e.backend().synchronize());
  }
  e.allocator().reset_peak_stats();

  for (int w = 0; w < p.repeat && !r.interrupted;) {
    if (hooks.window_begin) hooks.window_begin(w);
    Window window;
    window.host_begin_ns = steady_now_ns();
    const std::optional<CpuTimes> cpu_begin = read_cpu_times();
    const auto start = Clock::now();
    std::int64_t k = 0;
    while (k < p.max_steps && (k < p.min_steps || seconds_since(start) < p.min_seconds)) {
      if (interrupted(o.interrupt)) {
        r.interrupted = true;
        break;
      }
      // A feed's batch is made while the step before runs; its set_input waits for that step, so
      // a step's time (mark to mark) includes any wait for its successor's input.
      DLPROBE_RETURN_IF_ERROR(next_input(true));
      DLPROBE_RETURN_IF_ERROR(e.backend().mark(static_cast<std::size_t>(k)));
      DLPROBE_RETURN_IF_ERROR(step->enqueue());
      ++k;
      // At most kInFlight steps queued ahead of the device. A replayed graph is one launch, and
      // unbounded the host queued hundreds of steps before its clock passed min_seconds (on an
      // H200, fp32 bs 128: 536 steps, 63 s for a 3 s window). The wait is for the start of the
      // step kInFlight back, so the device never runs dry and no step waits for its own end.
      if (k > kInFlight) {
        DLPROBE_RETURN_IF_ERROR(e.backend().wait_for_mark(static_cast<std::size_t>(k - kInFlight)));
      }
      const double host = seconds_since(start);
      report({Progress::Phase::timing, w, k, host,
              host > 0 ? batch * static_cast<double>(k) / host : 0.0});
    }
    if (k > 0) {
      DLPROBE_RETURN_IF_ERROR(e.backend().mark(static_cast<std::size_t>(k)));
      DLPROBE_ASSIGN_OR_RETURN(r.last, step->collect());
    }
    DLPROBE_RETURN_IF_ERROR(e.backend().synchronize());
    window.host_end_ns = steady_now_ns();
    if (const std::optional<CpuTimes> cpu_end = read_cpu_times(); cpu_begin && cpu_end) {
      window.other_cpu_seconds = other_cpu_seconds(*cpu_begin, *cpu_end);
    }
    if (hooks.window_end) hooks.window_end(w);
    for (std::int64_t i = 0; i < k; ++i) {
      DLPROBE_ASSIGN_OR_RETURN(
          const double ms,
          e.backend().elapsed_ms(static_cast<std::size_t>(i), static_cast<std::size_t>(i + 1)));
      window.step_seconds.push_back(ms / 1e3);
    }
    // A first window that starts unsettled was still warm-up: it joins the curve, and the window
    // is timed again.
    if (p.until_steady && w == 0 && !r.interrupted && r.restarts < p.max_restarts &&
        stats::unsettled_prefix(window.step_seconds, p.steady.slow_step) > 0) {
      if (hooks.window_discarded) hooks.window_discarded(w);
      r.warmup_steps += k;
      for (double t : window.step_seconds) r.warmup_seconds += t;
      r.warmup_step_seconds.insert(r.warmup_step_seconds.end(), window.step_seconds.begin(),
                                   window.step_seconds.end());
      ++r.restarts;
      continue;
    }
    if (k > 0) r.windows.push_back(std::move(window));
    ++w;
  }
  r.memory = e.allocator().stats();
  r.arena_fullest =
      memory::arena_fullest(*step, r.memory[memory::Category::arena].allocated_bytes_peak);
  r.graph_replayed = step->graph_recorded();
  r.recomputed_block_outputs = step->config().recompute_block_outputs;
  if (o.step.recompute_block_outputs && !r.recomputed_block_outputs) {
    log_warn(
        "{} {}: the step keeps its block outputs: recomputing them needs batch norm inside "
        "the convolutions, which this backend does not run here",
        engine::precision_name(c.precision), layout_name(c.layout));
  }
  if (feed) r.input->skipped = feed->skipped();

  if (o.profile_steps > 0 && !r.interrupted) {
    std::vector<std::vector<double>> runs;
    for (std::int64_t i = 0; i < o.profile_steps; ++i) {
      DLPROBE_ASSIGN_OR_RETURN(std::vector<double> ms, step->profile_step());
      runs.push_back(std::move(ms));
    }
    const std::vector<engine::Call>& calls = step->calls();
    for (std::size_t k = 0; k < calls.size(); ++k) {
      std::vector<double> v;
      for (const auto& run : runs) v.push_back(run[k]);
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      r.profile.push_back(
          {calls[k].name, std::string(engine::call_kind_name(calls[k].kind)), v[v.size() / 2]});
    }
  }
  return r;
}

Result<double> flops_per_image(const model::ModelConfig& config, engine::StepMode mode) {
  DLPROBE_ASSIGN_OR_RETURN(const model::Model m, model::Model::create(config));
  DLPROBE_ASSIGN_OR_RETURN(const std::vector<Shape> shapes, m.value_shapes(1, false));
  double forward = 0;
  double backward = 0;
  for (const model::Layer& layer : m.layers()) {
    double macs = 0;
    if (layer.kind == model::LayerKind::conv) {
      const Shape& y = shapes[static_cast<std::size_t>(layer.output)];
      macs = static_cast<double>(y[1] * y[2] * y[3]) *
             static_cast<double>(layer.in_channels / layer.conv.groups) *
             static_cast<double>(layer.kernel * layer.kernel);
    } else if (layer.kind == model::LayerKind::linear) {
      macs = static_cast<double>(layer.in_channels) * static_cast<double>(layer.out_channels);
    } else {
      continue;
    }
    forward += 2 * macs;
    backward += 2 * macs;                                              // the weight gradient
    if (layer.inputs.front() != model::kImages) backward += 2 * macs;  // the input gradient
  }
  return mode == engine::StepMode::infer ? forward : forward + backward;
}

}  // namespace dlprobe::bench
