// The step planner: walks the model graph once forward and once backward, then adds the optimizer
// update, emitting one backend call per op into a draft list that records which buffers each call
// touches (the schedule turns those into lifetimes). Kept apart from StepState so the planning
// state (value buffers, gradient sharing, fusion) lives only while planning.
//
// planner.cpp holds the passes in the order they run and the gradient bookkeeping;
// plan_forward.cpp and plan_backward.cpp the call of each layer kind.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dlprobe/engine/backend.h"
#include "dlprobe/models/resnet.h"
#include "step_state.h"

namespace dlprobe::engine::step_impl {

// The planner's sources speak of these throughout.
using memory::Category;
using model::LayerKind;
using model::StateKind;

// A buffer's view, or a view without data (an operand the call goes without) for none.
inline TensorView view_or_none(const Buffer* b) {
  return b != nullptr ? b->view : TensorView{};
}

class Planner {
 public:
  explicit Planner(StepState& s) : s_(s), be_(s.backend) {}

  // `shapes`: every value's shape, as model::Model::value_shapes gives them.
  Status run(const std::vector<Shape>& shapes);
  std::vector<Draft> take() { return std::move(drafts_); }
  // Whether plan_block_recompute left any block output out (StepConfig::recompute_block_outputs
  // takes effect only where batch norm runs inside the convolutions).
  bool recomputes_block_outputs() const {
    return std::any_of(recompute_from_.begin(), recompute_from_.end(),
                       [](int bn) { return bn >= 0; });
  }

 private:
  enum class Fusion : std::uint8_t { none, relu, add_relu };
  // What a batch norm's call names take after ".forward" or ".apply": "+relu", "+add+relu".
  static const char* fusion_suffix(Fusion f) {
    return f == Fusion::relu ? "+relu" : f == Fusion::add_relu ? "+add+relu" : "";
  }

  // The passes, in the order run() takes them.
  void prepare(const std::vector<Shape>& shapes);
  // Which batch norms run with what follows them (StepConfig::fuse): a BN whose output only a
  // ReLU reads takes that ReLU; a BN whose output only a residual add reads, the add's output only
  // a ReLU, takes both (the add's other operand is computed earlier in the layer order).
  void plan_fusion();
  // Under StepConfig::fuse_conv, which batch norms take their statistics from the convolution
  // before them, and which BN + ReLU pairs the convolution after them applies (plan_fusion's
  // second half).
  void plan_conv_fusion();
  // A max pool whose input only a batch norm + ReLU wrote and nothing else reads finds its
  // backward's maxima in that input computed again from the batch norm's input (which the batch
  // norm's backward keeps anyway), where the backend can: the input is never stored.
  void plan_pool_recompute();
  // StepConfig::recompute_block_outputs: which block outputs (a summed batch norm's output with
  // the residual add and ReLU taken in) the forward does not keep, because the backward can
  // compute them again: their shortcut is kept, recomputed itself, or a summed batch norm's
  // output (the projection shortcut) that can be applied again. In such a block with a projection
  // whose input is kept, the projection's convolution output (the input of the batch norm that
  // takes in the add) is not kept either: the backward runs that convolution again.
  void plan_block_recompute();
  Status forward_pass();
  Status backward_pass();
  Status backward_layers();  // backward_pass's calls; backward_pass marks what they make
  void update();

  // One layer's forward (plan_forward.cpp).
  Status forward(const model::Layer& l, std::size_t i);
  Status forward_batch_norm(const model::Layer& l, std::size_t i);
  // What a batch norm's output is computed again from: its input, parameters and the saved batch
  // statistics.
  struct BatchNormSaved {
    Buffer* x;
    Buffer* gamma;
    Buffer* beta;
    Buffer* mean;
    Buffer* invstd;
  };
  BatchNormSaved batch_norm_saved(std::size_t i) const;
  // The elementwise pass of batch norm `i` from its convolution's sums, with the residual add and
  // ReLU where it takes them in: in the forward, and again where its output is recomputed.
  void emit_batch_norm_apply(std::size_t i, std::string name, Buffer* residual, Buffer* y);
  struct BatchNormForward;
  void batch_norm_train_forward(const model::Layer& l, std::size_t i, const BatchNormForward& a);
  // Whether max pool `i`'s forward runs in the call of the batch norm its input is recomputed
  // from (pool_from_bn_), which takes its statistics from its own pass rather than a
  // convolution's sums: then the pool's input is never stored.
  bool pool_forward_in_bn(std::size_t i) const {
    return pool_from_bn_[i] >= 0 && !summed_[static_cast<std::size_t>(pool_from_bn_[i])];
  }
  // Batch norm `i`, its ReLU and the max pool after them in one call (pool_forward_in_bn).
  Status batch_norm_max_pool_forward(const model::Layer& l, std::size_t i,
                                     const BatchNormForward& a);
  // A batch norm whose statistics the convolution before it summed: its finalize in the call
  // that applies it: the convolution after it (its prologue), the block output's pass with the
  // batch norm paired with it, or its own elementwise pass.
  Status batch_norm_from_sums(const model::Layer& l, std::size_t i, const BatchNormForward& a);
  void batch_norm_inference_forward(const model::Layer& l, const BatchNormForward& a);
  Result<Buffer*> forward_conv(const model::Layer& l, std::size_t i);
  Result<Buffer*> forward_add(const model::Layer& l);
  Result<Buffer*> forward_linear(const model::Layer& l, std::size_t i);
  // The buffer a layer's forward writes its output to.
  Result<Buffer*> new_output(const model::Layer& l);
  // Convolution `i`'s forward call from x into y, with the batch norm it applies (scale, bias)
  // and the sums it takes where the plan says so; `suffix` ends the call's name.
  void emit_conv_forward(std::size_t i, Buffer* x, Buffer* y, Buffer* sum, Buffer* sqsum,
                         const std::string& suffix);

  // One layer's backward (plan_backward.cpp).
  Status backward(const model::Layer& l, std::size_t i);
  void backward_conv(const model::Layer& l, std::size_t i, Buffer* dy);
  void backward_batch_norm(const model::Layer& l, std::size_t i, Buffer* dy);
  // A block output's two summed batch norms (paired_), x's `main` and r's `shortcut`, from their
  // one gradient dy: batch_norm_add_backward.
  void backward_batch_norm_pair(std::size_t main, std::size_t shortcut, Buffer* dy);
  // The batch norm whose pair `shortcut` is (paired_), or -1.
  int paired_by(std::size_t shortcut) const;
  void backward_relu(const model::Layer& l, std::size_t i, Buffer* dy);
  void backward_pool_batch_norm(const model::Layer& pool, std::size_t i, Buffer* dy);
  void backward_linear(const model::Layer& l, std::size_t i, Buffer* dy);
  // The shortcut of the residual add after batch norm `bn` (Fusion::add_relu): its other operand.
  int shortcut_of(std::size_t bn) const {
    const auto& layers = s_.model.layers();
    const model::Layer& add = layers[bn + 1];
    return add.inputs[0] == layers[bn].output ? add.inputs[1] : add.inputs[0];
  }
  // The buffer the backward reads for value v: the forward's, or where plan_block_recompute left
  // it out, the value computed again on its first read (with its shortcut before it).
  Buffer* kept(int v);
  // kept() for a convolution output left out: the convolution run again, with the forward's own
  // call (its sums thrown away), so the values are the same to the bit.
  Buffer* rerun_conv(std::size_t v);

  void emit(std::string name, CallKind kind, const std::string& layer, std::vector<Buffer*> uses,
            std::function<Status()> fn);
  // StepConfig::streams: the draft emitted last goes to the backend's second stream, where it has
  // one; it writes `writes` and only reads its other buffers.
  void to_second_stream(std::vector<Buffer*> writes);
  // A call of an op that reads one tensor and writes another.
  using UnaryOp = Status (Backend::*)(const TensorView&, const TensorView&);
  void emit_unary(std::string name, CallKind kind, const std::string& layer, UnaryOp op, Buffer* x,
                  Buffer* y);
  void emit_cast(std::string name, const std::string& layer, Buffer* src, Buffer* dst) {
    emit_unary(std::move(name), CallKind::cast, layer, &Backend::cast, src, dst);
  }
  // One call casting src[i] into dst[i] for every i (Backend::cast_many).
  void emit_cast_many(std::string name, const std::string& layer, std::vector<Buffer*> src,
                      std::vector<Buffer*> dst);
  Result<Buffer*> new_value(const std::string& owner, Category category, const Shape& shape,
                            DType dtype);
  Buffer* value_of(int v) const { return value_[static_cast<std::size_t>(v)]; }
  // A temporary of `like`'s shape and dtype: a gradient, for the most part.
  Buffer* temporary_like(const Buffer* like, const std::string& layer) {
    return s_.transient(like->view.desc, Category::temporaries, layer);
  }
  Buffer* cast_to(Buffer* src, DType dtype, Category category, const std::string& layer,
                  const std::string& what);

  // The state entry of `layer` of `kind`, and its buffers.
  int entry_of(std::size_t layer, StateKind kind) const;
  StateSlot& slot(int entry) const { return s_.state[static_cast<std::size_t>(entry)]; }
  Buffer* master_of(std::size_t layer, StateKind kind) const {
    return slot(entry_of(layer, kind)).master;
  }
  // Under mixed precision, every working copy cast from its master in one call before the first
  // layer (autocast casts per op; one launch for all of them saved 55 launches a ResNet-50 step).
  void cast_working_copies();
  // The parameter a forward call reads: the working copy under mixed precision, else the master.
  Buffer* weight_for_forward(int entry) const;
  // The parameter a backward call reads: the copy the forward read.
  Buffer* weight_for_backward(int entry) const;
  // Where a backward call writes a parameter's gradient: straight into the fp32 gradient, or under
  // mixed precision into a low-precision temporary that finish_grad() queues for the one cast of
  // every gradient after the last layer (cast_gradients()).
  Buffer* grad_target(int entry, const std::string& layer);
  void finish_grad(int entry, Buffer* target);
  void cast_gradients();

  // Adds `g` to the gradient of value v. Gradient buffers are shared where the math allows (the
  // residual add passes its gradient to both inputs unchanged); a shared buffer is never added
  // into in place.
  void contribute(int v, Buffer* g, const std::string& layer);
  // Whether `dy` is the sum the last draft made, with nothing else holding it: a ReLU's backward
  // can then take the two terms itself and the sum is dropped.
  bool pending_sum(Buffer* dy);
  // Where `term` is a data gradient that no call reads yet, its call is dropped and one call
  // writes dx = term + add under y's mask (conv2d_backward_data_add_relu): the data gradient is
  // never stored. Emitted here, after whatever reading y emitted. False where it does not apply.
  bool fuse_data_gradient(const std::string& name, Buffer* add, Buffer* term, Buffer* y,
                          Buffer* dx);
  void release_grad(int v);

  StepState& s_;
  Backend& be_;
  std::vector<Draft> drafts_;
  std::vector<Shape> shapes_;
  std::vector<Buffer*> value_;       // forward value -> buffer
  std::vector<bool> saved_;          // value saved for backward
  std::vector<int> consumers_;       // layers reading the value
  std::vector<Buffer*> conv_input_;  // per layer: what a conv read (the cast images for conv1)
  // Per layer: a conv whose input's cast (the images in the activation dtype) is not kept for its
  // weight gradient but made again there, where the step recomputes its block outputs.
  std::vector<bool> recast_;
  std::vector<Buffer*> bn_mean_, bn_invstd_;
  std::vector<Buffer*> grad_;
  std::vector<Buffer*> grad_low_, grad_high_;  // gradients finish_grad() queued for their cast
  std::map<Buffer*, int> sharers_;
  std::vector<Fusion> fusion_;  // per layer: what a batch norm takes in
  struct Sum {
    std::size_t draft = static_cast<std::size_t>(-1);
    Buffer* a = nullptr;
    Buffer* b = nullptr;
    Buffer* out = nullptr;
  };
  Sum last_sum_;  // the latest gradient accumulation contribute() emitted
  // Under conv fusion, each data gradient's operands by the buffer it writes, while a ReLU's
  // backward may still take it in (fuse_data_gradient).
  struct DataGradient {
    Buffer* dy = nullptr;
    Buffer* w = nullptr;
    Conv2dParams p;
    std::string layer;
  };
  bool fuse_data_gradients_ = false;
  std::map<Buffer*, DataGradient> data_gradients_;
  // Per add_relu batch norm: the summed batch norm whose output is its shortcut and is read by the
  // add alone (a projection block's main branch), applied with it in one pass
  // (batch_norm_apply_add); -1 for none. deferred_: such a shortcut's batch norm, which takes no
  // pass of its own, its output never stored.
  std::vector<int> paired_;
  std::vector<bool> deferred_;
  // per layer: its backward ran in another's call (a batch norm with its pair's, the stem's batch
  // norm and ReLU with the max pool's)
  std::vector<bool> backward_taken_;
  std::vector<bool> folded_;  // per layer: a ReLU or add run inside the batch norm before it
  // Batch norm inside the convolutions (plan_conv_fusion), indexed by layer; -1 for none.
  std::vector<int> sums_for_;  // per conv: the batch norm whose input it sums
  std::vector<int> applies_;   // per conv: the batch norm (+ ReLU) it applies to its input
  std::vector<bool> summed_;   // per batch norm: its statistics come from a convolution's sums
  std::vector<bool> applied_;  // per batch norm: a convolution applies it; its output never stored
  std::vector<Buffer*> bn_sum_, bn_sqsum_;   // per batch norm: the sums, until its finalize
  std::vector<Buffer*> bn_scale_, bn_bias_;  // per applied batch norm: its prologue
  // Per applied or deferred batch norm until the call that applies it (the convolution's
  // conv2d_forward_finalize_fused, the block output's batch_norm_finalize_apply_add): its
  // finalize, made in that call rather than one of its own: the buffers it reads and writes, and
  // its operands as they are when the call runs.
  struct PendingFinalize {
    std::vector<Buffer*> uses;
    std::function<Backend::BatchNormFinalize()> operands;
  };
  std::map<std::size_t, PendingFinalize> pending_finalize_;
  std::vector<int> pool_from_bn_;  // per max pool: the batch norm its input is recomputed from
  // per max pool: where its forward keeps its windows' maxima for its backward (none: nowhere)
  std::vector<Buffer*> pool_positions_;
  std::vector<int> producer_;  // per value: the layer that writes it (-1 for the images)
  // plan_block_recompute, per value: the batch norm whose output (+add+ReLU) is recomputed, or -1;
  // and the buffer it (or a convolution output rerun_ marks) was recomputed into, once the backward
  // has read it.
  std::vector<int> recompute_from_;
  std::vector<bool> rerun_;  // per value: a convolution output the backward computes again
  std::vector<Buffer*> recomputed_;
  std::vector<Buffer*> recompute_buffers_;  // every buffer the recomputation writes: no gradients
};

}  // namespace dlprobe::engine::step_impl
