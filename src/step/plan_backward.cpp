// The backward call of each layer kind: from the gradient of the layer's output, the gradient of
// its input (handed on through contribute()) and of its parameters.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "planner.h"

namespace dlprobe::engine::step_impl {

Status Planner::backward(const model::Layer& l, std::size_t i) {
  if (backward_taken_[i]) return Status::ok();
  Buffer* dy = grad_[static_cast<std::size_t>(l.output)];
  if (dy == nullptr) {
    return error(Errc::internal, fmt::format("{}: no gradient reaches the output", l.name));
  }
  const std::string& name = l.name;
  Buffer* x = value_of(l.inputs[0]);
  switch (l.kind) {
    case LayerKind::conv:
      backward_conv(l, i, dy);
      break;
    case LayerKind::batch_norm:
      backward_batch_norm(l, i, dy);
      break;
    case LayerKind::relu:
      backward_relu(l, i, dy);
      break;
    case LayerKind::max_pool: {
      Buffer* y = value_of(l.output);
      if (pool_from_bn_[i] >= 0) {
        const auto bn = static_cast<std::size_t>(pool_from_bn_[i]);
        const auto [bn_x, gamma, beta, sm, si] = batch_norm_saved(bn);
        if (be_.fuses_max_pool_batch_norm_backward(bn_x->view.desc, l.pool)) {
          backward_pool_batch_norm(l, i, dy);
          break;
        }
        // Shaped like the batch norm's input: its output, the pool's input, may never be stored.
        Buffer* dx = temporary_like(bn_x, name);
        emit(name + ".backward+" + s_.model.layers()[bn].name, CallKind::max_pool_backward, name,
             {dy, bn_x, gamma, beta, sm, si, dx},
             [&be = be_, dy, bn_x, gamma, beta, sm, si, dx, p = l.pool] {
               return be.max_pool2d_backward_recomputed(
                   dy->view, bn_x->view, gamma->view, beta->view, sm->view, si->view, dx->view, p);
             });
        contribute(l.inputs[0], dx, name);
        break;
      }
      Buffer* dx = temporary_like(x, name);
      emit(name + ".backward", CallKind::max_pool_backward, name, {dy, x, y, dx},
           [&be = be_, dy, x, y, dx, p = l.pool] {
             return be.max_pool2d_backward(dy->view, x->view, y->view, dx->view, p);
           });
      contribute(l.inputs[0], dx, name);
      break;
    }
    case LayerKind::add:
      // d(a + b) passes the gradient to both operands unchanged: shared, not copied.
      contribute(l.inputs[0], dy, name);
      contribute(l.inputs[1], dy, name);
      break;
    case LayerKind::global_avg_pool: {
      Buffer* dx = temporary_like(x, name);
      emit_unary(name + ".backward", CallKind::global_avg_pool_backward, name,
                 &Backend::global_avg_pool_backward, dy, dx);
      contribute(l.inputs[0], dx, name);
      break;
    }
    case LayerKind::linear:
      backward_linear(l, i, dy);
      break;
  }
  return Status::ok();
}

void Planner::backward_conv(const model::Layer& l, std::size_t i, Buffer* dy) {
  const std::string& name = l.name;
  const int entry = entry_of(i, StateKind::conv_weight);
  Buffer* w = weight_for_backward(entry);
  Buffer* xin = conv_input_[i];
  if (applies_[i] < 0 && xin == value_of(l.inputs[0])) xin = kept(l.inputs[0]);
  if (recast_[i]) {
    Buffer* src = value_of(l.inputs[0]);
    xin = s_.transient(src->view.desc.with_dtype(s_.act()), Category::activations, name);
    recompute_buffers_.push_back(xin);
    emit_cast(name + ".input.cast.recompute", name, src, xin);
  }
  const Conv2dParams p = l.conv;
  Buffer* dx = nullptr;
  // The images need no gradient, so conv1 skips its data gradient as autograd does.
  if (l.inputs[0] != model::kImages) {
    // Where this convolution applied a batch norm, its input was never stored; the batch norm's
    // input has its shape and dtype.
    dx = temporary_like(applies_[i] >= 0 ? xin : value_of(l.inputs[0]), name);
    emit(name + ".backward_data", CallKind::conv_backward_data, name, {dy, w, dx},
         [&be = be_, dy, w, dx, p] {
           return be.conv2d_backward_data(dy->view, w->view, dx->view, p);
         });
    if (fuse_data_gradients_) data_gradients_[dx] = {dy, w, p, name};
  }
  Buffer* dw = grad_target(entry, name);
  if (applies_[i] >= 0) {
    // The normalised input recomputed from the batch norm's input as the gradient loads it.
    const auto bn = static_cast<std::size_t>(applies_[i]);
    Buffer* scale = bn_scale_[bn];
    Buffer* bias = bn_bias_[bn];
    emit(name + ".backward_weight+" + s_.model.layers()[bn].name,
         CallKind::conv_backward_weight_fused, name, {xin, scale, bias, dy, dw},
         [&be = be_, xin, scale, bias, dy, dw, p] {
           return be.conv2d_backward_weight_fused(xin->view, scale->view, bias->view, dy->view,
                                                  dw->view, p);
         });
  } else {
    emit(name + ".backward_weight", CallKind::conv_backward_weight, name, {xin, dy, dw},
         [&be = be_, xin, dy, dw, p] {
           return be.conv2d_backward_weight(xin->view, dy->view, dw->view, p);
         });
  }
  // Nothing in the backward pass reads a weight gradient: it can run beside what follows.
  to_second_stream({dw});
  finish_grad(entry, dw);
  if (dx != nullptr) contribute(l.inputs[0], dx, name);
}

void Planner::backward_batch_norm(const model::Layer& l, std::size_t i, Buffer* dy) {
  // A block output's two summed batch norms take their one gradient (the add passed it to both)
  // together, at the first of them the backward reaches.
  const int partner = paired_[i] >= 0 ? paired_[i] : paired_by(i);
  if (partner >= 0) {
    const auto k = static_cast<std::size_t>(partner);
    if (grad_[static_cast<std::size_t>(s_.model.layers()[k].output)] == dy) {
      backward_taken_[k] = true;
      if (paired_[i] >= 0) {
        backward_batch_norm_pair(i, k, dy);
      } else {
        backward_batch_norm_pair(k, i, dy);
      }
      return;
    }
  }
  const std::string& name = l.name;
  const StateSlot& g = slot(entry_of(i, StateKind::bn_weight));
  Buffer* x = kept(l.inputs[0]);
  Buffer* gamma = g.master;
  Buffer* dgamma = g.grad;
  Buffer* dbeta = slot(entry_of(i, StateKind::bn_bias)).grad;
  Buffer* sm = bn_mean_[i];
  Buffer* si = bn_invstd_[i];
  Buffer* dx = temporary_like(x, name);
  if (fusion_[i] == Fusion::relu) {
    // dy is the gradient of the ReLU's output y, which the ReLU's backward passed on as is. Where
    // a convolution applied the pair, y was never stored and the backend recomputes it.
    // Nor is it where nothing else keeps it for the backward (a max pool that recomputes it).
    const int relu_out = s_.model.layers()[i + 1].output;
    Buffer* y = saved_[static_cast<std::size_t>(relu_out)] ? value_of(relu_out) : nullptr;
    Buffer* beta = slot(entry_of(i, StateKind::bn_bias)).master;
    std::vector<Buffer*> uses = {dy, x, gamma, beta, sm, si, dx, dgamma, dbeta};
    if (y != nullptr) uses.push_back(y);
    emit(name + ".backward+relu", CallKind::batch_norm_relu_backward, name, std::move(uses),
         [&be = be_, dy, y, x, gamma, beta, sm, si, dx, dgamma, dbeta] {
           return be.batch_norm_relu_backward(dy->view, view_or_none(y), x->view, gamma->view,
                                              beta->view, sm->view, si->view, dx->view,
                                              dgamma->view, dbeta->view);
         });
  } else {
    emit(name + ".backward", CallKind::batch_norm_backward, name,
         {dy, x, gamma, sm, si, dx, dgamma, dbeta},
         [&be = be_, dy, x, gamma, sm, si, dx, dgamma, dbeta] {
           return be.batch_norm_backward(dy->view, x->view, gamma->view, sm->view, si->view,
                                         dx->view, dgamma->view, dbeta->view);
         });
  }
  contribute(l.inputs[0], dx, name);
}

// Max pool `i`'s backward with the batch norm + ReLU it recomputes its input from (the stem), in
// one call that never stores the pool's input gradient; the ReLU's and the batch norm's layers
// then have no backward of their own.
void Planner::backward_pool_batch_norm(const model::Layer& pool, std::size_t i, Buffer* dy) {
  const auto bn = static_cast<std::size_t>(pool_from_bn_[i]);
  const model::Layer& l = s_.model.layers()[bn];
  Buffer* x = kept(l.inputs[0]);
  const auto [bn_x, gamma, beta, sm, si] = batch_norm_saved(bn);
  Buffer* dgamma = slot(entry_of(bn, StateKind::bn_weight)).grad;
  Buffer* dbeta = slot(entry_of(bn, StateKind::bn_bias)).grad;
  Buffer* dx = temporary_like(x, l.name);
  Buffer* positions = pool_positions_[i];
  std::vector<Buffer*> uses = {dy, x, gamma, beta, sm, si, dx, dgamma, dbeta};
  if (positions != nullptr) uses.push_back(positions);
  emit(pool.name + ".backward+relu+" + l.name, CallKind::batch_norm_relu_max_pool_backward,
       pool.name, std::move(uses),
       [&be = be_, dy, positions, x, gamma, beta, sm, si, dx, dgamma, dbeta, p = pool.pool] {
         return be.batch_norm_relu_max_pool_backward(dy->view, view_or_none(positions), x->view,
                                                     gamma->view, beta->view, sm->view, si->view,
                                                     dx->view, dgamma->view, dbeta->view, p);
       });
  backward_taken_[bn] = true;
  backward_taken_[i - 1] = true;  // the ReLU between them (plan_pool_recompute)
  contribute(l.inputs[0], dx, pool.name);
}

int Planner::paired_by(std::size_t shortcut) const {
  if (!deferred_[shortcut]) return -1;
  const auto it = std::find(paired_.begin(), paired_.end(), static_cast<int>(shortcut));
  return it == paired_.end() ? -1 : static_cast<int>(it - paired_.begin());
}

void Planner::backward_batch_norm_pair(std::size_t main, std::size_t shortcut, Buffer* dy) {
  const auto& layers = s_.model.layers();
  struct Side {
    Buffer* x;
    Buffer* gamma;
    Buffer* sm;
    Buffer* si;
    Buffer* dx;
    Buffer* dgamma;
    Buffer* dbeta;
  };
  auto side = [&](std::size_t i) {
    const model::Layer& l = layers[i];
    const StateSlot& g = slot(entry_of(i, StateKind::bn_weight));
    Buffer* x = kept(l.inputs[0]);
    return Side{x,
                g.master,
                bn_mean_[i],
                bn_invstd_[i],
                temporary_like(x, l.name),
                g.grad,
                slot(entry_of(i, StateKind::bn_bias)).grad};
  };
  const Side a = side(main);
  const Side b = side(shortcut);
  const std::string& name = layers[main].name;
  emit(name + "+" + layers[shortcut].name + ".backward", CallKind::batch_norm_add_backward, name,
       {dy, a.x, a.gamma, a.sm, a.si, a.dx, a.dgamma, a.dbeta, b.x, b.gamma, b.sm, b.si, b.dx,
        b.dgamma, b.dbeta},
       [&be = be_, dy, a, b] {
         return be.batch_norm_add_backward(dy->view,
                                           {a.x->view, a.gamma->view, a.sm->view, a.si->view,
                                            a.dx->view, a.dgamma->view, a.dbeta->view},
                                           {b.x->view, b.gamma->view, b.sm->view, b.si->view,
                                            b.dx->view, b.dgamma->view, b.dbeta->view});
       });
  contribute(layers[main].inputs[0], a.dx, name);
  contribute(layers[shortcut].inputs[0], b.dx, layers[shortcut].name);
}

void Planner::backward_relu(const model::Layer& l, std::size_t i, Buffer* dy) {
  const std::string& name = l.name;
  if (i > 0 && fusion_[i - 1] == Fusion::relu) {
    contribute(l.inputs[0], dy, name);  // the batch norm's fused backward applies the mask
    return;
  }
  // ResNet's block output feeds the next block and its shortcut, so its gradient arrives as a
  // sum: one pass adds and masks instead of writing the sum and reading it back. The sum is taken
  // out before y is read, which may emit y's recomputation.
  const bool add_in = s_.config.fuse && be_.fuses_relu_backward_add() && pending_sum(dy);
  if (add_in) drafts_.pop_back();
  Buffer* y = kept(l.output);
  // Shaped like y: under add+ReLU fusion the input (the sum) was never stored.
  Buffer* dx = temporary_like(y, name);
  if (add_in) {
    Buffer* a = last_sum_.a;
    Buffer* b = last_sum_.b;
    if (!fuse_data_gradient(name, a, b, y, dx) && !fuse_data_gradient(name, b, a, y, dx)) {
      emit(name + ".backward+grad_accumulate", CallKind::relu_backward_add, name, {a, b, y, dx},
           [&be = be_, a, b, y, dx] {
             return be.relu_backward_add(a->view, b->view, y->view, dx->view);
           });
    }
  } else {
    emit(name + ".backward", CallKind::relu_backward, name, {dy, y, dx},
         [&be = be_, dy, y, dx] { return be.relu_backward(dy->view, y->view, dx->view); });
  }
  contribute(l.inputs[0], dx, name);
}

Buffer* Planner::kept(int v) {
  const auto k = static_cast<std::size_t>(v);
  if (recomputed_[k] != nullptr) return recomputed_[k];
  if (rerun_[k]) return rerun_conv(k);
  if (recompute_from_[k] < 0) return value_[k];
  const auto& layers = s_.model.layers();
  const auto bn = static_cast<std::size_t>(recompute_from_[k]);
  const int shortcut = shortcut_of(bn);
  const auto sc = static_cast<std::size_t>(shortcut);
  Buffer* residual = nullptr;
  kept(layers[bn].inputs[0]);  // emit_batch_norm_apply reads it (batch_norm_saved)
  if (paired_[bn] >= 0) {
    // The shortcut's batch norm is applied in the same pass, from its own input.
    kept(layers[static_cast<std::size_t>(paired_[bn])].inputs[0]);
  } else if (recompute_from_[sc] >= 0 || saved_[sc]) {
    residual = kept(shortcut);
  } else {
    // The shortcut is a summed batch norm's output that nothing keeps (the main branch's last, in
    // a block with a projection: the batch norm that takes in the add is the projection's own),
    // applied again for this one read.
    const auto from = static_cast<std::size_t>(producer_[sc]);
    residual = s_.transient(value_[sc]->view.desc, Category::temporaries, layers[from].name);
    recompute_buffers_.push_back(residual);
    emit_batch_norm_apply(from, layers[from].name + ".apply.recompute", nullptr, residual);
  }
  Buffer* y = s_.transient(value_[k]->view.desc, Category::activations, layers[bn + 2].name);
  recompute_buffers_.push_back(y);
  emit_batch_norm_apply(bn, layers[bn].name + ".apply" + fusion_suffix(fusion_[bn]) + ".recompute",
                        residual, y);
  recomputed_[k] = y;
  return y;
}

Buffer* Planner::rerun_conv(std::size_t v) {
  const auto i = static_cast<std::size_t>(producer_[v]);
  const model::Layer& l = s_.model.layers()[i];
  Buffer* x = conv_input_[i];
  if (x == value_of(l.inputs[0])) x = kept(l.inputs[0]);
  Buffer* y = s_.transient(value_[v]->view.desc, Category::activations, l.name);
  recompute_buffers_.push_back(y);
  Buffer* sum = nullptr;
  Buffer* sqsum = nullptr;
  if (sums_for_[i] >= 0) {
    // The statistics were taken in the forward; these sums are thrown away.
    const TensorDesc& channels =
        master_of(static_cast<std::size_t>(sums_for_[i]), StateKind::bn_weight)->view.desc;
    sum = s_.transient(channels, Category::temporaries, l.name);
    sqsum = s_.transient(channels, Category::temporaries, l.name);
    recompute_buffers_.insert(recompute_buffers_.end(), {sum, sqsum});
  }
  emit_conv_forward(i, x, y, sum, sqsum, ".recompute");
  recomputed_[v] = y;
  return y;
}

void Planner::backward_linear(const model::Layer& l, std::size_t i, Buffer* dy) {
  const std::string& name = l.name;
  const int wi = entry_of(i, StateKind::fc_weight);
  const int bi = entry_of(i, StateKind::fc_bias);
  Buffer* x = value_of(l.inputs[0]);
  Buffer* w = weight_for_backward(wi);
  Buffer* dx = temporary_like(x, name);
  Buffer* dw = grad_target(wi, name);
  Buffer* db = grad_target(bi, name);
  emit(name + ".backward", CallKind::linear_backward, name, {dy, x, w, dx, dw, db},
       [&be = be_, dy, x, w, dx, dw, db] {
         return be.linear_backward(dy->view, x->view, w->view, dx->view, dw->view, db->view);
       });
  finish_grad(wi, dw);
  finish_grad(bi, db);
  contribute(l.inputs[0], dx, name);
}

}  // namespace dlprobe::engine::step_impl
