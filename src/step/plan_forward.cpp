// The forward call of each layer kind. A layer's output is an activation when some backward reads
// it, else a temporary; under mixed precision conv and fc read working copies of their parameters,
// cast from the masters at each forward as autocast does.
#include <string>
#include <vector>

#include "planner.h"

namespace dlprobe::engine::step_impl {

Status Planner::forward(const model::Layer& l, std::size_t i) {
  // Run by the batch norm before it.
  if (folded_[i] || pool_forward_in_bn(i)) return Status::ok();
  if (l.kind == LayerKind::batch_norm) return forward_batch_norm(l, i);
  Buffer* x = value_of(l.inputs[0]);
  Buffer* y = nullptr;
  const std::string& name = l.name;
  switch (l.kind) {
    case LayerKind::conv: {
      DLPROBE_ASSIGN_OR_RETURN(y, forward_conv(l, i));
      break;
    }
    case LayerKind::batch_norm:
      break;  // forward_batch_norm
    case LayerKind::relu: {
      DLPROBE_ASSIGN_OR_RETURN(y, new_output(l));
      emit_unary(name + ".forward", CallKind::relu_forward, name, &Backend::relu_forward, x, y);
      break;
    }
    case LayerKind::max_pool: {
      DLPROBE_ASSIGN_OR_RETURN(y, new_output(l));
      emit(name + ".forward", CallKind::max_pool_forward, name, {x, y},
           [&be = be_, x, y, p = l.pool] { return be.max_pool2d_forward(x->view, y->view, p); });
      break;
    }
    case LayerKind::add: {
      DLPROBE_ASSIGN_OR_RETURN(y, forward_add(l));
      break;
    }
    case LayerKind::global_avg_pool: {
      DLPROBE_ASSIGN_OR_RETURN(y, new_output(l));
      emit_unary(name + ".forward", CallKind::global_avg_pool_forward, name,
                 &Backend::global_avg_pool_forward, x, y);
      break;
    }
    case LayerKind::linear: {
      DLPROBE_ASSIGN_OR_RETURN(y, forward_linear(l, i));
      break;
    }
  }
  value_[static_cast<std::size_t>(l.output)] = y;
  return Status::ok();
}

Result<Buffer*> Planner::new_output(const model::Layer& l) {
  const auto out = static_cast<std::size_t>(l.output);
  // A value the backward recomputes lives only as long as the forward reads it.
  const bool kept = saved_[out] && recompute_from_[out] < 0 && !rerun_[out];
  const Category category = kept ? Category::activations : Category::temporaries;
  return new_value(l.name, category, shapes_[out], s_.act());
}

Result<Buffer*> Planner::forward_conv(const model::Layer& l, std::size_t i) {
  const auto in = static_cast<std::size_t>(l.inputs[0]);
  const std::string& name = l.name;
  const int applied = applies_[i];
  const int summed = sums_for_[i];
  Buffer* x = nullptr;
  if (applied >= 0) {
    // The batch norm's input, normalised as the convolution loads it.
    x = value_of(s_.model.layers()[static_cast<std::size_t>(applied)].inputs[0]);
  } else {
    x = value_[in];
    if (x->view.desc.dtype() != s_.act()) {
      // Where the step recomputes its block outputs, the cast is made again for the weight
      // gradient too: a cast of the images costs less than keeping it through the backward
      // (ResNet-50 at batch 256 in fp16: 74 MiB).
      recast_[i] = saved_[in] && recomputes_block_outputs();
      x = cast_to(x, s_.act(),
                  saved_[in] && !recast_[i] ? Category::activations : Category::temporaries, name,
                  "input");
    }
  }
  conv_input_[i] = x;
  DLPROBE_ASSIGN_OR_RETURN(Buffer * y, new_output(l));
  Buffer* sum = nullptr;
  Buffer* sqsum = nullptr;
  if (summed >= 0) {
    // Per channel of y, in the statistics' dtype; the batch norm's finalize reads them.
    const auto bn = static_cast<std::size_t>(summed);
    const TensorDesc& channels = master_of(bn, StateKind::bn_weight)->view.desc;
    sum = s_.transient(channels, Category::temporaries, name);
    sqsum = s_.transient(channels, Category::temporaries, name);
    bn_sum_[bn] = sum;
    bn_sqsum_[bn] = sqsum;
  }
  emit_conv_forward(i, x, y, sum, sqsum, "");
  return y;
}

void Planner::emit_conv_forward(std::size_t i, Buffer* x, Buffer* y, Buffer* sum, Buffer* sqsum,
                                const std::string& suffix) {
  const model::Layer& l = s_.model.layers()[i];
  const std::string& name = l.name;
  const int applied = applies_[i];
  // Also where the backward runs the convolution again: weight_for_backward() is the same buffer.
  Buffer* w = weight_for_forward(entry_of(i, StateKind::conv_weight));
  if (applied < 0 && sum == nullptr) {
    emit(name + ".forward" + suffix, CallKind::conv_forward, name, {x, w, y},
         [&be = be_, x, w, y, p = l.conv] {
           return be.conv2d_forward(x->view, w->view, y->view, p);
         });
    return;
  }
  Buffer* scale = nullptr;
  Buffer* bias = nullptr;
  std::vector<Buffer*> uses = {x, w, y};
  std::string call = name + ".forward";
  if (applied >= 0) {
    const auto bn = static_cast<std::size_t>(applied);
    scale = bn_scale_[bn];
    bias = bn_bias_[bn];
    uses.insert(uses.end(), {scale, bias});
    call += "+" + s_.model.layers()[bn].name;
  }
  if (sum != nullptr) {
    uses.insert(uses.end(), {sum, sqsum});
    call += "+sums";
  }
  const auto finalize = applied >= 0 ? pending_finalize_.find(static_cast<std::size_t>(applied))
                                     : pending_finalize_.end();
  if (finalize != pending_finalize_.end()) {
    // "<bn>.finalize+<conv>.forward+<bn>[+sums]": the batch norm's finalize in this call.
    PendingFinalize f = std::move(finalize->second);
    pending_finalize_.erase(finalize);
    uses.insert(uses.end(), f.uses.begin(), f.uses.end());
    emit(s_.model.layers()[static_cast<std::size_t>(applied)].name + ".finalize+" + call + suffix,
         CallKind::conv_forward_fused, name, std::move(uses),
         [&be = be_, x, w, y, operands = std::move(f.operands), sum, sqsum, p = l.conv] {
           return be.conv2d_forward_finalize_fused(operands(), x->view, w->view, y->view,
                                                   view_or_none(sum), view_or_none(sqsum), p);
         });
    return;
  }
  emit(call + suffix, CallKind::conv_forward_fused, name, std::move(uses),
       [&be = be_, x, w, y, scale, bias, sum, sqsum, p = l.conv] {
         return be.conv2d_forward_fused(x->view, view_or_none(scale), view_or_none(bias), w->view,
                                        y->view, view_or_none(sum), view_or_none(sqsum), p);
       });
}

Result<Buffer*> Planner::forward_add(const model::Layer& l) {
  const auto in = static_cast<std::size_t>(l.inputs[0]);
  const auto out = static_cast<std::size_t>(l.output);
  Buffer* x = value_[in];
  Buffer* b = value_of(l.inputs[1]);
  Buffer* y = x;
  // torchvision adds the shortcut in place (out += identity) into the last BN's output, which
  // nothing else reads; so does the plan, to hold no more memory than PyTorch.
  if (saved_[in] || consumers_[in] != 1 || saved_[out] != saved_[in]) {
    DLPROBE_ASSIGN_OR_RETURN(y, new_output(l));
  }
  emit(l.name + ".forward", CallKind::add, l.name, {x, b, y},
       [&be = be_, x, b, y] { return be.add(x->view, b->view, y->view); });
  return y;
}

Result<Buffer*> Planner::forward_linear(const model::Layer& l, std::size_t i) {
  const std::string& name = l.name;
  Buffer* x = value_of(l.inputs[0]);
  Buffer* w = weight_for_forward(entry_of(i, StateKind::fc_weight));
  Buffer* b = weight_for_forward(entry_of(i, StateKind::fc_bias));
  DLPROBE_ASSIGN_OR_RETURN(Buffer * y, new_output(l));
  emit(name + ".forward", CallKind::linear_forward, name, {x, w, b, y},
       [&be = be_, x, w, b, y] { return be.linear_forward(x->view, w->view, b->view, y->view); });
  return y;
}

// What a batch norm's forward reads and writes; the residual only where it takes in an add.
struct Planner::BatchNormForward {
  std::string name;  // of the call
  Buffer* x = nullptr;
  Buffer* gamma = nullptr;
  Buffer* beta = nullptr;
  Buffer* mean = nullptr;
  Buffer* var = nullptr;
  Buffer* residual = nullptr;
  Buffer* y = nullptr;
  BatchNormParams p;
  bool fused = false;  // with the ReLU (and add) after it

  std::vector<Buffer*> uses() const { return {x, gamma, beta, mean, var, y}; }
  TensorView residual_view() const { return residual != nullptr ? residual->view : TensorView{}; }
};

// A batch norm, and under fusion the ReLU (and add) it takes in: their output is the ReLU's.
Status Planner::forward_batch_norm(const model::Layer& l, std::size_t i) {
  const auto& layers = s_.model.layers();
  const Fusion f = fusion_[i];
  const model::Layer& last = f == Fusion::relu       ? layers[i + 1]
                             : f == Fusion::add_relu ? layers[i + 2]
                                                     : l;
  BatchNormForward a;
  a.name = l.name + ".forward" + fusion_suffix(f);
  a.x = value_of(l.inputs[0]);
  if (f == Fusion::add_relu) a.residual = value_of(shortcut_of(i));
  a.gamma = master_of(i, StateKind::bn_weight);
  a.beta = master_of(i, StateKind::bn_bias);
  a.mean = master_of(i, StateKind::running_mean);
  a.var = master_of(i, StateKind::running_var);
  a.p = l.batch_norm;
  a.fused = f != Fusion::none;
  if (summed_[i]) {
    if (!applied_[i] && !deferred_[i]) {
      DLPROBE_ASSIGN_OR_RETURN(a.y, new_output(last));
    }
    DLPROBE_RETURN_IF_ERROR(batch_norm_from_sums(l, i, a));
    // None where a convolution applies it, or the block output's pass (paired_).
    value_[static_cast<std::size_t>(last.output)] = a.y;
    return Status::ok();
  }
  if (i + 2 < layers.size() && pool_forward_in_bn(i + 2)) {
    return batch_norm_max_pool_forward(l, i, a);
  }
  DLPROBE_ASSIGN_OR_RETURN(a.y, new_output(last));
  if (s_.training()) {
    batch_norm_train_forward(l, i, a);
  } else {
    batch_norm_inference_forward(l, a);
  }
  value_[static_cast<std::size_t>(last.output)] = a.y;
  return Status::ok();
}

// The batch's statistics normalise, and the running ones take a step towards them; the batch's
// mean and inverse deviation are saved for the backward.
void Planner::batch_norm_train_forward(const model::Layer& l, std::size_t i,
                                       const BatchNormForward& a) {
  Buffer* sm = s_.transient(a.gamma->view.desc, Category::activations, l.name);
  Buffer* si = s_.transient(a.gamma->view.desc, Category::activations, l.name);
  bn_mean_[i] = sm;
  bn_invstd_[i] = si;
  std::vector<Buffer*> uses = a.uses();
  uses.insert(uses.end(), {sm, si});
  if (a.residual != nullptr) uses.push_back(a.residual);
  if (!a.fused) {
    emit(a.name, CallKind::batch_norm_train_forward, l.name, std::move(uses),
         [&be = be_, a, sm, si] {
           return be.batch_norm_train_forward(a.x->view, a.gamma->view, a.beta->view, a.mean->view,
                                              a.var->view, a.y->view, sm->view, si->view, a.p);
         });
    return;
  }
  emit(a.name, CallKind::batch_norm_relu_train_forward, l.name, std::move(uses),
       [&be = be_, a, sm, si] {
         return be.batch_norm_relu_train_forward(a.x->view, a.gamma->view, a.beta->view,
                                                 a.mean->view, a.var->view, a.residual_view(),
                                                 a.y->view, sm->view, si->view, a.p);
       });
}

// The max pool reads the batch norm + ReLU's output alone and its backward makes it again
// (plan_pool_recompute): the pool normalises the values as it loads them, and that output (the
// size of the stem's convolution output) is never stored. Where the three take their backward in
// one call, the pool keeps where each window's maximum lies for it (shaped as the pool's output:
// at fp16 batch 256, 103 MB kept where a first pass of the backward would read the 411 MB input
// again to find them).
Status Planner::batch_norm_max_pool_forward(const model::Layer& l, std::size_t i,
                                            const BatchNormForward& a) {
  const model::Layer& pool = s_.model.layers()[i + 2];
  Buffer* sm = s_.transient(a.gamma->view.desc, Category::activations, l.name);
  Buffer* si = s_.transient(a.gamma->view.desc, Category::activations, l.name);
  bn_mean_[i] = sm;
  bn_invstd_[i] = si;
  DLPROBE_ASSIGN_OR_RETURN(Buffer * y, new_output(pool));
  std::vector<Buffer*> uses = {a.x, a.gamma, a.beta, a.mean, a.var, sm, si, y};
  Buffer* positions = nullptr;
  if (be_.fuses_max_pool_batch_norm_backward(a.x->view.desc, pool.pool)) {
    positions = s_.transient(y->view.desc, Category::activations, pool.name);
    uses.push_back(positions);
  }
  pool_positions_[i + 2] = positions;
  emit(a.name + "+" + pool.name, CallKind::batch_norm_relu_max_pool_train_forward, l.name,
       std::move(uses), [&be = be_, a, sm, si, y, positions, p = pool.pool] {
         return be.batch_norm_relu_max_pool_train_forward(
             a.x->view, a.gamma->view, a.beta->view, a.mean->view, a.var->view, y->view,
             view_or_none(positions), sm->view, si->view, a.p, p);
       });
  value_[static_cast<std::size_t>(pool.output)] = y;
  return Status::ok();
}

Status Planner::batch_norm_from_sums(const model::Layer& l, std::size_t i,
                                     const BatchNormForward& a) {
  Buffer* sm = s_.transient(a.gamma->view.desc, Category::activations, l.name);
  Buffer* si = s_.transient(a.gamma->view.desc, Category::activations, l.name);
  bn_mean_[i] = sm;
  bn_invstd_[i] = si;
  Buffer* sum = bn_sum_[i];
  Buffer* sqsum = bn_sqsum_[i];
  Buffer* scale = nullptr;
  Buffer* bias = nullptr;
  std::vector<Buffer*> uses = {sum, sqsum, a.gamma, a.beta, a.mean, a.var, sm, si};
  if (applied_[i]) {
    // The prologue in the backend's dtype for it; the weight gradient of the convolution that
    // applies it reads it again.
    const TensorDesc d = a.gamma->view.desc.with_dtype(be_.conv_prologue_dtype(s_.act()));
    scale = s_.transient(d, Category::activations, l.name);
    bias = s_.transient(d, Category::activations, l.name);
    bn_scale_[i] = scale;
    bn_bias_[i] = bias;
  }
  const Shape& in = a.x->view.desc.shape();
  const std::int64_t count = in[0] * in[2] * in[3];
  auto operands = [a, sum, sqsum, count, sm, si, scale, bias] {
    return Backend::BatchNormFinalize{
        sum->view,   sqsum->view, count,    a.gamma->view,       a.beta->view,       a.mean->view,
        a.var->view, sm->view,    si->view, view_or_none(scale), view_or_none(bias), a.p};
  };
  if (applied_[i] || deferred_[i]) {
    // Made by the convolution that applies it, which lists the scale and bias itself, or by the
    // block output's pass that applies it with the batch norm paired with it.
    pending_finalize_[i] = {std::move(uses), std::move(operands)};
    return Status::ok();
  }
  if (paired_[i] >= 0) {
    // "<bn>.finalize+<shortcut's bn>.finalize+apply+add+relu": both finalizes in the block
    // output's pass (batch_norm_finalize_apply_add).
    const auto from = static_cast<std::size_t>(paired_[i]);
    const auto shortcut = pending_finalize_.find(from);
    if (shortcut == pending_finalize_.end()) {
      return {Errc::internal, "step plan: " + s_.model.layers()[from].name +
                                  " is not finalized before the block output " + l.name};
    }
    PendingFinalize r = std::move(shortcut->second);
    pending_finalize_.erase(shortcut);
    Buffer* x = batch_norm_saved(i).x;
    Buffer* rx = batch_norm_saved(from).x;
    uses.insert(uses.end(), r.uses.begin(), r.uses.end());
    uses.insert(uses.end(), {x, rx, a.y});
    emit(l.name + ".finalize+" + s_.model.layers()[from].name + ".finalize+apply+add+relu",
         CallKind::batch_norm_apply_add, l.name, std::move(uses),
         [&be = be_, operands, r_operands = std::move(r.operands), x, rx, y = a.y] {
           return be.batch_norm_finalize_apply_add(operands(), x->view, r_operands(), rx->view,
                                                   y->view);
         });
    return Status::ok();
  }
  // "<bn>.finalize+apply[+add]+relu": the finalize in the apply's call.
  Buffer* x = batch_norm_saved(i).x;
  uses.insert(uses.end(), {x, a.y});
  if (a.residual != nullptr) uses.push_back(a.residual);
  emit(l.name + ".finalize+apply" + fusion_suffix(fusion_[i]), CallKind::batch_norm_apply, l.name,
       std::move(uses),
       [&be = be_, operands, x, residual = a.residual, y = a.y, relu = fusion_[i] != Fusion::none] {
         return be.batch_norm_finalize_apply(operands(), x->view, view_or_none(residual), y->view,
                                             relu);
       });
  return Status::ok();
}

Planner::BatchNormSaved Planner::batch_norm_saved(std::size_t i) const {
  // In the backward, the input as kept() last gave it where the forward's was not kept.
  const auto in = static_cast<std::size_t>(s_.model.layers()[i].inputs[0]);
  return {recomputed_[in] != nullptr ? recomputed_[in] : value_[in],
          master_of(i, StateKind::bn_weight), master_of(i, StateKind::bn_bias), bn_mean_[i],
          bn_invstd_[i]};
}

void Planner::emit_batch_norm_apply(std::size_t i, std::string name, Buffer* residual, Buffer* y) {
  const model::Layer& l = s_.model.layers()[i];
  const auto [x, gamma, beta, sm, si] = batch_norm_saved(i);
  if (paired_[i] >= 0) {
    const auto [r, r_gamma, r_beta, r_mean, r_invstd] =
        batch_norm_saved(static_cast<std::size_t>(paired_[i]));
    // "<bn>.apply+<shortcut's bn>.apply+add+relu[.recompute]"
    const std::string own = l.name + ".apply";
    name.insert(own.size(),
                "+" + s_.model.layers()[static_cast<std::size_t>(paired_[i])].name + ".apply");
    emit(std::move(name), CallKind::batch_norm_apply_add, l.name,
         {x, gamma, beta, sm, si, r, r_gamma, r_beta, r_mean, r_invstd, y},
         [&be = be_, x, gamma, beta, sm, si, r, r_gamma, r_beta, r_mean, r_invstd, y] {
           return be.batch_norm_apply_add(x->view, gamma->view, beta->view, sm->view, si->view,
                                          r->view, r_gamma->view, r_beta->view, r_mean->view,
                                          r_invstd->view, y->view);
         });
    return;
  }
  const bool fused = fusion_[i] != Fusion::none;
  std::vector<Buffer*> uses = {x, gamma, beta, sm, si, y};
  if (residual != nullptr) uses.push_back(residual);
  emit(std::move(name), CallKind::batch_norm_apply, l.name, std::move(uses),
       [&be = be_, x, gamma, beta, sm, si, residual, y, fused] {
         return be.batch_norm_apply(x->view, gamma->view, beta->view, sm->view, si->view,
                                    view_or_none(residual), y->view, fused);
       });
}

// The running statistics normalise.
void Planner::batch_norm_inference_forward(const model::Layer& l, const BatchNormForward& a) {
  std::vector<Buffer*> uses = a.uses();
  if (a.residual != nullptr) uses.push_back(a.residual);
  if (!a.fused) {
    emit(a.name, CallKind::batch_norm_inference_forward, l.name, std::move(uses), [&be = be_, a] {
      return be.batch_norm_inference_forward(a.x->view, a.gamma->view, a.beta->view, a.mean->view,
                                             a.var->view, a.y->view, a.p);
    });
    return;
  }
  emit(a.name, CallKind::batch_norm_relu_inference_forward, l.name, std::move(uses),
       [&be = be_, a] {
         return be.batch_norm_relu_inference_forward(a.x->view, a.gamma->view, a.beta->view,
                                                     a.mean->view, a.var->view, a.residual_view(),
                                                     a.y->view, a.p);
       });
}

}  // namespace dlprobe::engine::step_impl
