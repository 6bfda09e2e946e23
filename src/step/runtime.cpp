// Running a planned step: the call list queued eagerly or, under StepConfig::graph, recorded once
// and replayed; the loss collected, with the counters (fp16's loss scale, which the step's own
// calls update as GradScaler does, and the optimizer's step count) as the step left them.
#include "dlprobe/core/log.h"
#include "dlprobe/step/training_step.h"
#include "step_state.h"

namespace dlprobe::engine {
namespace step_impl {

Status StepState::enqueue(const std::size_t* marks) {
  if (!input_set) return invalid_argument("set_input() must come before the first step");
  if (training()) {
    for (std::size_t i = 0; i < state.size(); ++i) {
      if (model.state()[i].kind == model::StateKind::num_batches_tracked) {
        ++state[i].num_batches_tracked;
      }
    }
  }
  if (config.graph && marks == nullptr && !graph_failed) {
    DLPROBE_ASSIGN_OR_RETURN(const bool replayed, replay_graph());
    if (replayed) {
      pending = true;
      return Status::ok();
    }
  }
  ++eager_runs;
  // Timing marks time calls one after another: a profiled step runs them all on one stream.
  const bool streams = marks == nullptr;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (marks != nullptr) DLPROBE_RETURN_IF_ERROR(backend.mark(*marks + i));
    current_call = i;
    const Status st = run_call(i, streams);
    if (!st.is_ok()) {
      // Whatever the second stream still holds must not run into the next step.
      if (streams) (void)backend.join();
      release_transients();
      pending = false;
      return st.with_context(calls[i].name);
    }
  }
  if (streams) DLPROBE_RETURN_IF_ERROR(backend.join());
  if (marks != nullptr) DLPROBE_RETURN_IF_ERROR(backend.mark(*marks + calls.size()));
  pending = true;
  return Status::ok();
}

Status StepState::run_call(std::size_t i, bool streams) {
  const Call& call = calls[i];
  if (!streams) return call.run();
  if (call.join_through >= 0) {
    DLPROBE_RETURN_IF_ERROR(
        backend.join_through(tickets.at(static_cast<std::size_t>(call.join_through))));
  }
  if (call.fork) DLPROBE_RETURN_IF_ERROR(backend.fork());
  if (call.stream == 0) return call.run();
  if (tickets.size() != calls.size()) tickets.resize(calls.size());
  DLPROBE_ASSIGN_OR_RETURN(tickets[i], backend.on_stream(call.stream, call.run));
  return Status::ok();
}

Result<bool> StepState::replay_graph() {
  // The first run builds the backend's plans eagerly; the second is recorded.
  if (!graph && eager_runs > 0) {
    Result<std::size_t> recorded = backend.capture([this]() -> Status {
      for (std::size_t i = 0; i < calls.size(); ++i) {
        const Status st = run_call(i, true);
        if (!st.is_ok()) return st.with_context(calls[i].name);
      }
      return backend.join();
    });
    if (recorded.has_value()) {
      graph = *recorded;
    } else {
      graph_failed = true;
      log_warn("the step runs eagerly: {}", recorded.status().message());
    }
  }
  if (graph) {
    DLPROBE_RETURN_IF_ERROR(backend.replay(*graph));
    return true;
  }
  // The capture at the next step sizes the graph's shared workspace from what this run's calls
  // take: a count of this step's own, not of whatever ran on the backend before it.
  if (!graph_failed) backend.reset_call_workspace_peak();
  return false;
}

}  // namespace step_impl

Status TrainingStep::enqueue() {
  return impl_->enqueue(nullptr);
}

Result<StepResult> TrainingStep::collect() {
  Impl& s = *impl_;
  if (!s.pending) return invalid_argument("no step is queued");
  s.pending = false;
  DLPROBE_ASSIGN_OR_RETURN(HostTensor loss, s.download(*s.loss));
  StepResult r;
  r.loss = loss.get(0);
  if (s.found_inf != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor found, s.download(*s.found_inf));
    // A step whose gradients held inf/NaN skipped its update (the optimizer call read the flag).
    r.skipped = found.get(0) != 0.0;
  }
  if (s.counters != nullptr) {
    StepCounters c;
    DLPROBE_RETURN_IF_ERROR(s.backend.download(&c, s.counters->view.data, sizeof c));
    r.loss_scale = c.last_loss_scale;
    s.scale = c.loss_scale;
    s.optimizer_steps = static_cast<std::int64_t>(c.steps_taken);
  }
  return r;
}

Result<StepResult> TrainingStep::run_step() {
  DLPROBE_RETURN_IF_ERROR(enqueue());
  return collect();
}

Result<std::vector<double>> TrainingStep::profile_step(std::size_t first_mark) {
  DLPROBE_RETURN_IF_ERROR(impl_->enqueue(&first_mark));
  DLPROBE_RETURN_IF_ERROR(collect().status());
  std::vector<double> ms(impl_->calls.size());
  for (std::size_t i = 0; i < ms.size(); ++i) {
    DLPROBE_ASSIGN_OR_RETURN(ms[i], impl_->backend.elapsed_ms(first_mark + i, first_mark + i + 1));
  }
  return ms;
}

}  // namespace dlprobe::engine
