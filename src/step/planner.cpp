// The planner's passes, top to bottom: forward through the layers and the loss, backward through
// the loss and the layers in reverse, then the optimizer update; and the bookkeeping of parameter
// copies and gradients they share.
#include "planner.h"

#include <fmt/format.h>

#include <algorithm>

namespace dlprobe::engine::step_impl {

Status Planner::run(const std::vector<Shape>& shapes) {
  prepare(shapes);
  DLPROBE_RETURN_IF_ERROR(forward_pass());
  if (!s_.training()) return Status::ok();
  DLPROBE_RETURN_IF_ERROR(backward_pass());
  if (s_.config.mode == StepMode::train) update();
  return Status::ok();
}

void Planner::prepare(const std::vector<Shape>& shapes) {
  shapes_ = shapes;
  const auto& layers = s_.model.layers();
  const std::size_t values = shapes.size();
  value_.assign(values, nullptr);
  saved_.assign(values, false);
  consumers_.assign(values, 0);
  grad_.assign(values, nullptr);
  conv_input_.assign(layers.size(), nullptr);
  recast_.assign(layers.size(), false);
  bn_mean_.assign(layers.size(), nullptr);
  bn_invstd_.assign(layers.size(), nullptr);
  for (const model::Layer& l : layers) {
    for (const int v : l.inputs) ++consumers_[static_cast<std::size_t>(v)];
    if (!s_.training()) continue;
    const model::SavedForBackward saves = model::saved_for_backward(l.kind);
    if (saves.input) saved_[static_cast<std::size_t>(l.inputs[0])] = true;
    if (saves.output) saved_[static_cast<std::size_t>(l.output)] = true;
  }
  value_[model::kImages] = s_.images;
  producer_.assign(values, -1);
  for (std::size_t i = 0; i < layers.size(); ++i)
    producer_[static_cast<std::size_t>(layers[i].output)] = static_cast<int>(i);
  plan_fusion();
  plan_conv_fusion();
  plan_pool_recompute();
  plan_block_recompute();
}

void Planner::plan_pool_recompute() {
  const auto& layers = s_.model.layers();
  pool_from_bn_.assign(layers.size(), -1);
  pool_positions_.assign(layers.size(), nullptr);
  if (!s_.training() || !be_.recomputes_max_pool_input()) return;
  for (std::size_t i = 2; i < layers.size(); ++i) {
    const int in = layers[i].inputs[0];
    if (layers[i].kind != LayerKind::max_pool || !folded_[i - 1] ||
        fusion_[i - 2] != Fusion::relu || layers[i - 1].output != in ||
        consumers_[static_cast<std::size_t>(in)] != 1) {
      continue;
    }
    pool_from_bn_[i] = static_cast<int>(i - 2);
    saved_[static_cast<std::size_t>(in)] = false;
  }
}

void Planner::plan_block_recompute() {
  const auto& layers = s_.model.layers();
  recompute_from_.assign(shapes_.size(), -1);
  rerun_.assign(shapes_.size(), false);
  recomputed_.assign(shapes_.size(), nullptr);
  if (!s_.training() || !s_.config.recompute_block_outputs) return;
  // In layer order, so that a block's shortcut (the block before it) is decided first.
  for (std::size_t i = 0; i + 2 < layers.size(); ++i) {
    if (fusion_[i] != Fusion::add_relu || !summed_[i]) continue;
    const auto sc = static_cast<std::size_t>(shortcut_of(i));
    const int from = producer_[sc];
    const bool projection = from >= 0 && summed_[static_cast<std::size_t>(from)] &&
                            fusion_[static_cast<std::size_t>(from)] == Fusion::none &&
                            consumers_[sc] == 1;
    if (recompute_from_[sc] < 0 && !saved_[sc] && !projection) continue;
    recompute_from_[static_cast<std::size_t>(layers[i + 2].output)] = static_cast<int>(i);
  }
  // The backward first reads a chain's last output (a stage's output, read by the next stage) and
  // recomputes the whole chain then, while the later layers' activations are still held. Where
  // the chain is larger than all the activations kept after it, that would raise the peak (at
  // batch 256 the whole of ResNet-50's layer3 beside layer4's own): that output is kept instead.
  std::vector<std::int64_t> chain(shapes_.size(), 0);  // elements of the chain ending at a value
  std::vector<bool> extended(shapes_.size(), false);   // the shortcut of a later recomputed output
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const auto out = static_cast<std::size_t>(layers[i].output);
    if (recompute_from_[out] < 0) continue;
    const auto sc =
        static_cast<std::size_t>(shortcut_of(static_cast<std::size_t>(recompute_from_[out])));
    chain[out] = shapes_[out].numel() + (recompute_from_[sc] >= 0 ? chain[sc] : 0);
    if (recompute_from_[sc] >= 0) extended[sc] = true;
  }
  // Later chains first: an output kept counts among the activations after the chains before it.
  for (std::size_t v = shapes_.size(); v-- > 0;) {
    if (recompute_from_[v] < 0 || extended[v]) continue;
    std::int64_t after = 0;
    for (std::size_t w = 0; w < shapes_.size(); ++w) {
      // A BN + ReLU output that a convolution applies is never stored.
      const int p = producer_[w];
      const bool applied = p > 0 && folded_[static_cast<std::size_t>(p)] &&
                           applied_[static_cast<std::size_t>(p - 1)];
      if (p > producer_[v] && saved_[w] && recompute_from_[w] < 0 && !applied) {
        after += shapes_[w].numel();
      }
    }
    if (chain[v] > after) recompute_from_[v] = -1;
  }
  // Where a recomputed output's shortcut is a projection (the batch norm that takes in the add
  // is then the projection branch's own, and the shortcut the main branch's), the projection's
  // convolution output is read by that batch norm alone: once by its forward, and in the
  // backward by the recomputation and its own backward, both after the output's first read.
  // Running the 1x1 convolution again costs less than keeping its output (in ResNet-50 at batch
  // 256 layer1's is 392 MiB, held at the recomputed step's peak in layer3's backward).
  for (std::size_t v = 0; v < shapes_.size(); ++v) {
    if (recompute_from_[v] < 0) continue;
    const auto bn = static_cast<std::size_t>(recompute_from_[v]);
    const int from = producer_[static_cast<std::size_t>(shortcut_of(bn))];
    const auto conv_out = static_cast<std::size_t>(layers[bn].inputs[0]);
    const int conv = producer_[conv_out];
    if (from < 0 || layers[static_cast<std::size_t>(from)].kind != LayerKind::batch_norm ||
        fusion_[static_cast<std::size_t>(from)] != Fusion::none || conv < 0 ||
        layers[static_cast<std::size_t>(conv)].kind != LayerKind::conv ||
        applies_[static_cast<std::size_t>(conv)] >= 0 || consumers_[conv_out] != 1) {
      continue;
    }
    // The convolution's input must be kept: were it recomputed, running the convolution at the
    // output's first read would recompute the chain before it then, and hold it through the
    // whole block's backward (ResNet-50 fp16 at batch 256: a predicted peak of 8.13 GiB, against
    // 5.93 with this rule). Nor may it be the images, whose cast the weight gradient makes again.
    const int in = layers[static_cast<std::size_t>(conv)].inputs[0];
    if (in == model::kImages || recompute_from_[static_cast<std::size_t>(in)] >= 0) continue;
    rerun_[conv_out] = true;
  }
}

void Planner::plan_fusion() {
  const auto& layers = s_.model.layers();
  fusion_.assign(layers.size(), Fusion::none);
  folded_.assign(layers.size(), false);
  if (!s_.config.fuse || !be_.fuses_batch_norm_relu()) return;
  auto only_reader = [&](std::size_t at, LayerKind kind, int value) {
    return at < layers.size() && layers[at].kind == kind &&
           consumers_[static_cast<std::size_t>(value)] == 1 &&
           std::find(layers[at].inputs.begin(), layers[at].inputs.end(), value) !=
               layers[at].inputs.end();
  };
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].kind != LayerKind::batch_norm) continue;
    if (only_reader(i + 1, LayerKind::relu, layers[i].output)) {
      fusion_[i] = Fusion::relu;
      folded_[i + 1] = true;
    } else if (only_reader(i + 1, LayerKind::add, layers[i].output) &&
               only_reader(i + 2, LayerKind::relu, layers[i + 1].output)) {
      fusion_[i] = Fusion::add_relu;
      folded_[i + 1] = true;
      folded_[i + 2] = true;
    }
  }
}

// A batch norm reading a convolution's output, which nothing else reads, takes its sums from that
// convolution. Where it also takes its ReLU (Fusion::relu) and the ReLU's output is read by one
// convolution alone, that convolution applies both to its input.
void Planner::plan_conv_fusion() {
  const auto& layers = s_.model.layers();
  const std::size_t n = layers.size();
  sums_for_.assign(n, -1);
  applies_.assign(n, -1);
  summed_.assign(n, false);
  applied_.assign(n, false);
  bn_sum_.assign(n, nullptr);
  bn_sqsum_.assign(n, nullptr);
  bn_scale_.assign(n, nullptr);
  bn_bias_.assign(n, nullptr);
  pending_finalize_.clear();
  paired_.assign(n, -1);
  deferred_.assign(n, false);
  backward_taken_.assign(n, false);
  if (!s_.config.fuse || !s_.config.fuse_conv || !s_.training() ||
      !be_.fuses_conv_batch_norm(s_.act(), s_.config.layout)) {
    return;
  }
  fuse_data_gradients_ = true;
  auto only_reader_of = [&](int value) -> int {
    if (consumers_[static_cast<std::size_t>(value)] != 1) return -1;
    for (std::size_t k = 0; k < n; ++k) {
      const auto& in = layers[k].inputs;
      if (std::find(in.begin(), in.end(), value) != in.end()) return static_cast<int>(k);
    }
    return -1;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (layers[i].kind != LayerKind::batch_norm) continue;
    const int input = layers[i].inputs[0];
    const int conv = producer_[static_cast<std::size_t>(input)];
    // The stem's convolution reads the 3-channel images, for which cuDNN's fused engine ran
    // 3.47 ms against 0.97 ms for the plain one (ResNet-50, fp16 bs256, H200): its batch norm
    // keeps its own statistics pass.
    if (conv < 0 || layers[static_cast<std::size_t>(conv)].kind != LayerKind::conv ||
        layers[static_cast<std::size_t>(conv)].inputs[0] == model::kImages ||
        only_reader_of(input) != static_cast<int>(i)) {
      continue;
    }
    sums_for_[static_cast<std::size_t>(conv)] = static_cast<int>(i);
    summed_[i] = true;
    if (fusion_[i] != Fusion::relu) continue;
    const int next = only_reader_of(layers[i + 1].output);
    if (next < 0 || layers[static_cast<std::size_t>(next)].kind != LayerKind::conv) continue;
    // Where the backend asks for it, the batch norm takes its own pass and its output is kept: the
    // convolution and its weight gradient read it as it is, and the weight gradient applies it
    // no more. Not where the step recomputes to hold less.
    if (!s_.config.recompute_block_outputs) {
      const Result<TensorDesc> out = make_desc(
          shapes_[static_cast<std::size_t>(layers[i + 1].output)], s_.act(), s_.config.layout);
      if (out && be_.keeps_normalised_conv_input(out.value())) continue;
    }
    applies_[static_cast<std::size_t>(next)] = static_cast<int>(i);
    applied_[i] = true;
  }
  // A block output whose shortcut is a summed batch norm's output that only the add reads: both
  // batch norms in the block output's one pass, and the shortcut's output is never written.
  for (std::size_t i = 0; i < n; ++i) {
    if (fusion_[i] != Fusion::add_relu || !summed_[i]) continue;
    const auto sc = static_cast<std::size_t>(shortcut_of(i));
    const int from = producer_[sc];
    if (from < 0 || layers[static_cast<std::size_t>(from)].kind != LayerKind::batch_norm) continue;
    const auto f = static_cast<std::size_t>(from);
    if (!summed_[f] || fusion_[f] != Fusion::none || applied_[f] || consumers_[sc] != 1) continue;
    paired_[i] = from;
    deferred_[f] = true;
  }
}

// The layers in order, then the loss over the logits.
Status Planner::forward_pass() {
  cast_working_copies();
  const auto& layers = s_.model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) DLPROBE_RETURN_IF_ERROR(forward(layers[i], i));
  // Every applied or deferred batch norm's finalize went into the call that applies it.
  if (!pending_finalize_.empty()) {
    return {Errc::internal,
            "step plan: " + layers[pending_finalize_.begin()->first].name + " was never finalized"};
  }

  // autocast runs cross-entropy in fp32: low-precision logits are cast up first.
  const std::string loss = "loss";
  Buffer* logits = value_of(s_.model.logits());
  if (logits->view.desc.dtype() != s_.master()) {
    logits = cast_to(logits, s_.master(),
                     s_.training() ? Category::activations : Category::temporaries, loss, "logits");
  }
  s_.logits = logits;
  Buffer* labels = s_.labels;
  Buffer* loss_buf = s_.loss;
  emit("loss.forward", CallKind::cross_entropy_forward, loss, {logits, labels, loss_buf},
       [&be = be_, logits, labels, loss_buf] {
         return be.cross_entropy_forward(logits->view, labels->view, loss_buf->view);
       });
  return Status::ok();
}

// The loss's gradient (scaled by the loss scale), then the layers in reverse; each value's
// gradient is released once the layer that wrote the value has passed it on. Every buffer this
// pass makes holds a gradient, and is marked so, but for the block outputs it recomputes.
Status Planner::backward_pass() {
  const std::size_t first_new = s_.buffers.size();
  DLPROBE_RETURN_IF_ERROR(backward_layers());
  for (std::size_t k = first_new; k < s_.buffers.size(); ++k) s_.buffers[k]->gradient = true;
  for (Buffer* b : recompute_buffers_) b->gradient = false;
  return Status::ok();
}

Status Planner::backward_layers() {
  const std::string loss = "loss";
  Buffer* logits = s_.logits;
  Buffer* labels = s_.labels;
  Buffer* dlogits = temporary_like(logits, loss);
  // The loss scale is read from the counters when the call runs; none (1) without scaling.
  const TensorView counters = s_.scaling() ? s_.counters->view : TensorView{};
  emit("loss.backward", CallKind::cross_entropy_backward, loss, {logits, labels, dlogits},
       [&be = be_, logits, labels, dlogits, counters] {
         return be.cross_entropy_backward(logits->view, labels->view, counters, dlogits->view);
       });
  Buffer* dlow = dlogits;
  if (s_.act() != s_.master())
    dlow = cast_to(dlogits, s_.act(), Category::temporaries, loss, "grad");
  contribute(s_.model.logits(), dlow, loss);
  const auto& layers = s_.model.layers();
  for (std::size_t i = layers.size(); i-- > 0;) {
    DLPROBE_RETURN_IF_ERROR(backward(layers[i], i));
    release_grad(layers[i].output);
  }
  cast_gradients();
  return Status::ok();
}

// One optimizer call over every parameter; under fp16 the gradients are unscaled first and the
// update skipped where they hold inf/NaN. Then the counters advance (the step count, and under
// fp16 the loss scale as GradScaler.update moves it): every value a later step's calls read comes
// from the counters when they run, so a recorded step replays as it ran eagerly.
void Planner::update() {
  std::vector<TensorView> grads;
  std::vector<OptimizerSlot> slots;
  for (const StateSlot& slot : s_.state) {
    if (slot.grad == nullptr) continue;
    grads.push_back(slot.grad->view);
    slots.push_back({slot.master->view, slot.grad->view,
                     slot.state0 != nullptr ? slot.state0->view : TensorView{},
                     slot.state1 != nullptr ? slot.state1->view : TensorView{}});
  }
  const TensorView counters = s_.counters->view;
  const TensorView found_inf = s_.found_inf != nullptr ? s_.found_inf->view : TensorView{};
  if (s_.found_inf != nullptr) {
    Buffer* flag = s_.found_inf;
    // The flag collects over one step only.
    drafts_.insert(drafts_.begin(),
                   Draft{Call{"grad_scaler.reset_found_inf", CallKind::fill, "grad_scaler",
                              [&be = be_, flag] { return be.fill(flag->view, 0.0); }},
                         {flag},
                         {}});
    emit("grad_scaler.unscale", CallKind::unscale_gradients, "grad_scaler", {},
         [&be = be_, grads, counters, found_inf] {
           return be.unscale_gradients(grads, counters, found_inf);
         });
  }
  if (s_.config.optimizer == OptimizerKind::sgd) {
    emit("optimizer.sgd_step", CallKind::sgd_step, "optimizer", {},
         [&be = be_, slots, p = s_.config.sgd, counters, found_inf] {
           return be.sgd_step(slots, p, counters, found_inf);
         });
  } else {
    emit("optimizer.adamw_step", CallKind::adamw_step, "optimizer", {},
         [&be = be_, slots, p = s_.config.adamw, counters, found_inf] {
           return be.adamw_step(slots, p, counters, found_inf);
         });
  }
  const GradScalerOptions* scaler = s_.found_inf != nullptr ? &s_.config.scaler : nullptr;
  emit("optimizer.advance_step", CallKind::advance_step, "optimizer", {},
       [&be = be_, counters, scaler, found_inf] {
         return be.advance_step(counters, scaler, found_inf);
       });
}

void Planner::emit(std::string name, CallKind kind, const std::string& layer,
                   std::vector<Buffer*> uses, std::function<Status()> fn) {
  drafts_.push_back({Call{std::move(name), kind, layer, std::move(fn)}, std::move(uses), {}});
}

void Planner::to_second_stream(std::vector<Buffer*> writes) {
  if (s_.config.streams < 2 || be_.streams() < 2) return;
  Draft& d = drafts_.back();
  d.call.stream = 1;
  d.writes = std::move(writes);
}

void Planner::emit_unary(std::string name, CallKind kind, const std::string& layer, UnaryOp op,
                         Buffer* x, Buffer* y) {
  emit(std::move(name), kind, layer, {x, y},
       [&be = be_, op, x, y] { return (be.*op)(x->view, y->view); });
}

Result<Buffer*> Planner::new_value(const std::string& owner, Category category, const Shape& shape,
                                   DType dtype) {
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc d, make_desc(shape, dtype, s_.config.layout));
  return s_.transient(d, category, owner);
}

Buffer* Planner::cast_to(Buffer* src, DType dtype, Category category, const std::string& layer,
                         const std::string& what) {
  Buffer* dst = s_.transient(src->view.desc.with_dtype(dtype), category, layer);
  emit_cast(fmt::format("{}.{}.cast", layer, what), layer, src, dst);
  return dst;
}

int Planner::entry_of(std::size_t layer, StateKind kind) const {
  const auto& st = s_.model.state();
  for (std::size_t i = 0; i < st.size(); ++i) {
    if (static_cast<std::size_t>(st[i].layer) == layer && st[i].kind == kind)
      return static_cast<int>(i);
  }
  return -1;
}

void Planner::emit_cast_many(std::string name, const std::string& layer, std::vector<Buffer*> src,
                             std::vector<Buffer*> dst) {
  if (src.empty()) return;
  std::vector<Buffer*> uses = src;
  uses.insert(uses.end(), dst.begin(), dst.end());
  emit(std::move(name), CallKind::cast, layer, std::move(uses),
       [&be = be_, src = std::move(src), dst = std::move(dst)] {
         std::vector<TensorView> from;
         std::vector<TensorView> to;
         for (const Buffer* b : src) from.push_back(b->view);
         for (const Buffer* b : dst) to.push_back(b->view);
         return be.cast_many(from, to);
       });
}

void Planner::cast_working_copies() {
  std::vector<Buffer*> masters;
  std::vector<Buffer*> working;
  for (const StateSlot& w : s_.state) {
    if (w.working == nullptr) continue;
    masters.push_back(w.master);
    working.push_back(w.working);
  }
  emit_cast_many("weights.cast", "weights", std::move(masters), std::move(working));
}

Buffer* Planner::weight_for_forward(int entry) const {
  const StateSlot& w = slot(entry);
  return w.working != nullptr ? w.working : w.master;
}

Buffer* Planner::weight_for_backward(int entry) const {
  const StateSlot& w = slot(entry);
  return w.working != nullptr ? w.working : w.master;
}

Buffer* Planner::grad_target(int entry, const std::string& layer) {
  const StateSlot& p = slot(entry);
  if (p.working == nullptr) return p.grad;
  return temporary_like(p.working, layer);
}

void Planner::finish_grad(int entry, Buffer* target) {
  Buffer* grad = slot(entry).grad;
  if (target == grad) return;
  grad_low_.push_back(target);
  grad_high_.push_back(grad);
}

void Planner::cast_gradients() {
  emit_cast_many("weights.grad.cast", "weights", std::move(grad_low_), std::move(grad_high_));
  grad_low_.clear();
  grad_high_.clear();
}

void Planner::contribute(int v, Buffer* g, const std::string& layer) {
  Buffer*& cur = grad_[static_cast<std::size_t>(v)];
  if (cur == nullptr) {
    cur = g;
    ++sharers_[g];
    return;
  }
  Buffer* out = cur;
  if (sharers_[cur] > 1) {
    --sharers_[cur];
    out = temporary_like(cur, layer);
    ++sharers_[out];
  }
  Buffer* a = cur;
  emit(layer + ".grad_accumulate", CallKind::add, layer, {a, g, out},
       [&be = be_, a, g, out] { return be.add(a->view, g->view, out->view); });
  last_sum_ = {drafts_.size() - 1, a, g, out};
  cur = out;
}

bool Planner::pending_sum(Buffer* dy) {
  const bool last = !drafts_.empty() && last_sum_.draft == drafts_.size() - 1;
  return last && last_sum_.out == dy && sharers_[dy] == 1;
}

bool Planner::fuse_data_gradient(const std::string& name, Buffer* add, Buffer* term, Buffer* y,
                                 Buffer* dx) {
  const auto found = data_gradients_.find(term);
  if (found == data_gradients_.end()) return false;
  const DataGradient g = found->second;
  data_gradients_.erase(found);
  // The data gradient's call, and no other, may use `term`: the sum that read it was dropped.
  auto writer = drafts_.end();
  for (auto d = drafts_.begin(); d != drafts_.end(); ++d) {
    if (std::find(d->uses.begin(), d->uses.end(), term) == d->uses.end()) continue;
    if (writer != drafts_.end() || d->call.kind != CallKind::conv_backward_data) return false;
    writer = d;
  }
  if (writer == drafts_.end()) return false;
  drafts_.erase(writer);
  emit(g.layer + ".backward_data+" + name + ".backward+grad_accumulate",
       CallKind::conv_backward_data_add_relu, g.layer, {g.dy, g.w, add, y, dx},
       [&be = be_, dy = g.dy, w = g.w, add, y, dx, p = g.p] {
         return be.conv2d_backward_data_add_relu(dy->view, w->view, add->view, y->view, dx->view,
                                                 p);
       });
  return true;
}

void Planner::release_grad(int v) {
  Buffer*& cur = grad_[static_cast<std::size_t>(v)];
  if (cur != nullptr) --sharers_[cur];
  cur = nullptr;
}

}  // namespace dlprobe::engine::step_impl
