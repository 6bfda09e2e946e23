// The step planner. create() allocates the long-lived buffers, then walks the model graph once
// forward and once backward, emitting one backend call per op into a draft list that records which
// buffers each call touches. A last pass turns buffer lifetimes into `alloc`/`free` entries: an
// activation or temporary is allocated right before the first call that touches it and freed
// right after the last, which is also how PyTorch's caching allocator sees a step (tensors die
// with their last reference).
#include "dlprobe/step/training_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "dlprobe/allocator/arena_plan.h"
#include "dlprobe/core/log.h"

namespace dlprobe::engine {
namespace {

using memory::Category;
using model::LayerKind;
using model::StateKind;

struct Buffer {
  TensorView view;
  Category category = Category::temporaries;
  std::string owner;
  bool transient = false;
  memory::DeviceBuffer storage;  // long-lived buffers only
};

struct Draft {
  Call call;
  std::vector<Buffer*> uses;
};

// A state entry's buffers. Parameters have a master copy, a gradient (train/grads) and optimizer
// state (train); under mixed precision conv and fc parameters also have a working copy.
struct StateSlot {
  Buffer* master = nullptr;
  Buffer* working = nullptr;
  Buffer* grad = nullptr;
  Buffer* state0 = nullptr;
  Buffer* state1 = nullptr;
  std::int64_t num_batches_tracked = 0;
};

template <class E>
struct Named {
  E value;
  std::string_view name;
};

constexpr Named<Precision> kPrecisions[] = {{Precision::fp32, "fp32"},
                                            {Precision::tf32, "tf32"},
                                            {Precision::fp16, "fp16"},
                                            {Precision::bf16, "bf16"},
                                            {Precision::fp64, "fp64"}};
constexpr Named<StepMode> kModes[] = {
    {StepMode::train, "train"}, {StepMode::grads, "grads"}, {StepMode::infer, "infer"}};
constexpr Named<OptimizerKind> kOptimizers[] = {{OptimizerKind::sgd, "sgd"},
                                                {OptimizerKind::adamw, "adamw"}};
constexpr Named<MemoryPlan> kMemoryPlans[] = {{MemoryPlan::dynamic, "dynamic"},
                                              {MemoryPlan::planned, "planned"}};

template <class E, std::size_t N>
Result<E> parse_named(const Named<E> (&table)[N], std::string_view text, std::string_view flag,
                      std::string_view what) {
  std::string expected;
  for (const auto& e : table) {
    if (e.name == text) return e.value;
    expected += fmt::format("{}{}", expected.empty() ? "" : ", ", e.name);
  }
  return invalid_argument(
      fmt::format("{}: unknown {} '{}' (expected one of {})", flag, what, text, expected));
}

template <class E, std::size_t N>
std::string_view name_of(const Named<E> (&table)[N], E value) {
  for (const auto& e : table) {
    if (e.value == value) return e.name;
  }
  return "?";
}

bool is_mixed(Precision p) {
  return p == Precision::fp16 || p == Precision::bf16;
}

}  // namespace

Result<Precision> parse_precision(std::string_view text, std::string_view flag) {
  return parse_named(kPrecisions, text, flag, "precision");
}
std::string_view precision_name(Precision p) {
  return name_of(kPrecisions, p);
}
Result<StepMode> parse_step_mode(std::string_view text, std::string_view flag) {
  return parse_named(kModes, text, flag, "mode");
}
std::string_view step_mode_name(StepMode m) {
  return name_of(kModes, m);
}
Result<OptimizerKind> parse_optimizer(std::string_view text, std::string_view flag) {
  return parse_named(kOptimizers, text, flag, "optimizer");
}
std::string_view optimizer_name(OptimizerKind o) {
  return name_of(kOptimizers, o);
}
std::string_view memory_plan_name(MemoryPlan p) {
  return name_of(kMemoryPlans, p);
}

DType activation_dtype(Precision p) {
  switch (p) {
    case Precision::fp16:
      return DType::fp16;
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp64:
      return DType::fp64;
    case Precision::fp32:
    case Precision::tf32:
      return DType::fp32;
  }
  return DType::fp32;
}

DType master_dtype(Precision p) {
  return p == Precision::fp64 ? DType::fp64 : DType::fp32;
}

std::string_view call_kind_name(CallKind kind) {
  switch (kind) {
    case CallKind::alloc:
      return "alloc";
    case CallKind::free:
      return "free";
    case CallKind::fill:
      return "fill";
    case CallKind::cast:
      return "cast";
    case CallKind::conv_forward:
      return "conv_forward";
    case CallKind::conv_backward_data:
      return "conv_backward_data";
    case CallKind::conv_backward_weight:
      return "conv_backward_weight";
    case CallKind::batch_norm_train_forward:
      return "batch_norm_train_forward";
    case CallKind::batch_norm_inference_forward:
      return "batch_norm_inference_forward";
    case CallKind::batch_norm_backward:
      return "batch_norm_backward";
    case CallKind::batch_norm_relu_train_forward:
      return "batch_norm_relu_train_forward";
    case CallKind::batch_norm_relu_inference_forward:
      return "batch_norm_relu_inference_forward";
    case CallKind::batch_norm_relu_backward:
      return "batch_norm_relu_backward";
    case CallKind::relu_forward:
      return "relu_forward";
    case CallKind::relu_backward:
      return "relu_backward";
    case CallKind::relu_backward_add:
      return "relu_backward_add";
    case CallKind::max_pool_forward:
      return "max_pool_forward";
    case CallKind::max_pool_backward:
      return "max_pool_backward";
    case CallKind::add:
      return "add";
    case CallKind::global_avg_pool_forward:
      return "global_avg_pool_forward";
    case CallKind::global_avg_pool_backward:
      return "global_avg_pool_backward";
    case CallKind::linear_forward:
      return "linear_forward";
    case CallKind::linear_backward:
      return "linear_backward";
    case CallKind::cross_entropy_forward:
      return "cross_entropy_forward";
    case CallKind::cross_entropy_backward:
      return "cross_entropy_backward";
    case CallKind::unscale_gradients:
      return "unscale_gradients";
    case CallKind::sgd_step:
      return "sgd_step";
    case CallKind::adamw_step:
      return "adamw_step";
  }
  return "?";
}

namespace {

// Everything a planned step holds; TrainingStep::Impl is this under the header's private name.
struct StepState {
  StepState(const StepConfig& c, model::Model m, Backend& b, memory::CachingAllocator& a)
      : config(c), model(std::move(m)), backend(b), allocator(a) {}

  StepConfig config;
  model::Model model;
  Backend& backend;
  memory::CachingAllocator& allocator;

  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<StateSlot> state;  // parallel to model.state()
  std::vector<Call> calls;
  std::vector<TransientBuffer> transients;
  // MemoryPlan::planned: the block every transient buffer lives in, and its layout's figures.
  memory::DeviceBuffer arena;
  std::optional<ArenaLayout> arena_layout;
  std::size_t current_call = 0;

  Buffer* images = nullptr;
  Buffer* labels = nullptr;
  Buffer* loss = nullptr;
  Buffer* found_inf = nullptr;  // fp16 training only
  Buffer* logits = nullptr;     // what the loss reads (transient); kept_logits copies it
  Buffer* kept_logits = nullptr;

  // Read by the planned calls when they run.
  double scale = 1.0;
  std::int64_t queued_step = 0;  // the optimizer step number of the queued step

  std::int64_t growth_tracker = 0;
  std::int64_t optimizer_steps = 0;
  bool input_set = false;
  bool pending = false;
  double pending_scale = 1.0;
  // StepConfig::graph: eager runs so far (the first one builds plans), the recorded graph, and
  // whether recording failed (then every step runs eagerly).
  std::int64_t eager_runs = 0;
  std::optional<std::size_t> graph;
  bool graph_failed = false;

  bool training() const { return config.mode != StepMode::infer; }
  // fp16 scales the loss before backward in train and grads modes; only train unscales.
  bool scaling() const { return config.precision == Precision::fp16 && training(); }
  DType act() const { return activation_dtype(config.precision); }
  DType master() const { return master_dtype(config.precision); }

  Result<Buffer*> persistent(const TensorDesc& desc, Category category, std::string owner) {
    auto b = std::make_unique<Buffer>();
    b->view.desc = desc;
    b->category = category;
    b->owner = std::move(owner);
    DLPROBE_ASSIGN_OR_RETURN(b->storage,
                             allocator.allocate_buffer(desc.bytes(), category, b->owner));
    b->view.data = b->storage.data();
    buffers.push_back(std::move(b));
    return buffers.back().get();
  }

  Buffer* transient(const TensorDesc& desc, Category category, std::string owner) {
    auto b = std::make_unique<Buffer>();
    b->view.desc = desc;
    b->category = category;
    b->owner = std::move(owner);
    b->transient = true;
    buffers.push_back(std::move(b));
    return buffers.back().get();
  }

  Status allocate_state();
  Status upload_initial_state();
  // Queues the call list, with a timing mark before each call and after the last when `marks`
  // points at the first mark's index; `collect` waits for a pending step first when the loss
  // scale depends on it.
  Status enqueue(const std::size_t* marks, const std::function<Status()>& collect);
  Status plan();
  void release_transients();
  Status upload_to(Buffer& b, const HostTensor& value, std::string_view what);
  Result<HostTensor> download(const Buffer& b) const;
};

Result<TensorDesc> make_desc(const Shape& s, DType dtype, Layout layout) {
  return TensorDesc::make(s, dtype, s.rank == 4 ? layout : Layout::nchw);
}

Status StepState::allocate_state() {
  const Layout layout = config.layout;
  state.resize(model.state().size());
  for (std::size_t i = 0; i < model.state().size(); ++i) {
    const model::StateEntry& e = model.state()[i];
    if (e.kind == StateKind::num_batches_tracked) continue;  // a host-side counter
    const std::string& owner = model.layers()[static_cast<std::size_t>(e.layer)].name;
    DLPROBE_ASSIGN_OR_RETURN(TensorDesc desc, make_desc(e.shape, master(), layout));
    StateSlot& slot = state[i];
    DLPROBE_ASSIGN_OR_RETURN(slot.master, persistent(desc, Category::weights, owner));
    if (!model::is_parameter(e.kind)) continue;
    const bool low_precision_copy =
        is_mixed(config.precision) &&
        (e.kind == StateKind::conv_weight || e.kind == StateKind::fc_weight ||
         e.kind == StateKind::fc_bias);
    if (low_precision_copy) {
      DLPROBE_ASSIGN_OR_RETURN(slot.working,
                               persistent(desc.with_dtype(act()), Category::weights, owner));
    }
    if (!training()) continue;
    DLPROBE_ASSIGN_OR_RETURN(slot.grad, persistent(desc, Category::gradients, owner));
    if (config.mode != StepMode::train) continue;
    const bool first = config.optimizer == OptimizerKind::adamw || config.sgd.momentum != 0.0;
    if (first) {
      DLPROBE_ASSIGN_OR_RETURN(slot.state0, persistent(desc, Category::optimizer_state, owner));
      DLPROBE_RETURN_IF_ERROR(backend.fill(slot.state0->view, 0.0));
    }
    if (config.optimizer == OptimizerKind::adamw) {
      DLPROBE_ASSIGN_OR_RETURN(slot.state1, persistent(desc, Category::optimizer_state, owner));
      DLPROBE_RETURN_IF_ERROR(backend.fill(slot.state1->view, 0.0));
    }
  }
  const std::int64_t n = config.batch;
  const std::int64_t hw = config.model.image_size;
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc images_desc,
                           TensorDesc::make(Shape{n, 3, hw, hw}, master(), layout));
  DLPROBE_ASSIGN_OR_RETURN(images, persistent(images_desc, Category::input, "images"));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc labels_desc, TensorDesc::make(Shape{n}, DType::int64));
  DLPROBE_ASSIGN_OR_RETURN(labels, persistent(labels_desc, Category::input, "labels"));
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc scalar, TensorDesc::make(Shape{1}, master()));
  DLPROBE_ASSIGN_OR_RETURN(loss, persistent(scalar, Category::temporaries, "loss"));
  if (scaling() && config.mode == StepMode::train) {
    DLPROBE_ASSIGN_OR_RETURN(found_inf, persistent(scalar.with_dtype(DType::fp32),
                                                   Category::optimizer_state, "grad_scaler"));
  }
  return Status::ok();
}

Status StepState::upload_to(Buffer& b, const HostTensor& value, std::string_view what) {
  if (!(value.shape() == b.view.desc.shape())) {
    return invalid_argument(fmt::format("{}: shape [{}] does not match the model's [{}]", what,
                                        value.shape().str(), b.view.desc.shape().str()));
  }
  if (value.dtype() == b.view.desc.dtype() && value.layout() == b.view.desc.layout()) {
    return backend.upload(b.view.data, value.data(), b.view.desc.bytes());
  }
  DLPROBE_ASSIGN_OR_RETURN(HostTensor converted, value.to_dtype(b.view.desc.dtype()));
  const HostTensor laid_out = converted.to_layout(b.view.desc.layout());
  return backend.upload(b.view.data, laid_out.data(), b.view.desc.bytes());
}

Result<HostTensor> StepState::download(const Buffer& b) const {
  DLPROBE_RETURN_IF_ERROR(backend.synchronize());
  HostTensor t(b.view.desc);
  DLPROBE_RETURN_IF_ERROR(backend.download(t.data(), b.view.data, b.view.desc.bytes()));
  return t;
}

Status StepState::upload_initial_state() {
  const std::vector<HostTensor> init = model::initial_state(model, config.seed);
  for (std::size_t i = 0; i < init.size(); ++i) {
    if (state[i].master == nullptr) continue;
    DLPROBE_RETURN_IF_ERROR(upload_to(*state[i].master, init[i], model.state()[i].name));
  }
  return Status::ok();
}

// Emits the draft call list. Kept apart from Impl so the planning state (value buffers, gradient
// sharing) lives only while planning.
class Planner {
 public:
  explicit Planner(StepState& s) : s_(s), be_(s.backend) {}

  Status run(const std::vector<Shape>& shapes);
  std::vector<Draft> take() { return std::move(drafts_); }

 private:
  void emit(std::string name, CallKind kind, const std::string& layer, std::vector<Buffer*> uses,
            std::function<Status()> fn) {
    drafts_.push_back({Call{std::move(name), kind, layer, std::move(fn)}, std::move(uses)});
  }

  Result<Buffer*> new_value(const std::string& owner, Category category, const Shape& shape,
                            DType dtype) {
    DLPROBE_ASSIGN_OR_RETURN(TensorDesc d, make_desc(shape, dtype, s_.config.layout));
    return s_.transient(d, category, owner);
  }
  Buffer* cast_to(Buffer* src, DType dtype, Category category, const std::string& layer,
                  const std::string& what) {
    Buffer* dst = s_.transient(src->view.desc.with_dtype(dtype), category, layer);
    emit(fmt::format("{}.{}.cast", layer, what), CallKind::cast, layer, {src, dst},
         [&be = be_, src, dst] { return be.cast(src->view, dst->view); });
    return dst;
  }
  // The parameter a forward call reads: the working copy under mixed precision, cast from the
  // master first (autocast's per-op cast), else the master.
  Buffer* weight_for_forward(int entry, const std::string& layer) {
    StateSlot& slot = s_.state[static_cast<std::size_t>(entry)];
    if (slot.working == nullptr) return slot.master;
    Buffer* src = slot.master;
    Buffer* dst = slot.working;
    emit(s_.model.state()[static_cast<std::size_t>(entry)].name + ".cast", CallKind::cast, layer,
         {src, dst}, [&be = be_, src, dst] { return be.cast(src->view, dst->view); });
    return dst;
  }
  // Where a backward call writes a parameter's gradient: straight into the fp32 gradient, or under
  // mixed precision into a low-precision temporary that finish_grad() casts.
  Buffer* grad_target(int entry, const std::string& layer) {
    StateSlot& slot = s_.state[static_cast<std::size_t>(entry)];
    if (slot.working == nullptr) return slot.grad;
    return s_.transient(slot.working->view.desc, Category::temporaries, layer);
  }
  void finish_grad(int entry, Buffer* target, const std::string& layer) {
    StateSlot& slot = s_.state[static_cast<std::size_t>(entry)];
    if (target == slot.grad) return;
    Buffer* dst = slot.grad;
    emit(s_.model.state()[static_cast<std::size_t>(entry)].name + ".grad.cast", CallKind::cast,
         layer, {target, dst},
         [&be = be_, target, dst] { return be.cast(target->view, dst->view); });
  }
  // Adds `g` to the gradient of value v. Gradient buffers are shared where the math allows (the
  // residual add passes its gradient to both inputs unchanged); a shared buffer is never added
  // into in place.
  void contribute(int v, Buffer* g, const std::string& layer) {
    Buffer*& cur = grad_[static_cast<std::size_t>(v)];
    if (cur == nullptr) {
      cur = g;
      ++sharers_[g];
      return;
    }
    Buffer* out = cur;
    if (sharers_[cur] > 1) {
      --sharers_[cur];
      out = s_.transient(cur->view.desc, Category::temporaries, layer);
      ++sharers_[out];
    }
    Buffer* a = cur;
    emit(layer + ".grad_accumulate", CallKind::add, layer, {a, g, out},
         [&be = be_, a, g, out] { return be.add(a->view, g->view, out->view); });
    last_sum_ = {drafts_.size() - 1, a, g, out};
    cur = out;
  }
  // Whether `dy` is the sum the last draft made, with nothing else holding it: a ReLU's backward
  // can then take the two terms itself and the sum is dropped.
  bool pending_sum(Buffer* dy) {
    const bool last = !drafts_.empty() && last_sum_.draft == drafts_.size() - 1;
    return last && last_sum_.out == dy && sharers_[dy] == 1;
  }
  void release_grad(int v) {
    Buffer*& cur = grad_[static_cast<std::size_t>(v)];
    if (cur != nullptr) --sharers_[cur];
    cur = nullptr;
  }

  Status forward(const model::Layer& l, std::size_t index);
  Status backward(const model::Layer& l, std::size_t index);
  // Which batch norms run with what follows them (StepConfig::fuse): a BN whose output only a
  // ReLU reads takes that ReLU; a BN whose output only a residual add reads, the add's output only
  // a ReLU, takes both (the add's other operand is computed earlier in the layer order).
  void plan_fusion();
  Status forward_batch_norm(const model::Layer& l, std::size_t i);
  int entry_of(std::size_t layer, StateKind kind) const {
    const auto& st = s_.model.state();
    for (std::size_t i = 0; i < st.size(); ++i) {
      if (static_cast<std::size_t>(st[i].layer) == layer && st[i].kind == kind)
        return static_cast<int>(i);
    }
    return -1;
  }
  Buffer* master_of(std::size_t layer, StateKind kind) const {
    return s_.state[static_cast<std::size_t>(entry_of(layer, kind))].master;
  }

  StepState& s_;
  Backend& be_;
  std::vector<Draft> drafts_;
  std::vector<Shape> shapes_;
  std::vector<Buffer*> value_;       // forward value -> buffer
  std::vector<bool> saved_;          // value saved for backward
  std::vector<int> consumers_;       // layers reading the value
  std::vector<Buffer*> conv_input_;  // per layer: what a conv read (the cast images for conv1)
  std::vector<Buffer*> bn_mean_, bn_invstd_;
  std::vector<Buffer*> grad_;
  std::map<Buffer*, int> sharers_;
  enum class Fusion : std::uint8_t { none, relu, add_relu };
  std::vector<Fusion> fusion_;  // per layer: what a batch norm takes in
  struct Sum {
    std::size_t draft = static_cast<std::size_t>(-1);
    Buffer* a = nullptr;
    Buffer* b = nullptr;
    Buffer* out = nullptr;
  };
  Sum last_sum_;                     // the latest gradient accumulation contribute() emitted
  std::vector<bool> folded_;         // per layer: a ReLU or add run inside the batch norm before it
  Buffer* logits_master_ = nullptr;  // the fp32 logits the loss reads
};

Status Planner::run(const std::vector<Shape>& shapes) {
  shapes_ = shapes;
  const auto& layers = s_.model.layers();
  const std::size_t values = shapes.size();
  value_.assign(values, nullptr);
  saved_.assign(values, false);
  consumers_.assign(values, 0);
  grad_.assign(values, nullptr);
  conv_input_.assign(layers.size(), nullptr);
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
  plan_fusion();

  for (std::size_t i = 0; i < layers.size(); ++i) DLPROBE_RETURN_IF_ERROR(forward(layers[i], i));

  // autocast runs cross-entropy in fp32: low-precision logits are cast up first.
  const std::string loss = "loss";
  Buffer* logits = value_[static_cast<std::size_t>(s_.model.logits())];
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
  if (!s_.training()) return Status::ok();

  Buffer* dlogits = s_.transient(logits->view.desc, Category::temporaries, loss);
  const double* scale = &s_.scale;
  emit("loss.backward", CallKind::cross_entropy_backward, loss, {logits, labels, dlogits},
       [&be = be_, logits, labels, dlogits, scale] {
         return be.cross_entropy_backward(logits->view, labels->view, *scale, dlogits->view);
       });
  Buffer* dlow = dlogits;
  if (s_.act() != s_.master())
    dlow = cast_to(dlogits, s_.act(), Category::temporaries, loss, "grad");
  contribute(s_.model.logits(), dlow, loss);
  for (std::size_t i = layers.size(); i-- > 0;) {
    DLPROBE_RETURN_IF_ERROR(backward(layers[i], i));
    release_grad(layers[i].output);
  }
  if (s_.config.mode != StepMode::train) return Status::ok();

  std::vector<TensorView> grads;
  std::vector<OptimizerSlot> slots;
  for (const StateSlot& slot : s_.state) {
    if (slot.grad == nullptr) continue;
    grads.push_back(slot.grad->view);
    slots.push_back({slot.master->view, slot.grad->view,
                     slot.state0 != nullptr ? slot.state0->view : TensorView{},
                     slot.state1 != nullptr ? slot.state1->view : TensorView{}});
  }
  const TensorView found_inf = s_.found_inf != nullptr ? s_.found_inf->view : TensorView{};
  if (s_.found_inf != nullptr) {
    Buffer* flag = s_.found_inf;
    // The flag collects over one step only.
    drafts_.insert(drafts_.begin(),
                   Draft{Call{"grad_scaler.reset_found_inf", CallKind::fill, "grad_scaler",
                              [&be = be_, flag] { return be.fill(flag->view, 0.0); }},
                         {flag}});
    emit("grad_scaler.unscale", CallKind::unscale_gradients, "grad_scaler", {},
         [&be = be_, grads, scale, found_inf] {
           return be.unscale_gradients(grads, 1.0 / *scale, found_inf);
         });
  }
  const std::int64_t* step = &s_.queued_step;
  if (s_.config.optimizer == OptimizerKind::sgd) {
    emit("optimizer.sgd_step", CallKind::sgd_step, "optimizer", {},
         [&be = be_, slots, p = s_.config.sgd, step, found_inf] {
           return be.sgd_step(slots, p, *step, found_inf);
         });
  } else {
    emit("optimizer.adamw_step", CallKind::adamw_step, "optimizer", {},
         [&be = be_, slots, p = s_.config.adamw, step, found_inf] {
           return be.adamw_step(slots, p, *step, found_inf);
         });
  }
  return Status::ok();
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

// A batch norm, and under fusion the ReLU (and add) it takes in: their output is the ReLU's.
Status Planner::forward_batch_norm(const model::Layer& l, std::size_t i) {
  const auto& layers = s_.model.layers();
  const Fusion f = fusion_[i];
  const model::Layer& last = f == Fusion::relu       ? layers[i + 1]
                             : f == Fusion::add_relu ? layers[i + 2]
                                                     : l;
  const auto out = static_cast<std::size_t>(last.output);
  Buffer* x = value_[static_cast<std::size_t>(l.inputs[0])];
  Buffer* residual = nullptr;
  if (f == Fusion::add_relu) {
    const model::Layer& add = layers[i + 1];
    residual =
        value_[static_cast<std::size_t>(add.inputs[0] == l.output ? add.inputs[1] : add.inputs[0])];
  }
  Buffer* gamma = master_of(i, StateKind::bn_weight);
  Buffer* beta = master_of(i, StateKind::bn_bias);
  Buffer* mean = master_of(i, StateKind::running_mean);
  Buffer* var = master_of(i, StateKind::running_var);
  const Category category = saved_[out] ? Category::activations : Category::temporaries;
  DLPROBE_ASSIGN_OR_RETURN(Buffer * y, new_value(last.name, category, shapes_[out], s_.act()));
  const BatchNormParams p = l.batch_norm;
  const std::string name = l.name + (f == Fusion::relu       ? ".forward+relu"
                                     : f == Fusion::add_relu ? ".forward+add+relu"
                                                             : ".forward");
  const TensorView none{};
  if (s_.training()) {
    Buffer* sm = s_.transient(gamma->view.desc, Category::activations, l.name);
    Buffer* si = s_.transient(gamma->view.desc, Category::activations, l.name);
    bn_mean_[i] = sm;
    bn_invstd_[i] = si;
    if (f == Fusion::none) {
      emit(name, CallKind::batch_norm_train_forward, l.name, {x, gamma, beta, mean, var, y, sm, si},
           [&be = be_, x, gamma, beta, mean, var, y, sm, si, p] {
             return be.batch_norm_train_forward(x->view, gamma->view, beta->view, mean->view,
                                                var->view, y->view, sm->view, si->view, p);
           });
    } else {
      std::vector<Buffer*> uses{x, gamma, beta, mean, var, y, sm, si};
      if (residual != nullptr) uses.push_back(residual);
      emit(name, CallKind::batch_norm_relu_train_forward, l.name, std::move(uses),
           [&be = be_, x, gamma, beta, mean, var, residual, y, sm, si, p, none] {
             return be.batch_norm_relu_train_forward(
                 x->view, gamma->view, beta->view, mean->view, var->view,
                 residual != nullptr ? residual->view : none, y->view, sm->view, si->view, p);
           });
    }
  } else if (f == Fusion::none) {
    emit(name, CallKind::batch_norm_inference_forward, l.name, {x, gamma, beta, mean, var, y},
         [&be = be_, x, gamma, beta, mean, var, y, p] {
           return be.batch_norm_inference_forward(x->view, gamma->view, beta->view, mean->view,
                                                  var->view, y->view, p);
         });
  } else {
    std::vector<Buffer*> uses{x, gamma, beta, mean, var, y};
    if (residual != nullptr) uses.push_back(residual);
    emit(name, CallKind::batch_norm_relu_inference_forward, l.name, std::move(uses),
         [&be = be_, x, gamma, beta, mean, var, residual, y, p, none] {
           return be.batch_norm_relu_inference_forward(
               x->view, gamma->view, beta->view, mean->view, var->view,
               residual != nullptr ? residual->view : none, y->view, p);
         });
  }
  value_[out] = y;
  return Status::ok();
}

Status Planner::forward(const model::Layer& l, std::size_t i) {
  if (folded_[i]) return Status::ok();  // run by the batch norm before it
  if (l.kind == LayerKind::batch_norm) return forward_batch_norm(l, i);
  const auto out = static_cast<std::size_t>(l.output);
  const auto in = static_cast<std::size_t>(l.inputs[0]);
  const Shape& ys = shapes_[out];
  const Category out_category = saved_[out] ? Category::activations : Category::temporaries;
  Buffer* x = value_[in];
  Buffer* y = nullptr;
  const std::string& name = l.name;
  switch (l.kind) {
    case LayerKind::conv: {
      if (x->view.desc.dtype() != s_.act()) {
        x = cast_to(x, s_.act(), saved_[in] ? Category::activations : Category::temporaries, name,
                    "input");
      }
      conv_input_[i] = x;
      Buffer* w = weight_for_forward(entry_of(i, StateKind::conv_weight), name);
      DLPROBE_ASSIGN_OR_RETURN(y, new_value(name, out_category, ys, s_.act()));
      emit(name + ".forward", CallKind::conv_forward, name, {x, w, y},
           [&be = be_, x, w, y, p = l.conv] {
             return be.conv2d_forward(x->view, w->view, y->view, p);
           });
      break;
    }
    case LayerKind::batch_norm:
      break;  // forward_batch_norm
    case LayerKind::relu: {
      DLPROBE_ASSIGN_OR_RETURN(y, new_value(name, out_category, ys, s_.act()));
      emit(name + ".forward", CallKind::relu_forward, name, {x, y},
           [&be = be_, x, y] { return be.relu_forward(x->view, y->view); });
      break;
    }
    case LayerKind::max_pool: {
      DLPROBE_ASSIGN_OR_RETURN(y, new_value(name, out_category, ys, s_.act()));
      emit(name + ".forward", CallKind::max_pool_forward, name, {x, y},
           [&be = be_, x, y, p = l.pool] { return be.max_pool2d_forward(x->view, y->view, p); });
      break;
    }
    case LayerKind::add: {
      Buffer* b = value_[static_cast<std::size_t>(l.inputs[1])];
      // torchvision adds the shortcut in place (out += identity) into the last BN's output, which
      // nothing else reads; so does the plan, to hold no more memory than PyTorch.
      if (!saved_[in] && consumers_[in] == 1 && saved_[out] == saved_[in]) {
        y = x;
      } else {
        DLPROBE_ASSIGN_OR_RETURN(y, new_value(name, out_category, ys, s_.act()));
      }
      emit(name + ".forward", CallKind::add, name, {x, b, y},
           [&be = be_, x, b, y] { return be.add(x->view, b->view, y->view); });
      break;
    }
    case LayerKind::global_avg_pool: {
      DLPROBE_ASSIGN_OR_RETURN(y, new_value(name, out_category, ys, s_.act()));
      emit(name + ".forward", CallKind::global_avg_pool_forward, name, {x, y},
           [&be = be_, x, y] { return be.global_avg_pool_forward(x->view, y->view); });
      break;
    }
    case LayerKind::linear: {
      Buffer* w = weight_for_forward(entry_of(i, StateKind::fc_weight), name);
      Buffer* b = weight_for_forward(entry_of(i, StateKind::fc_bias), name);
      DLPROBE_ASSIGN_OR_RETURN(y, new_value(name, out_category, ys, s_.act()));
      emit(name + ".forward", CallKind::linear_forward, name, {x, w, b, y},
           [&be = be_, x, w, b, y] {
             return be.linear_forward(x->view, w->view, b->view, y->view);
           });
      break;
    }
  }
  value_[out] = y;
  return Status::ok();
}

Status Planner::backward(const model::Layer& l, std::size_t i) {
  const auto out = static_cast<std::size_t>(l.output);
  const auto in = static_cast<std::size_t>(l.inputs[0]);
  Buffer* dy = grad_[out];
  if (dy == nullptr) {
    return error(Errc::internal, fmt::format("{}: no gradient reaches the output", l.name));
  }
  const std::string& name = l.name;
  Buffer* x = value_[in];
  auto new_dx = [&] { return s_.transient(x->view.desc, Category::temporaries, name); };
  switch (l.kind) {
    case LayerKind::conv: {
      const int entry = entry_of(i, StateKind::conv_weight);
      const StateSlot& slot = s_.state[static_cast<std::size_t>(entry)];
      Buffer* w = slot.working != nullptr ? slot.working : slot.master;
      Buffer* xin = conv_input_[i];
      const Conv2dParams p = l.conv;
      Buffer* dx = nullptr;
      // The images need no gradient, so conv1 skips its data gradient as autograd does.
      if (l.inputs[0] != model::kImages) {
        dx = new_dx();
        emit(name + ".backward_data", CallKind::conv_backward_data, name, {dy, w, dx},
             [&be = be_, dy, w, dx, p] {
               return be.conv2d_backward_data(dy->view, w->view, dx->view, p);
             });
      }
      Buffer* dw = grad_target(entry, name);
      emit(name + ".backward_weight", CallKind::conv_backward_weight, name, {xin, dy, dw},
           [&be = be_, xin, dy, dw, p] {
             return be.conv2d_backward_weight(xin->view, dy->view, dw->view, p);
           });
      finish_grad(entry, dw, name);
      if (dx != nullptr) contribute(l.inputs[0], dx, name);
      break;
    }
    case LayerKind::batch_norm: {
      const int gi = entry_of(i, StateKind::bn_weight);
      const int bi = entry_of(i, StateKind::bn_bias);
      Buffer* gamma = s_.state[static_cast<std::size_t>(gi)].master;
      Buffer* dgamma = s_.state[static_cast<std::size_t>(gi)].grad;
      Buffer* dbeta = s_.state[static_cast<std::size_t>(bi)].grad;
      Buffer* sm = bn_mean_[i];
      Buffer* si = bn_invstd_[i];
      Buffer* dx = new_dx();
      if (fusion_[i] == Fusion::relu) {
        // dy is the gradient of the ReLU's output y, which the ReLU's backward passed on as is.
        Buffer* y = value_[static_cast<std::size_t>(s_.model.layers()[i + 1].output)];
        emit(name + ".backward+relu", CallKind::batch_norm_relu_backward, name,
             {dy, y, x, gamma, sm, si, dx, dgamma, dbeta},
             [&be = be_, dy, y, x, gamma, sm, si, dx, dgamma, dbeta] {
               return be.batch_norm_relu_backward(dy->view, y->view, x->view, gamma->view, sm->view,
                                                  si->view, dx->view, dgamma->view, dbeta->view);
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
      break;
    }
    case LayerKind::relu: {
      if (i > 0 && fusion_[i - 1] == Fusion::relu) {
        contribute(l.inputs[0], dy, name);  // the batch norm's fused backward applies the mask
        break;
      }
      Buffer* y = value_[out];
      // Shaped like y: under add+ReLU fusion the input (the sum) was never stored.
      Buffer* dx = s_.transient(y->view.desc, Category::temporaries, name);
      if (s_.config.fuse && be_.fuses_relu_backward_add() && pending_sum(dy)) {
        // ResNet's block output feeds the next block and its shortcut, so its gradient arrives
        // as a sum: one pass adds and masks instead of writing the sum and reading it back.
        drafts_.pop_back();
        Buffer* a = last_sum_.a;
        Buffer* b = last_sum_.b;
        emit(name + ".backward+grad_accumulate", CallKind::relu_backward_add, name, {a, b, y, dx},
             [&be = be_, a, b, y, dx] {
               return be.relu_backward_add(a->view, b->view, y->view, dx->view);
             });
      } else {
        emit(name + ".backward", CallKind::relu_backward, name, {dy, y, dx},
             [&be = be_, dy, y, dx] { return be.relu_backward(dy->view, y->view, dx->view); });
      }
      contribute(l.inputs[0], dx, name);
      break;
    }
    case LayerKind::max_pool: {
      Buffer* y = value_[out];
      Buffer* dx = new_dx();
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
      Buffer* dx = new_dx();
      emit(name + ".backward", CallKind::global_avg_pool_backward, name, {dy, dx},
           [&be = be_, dy, dx] { return be.global_avg_pool_backward(dy->view, dx->view); });
      contribute(l.inputs[0], dx, name);
      break;
    }
    case LayerKind::linear: {
      const int wi = entry_of(i, StateKind::fc_weight);
      const int bi = entry_of(i, StateKind::fc_bias);
      const StateSlot& ws = s_.state[static_cast<std::size_t>(wi)];
      Buffer* w = ws.working != nullptr ? ws.working : ws.master;
      Buffer* dx = new_dx();
      Buffer* dw = grad_target(wi, name);
      Buffer* db = grad_target(bi, name);
      emit(name + ".backward", CallKind::linear_backward, name, {dy, x, w, dx, dw, db},
           [&be = be_, dy, x, w, dx, dw, db] {
             return be.linear_backward(dy->view, x->view, w->view, dx->view, dw->view, db->view);
           });
      finish_grad(wi, dw, name);
      finish_grad(bi, db, name);
      contribute(l.inputs[0], dx, name);
      break;
    }
  }
  return Status::ok();
}

// Lifetimes: the first and last draft that use each transient buffer. Under MemoryPlan::dynamic
// every transient buffer is allocated by an `alloc` entry just before its first use and freed by a
// `free` entry just after its last; under planned the buffers are laid out in one arena from these
// lifetimes and the list holds only the drafts' calls.
Result<std::vector<Call>> schedule(StepState& s, std::vector<Draft> drafts) {
  std::map<Buffer*, std::size_t> first;
  std::map<Buffer*, std::size_t> last;
  // In order of first use, so allocation order follows the step (the maps order by address).
  std::vector<Buffer*> order;
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    for (Buffer* b : drafts[i].uses) {
      if (!b->transient) continue;
      if (first.try_emplace(b, i).second) order.push_back(b);
      last[b] = i;
    }
  }
  if (s.config.memory_plan == MemoryPlan::planned) {
    std::vector<memory::Lifetime> lifetimes;
    lifetimes.reserve(order.size());
    for (Buffer* b : order) lifetimes.push_back({b->view.desc.bytes(), first[b], last[b]});
    DLPROBE_ASSIGN_OR_RETURN(memory::ArenaPlan plan, memory::plan_arena(lifetimes));
    // A wrong layout would corrupt values silently, so it is checked once here.
    DLPROBE_RETURN_IF_ERROR(memory::check_arena_plan(lifetimes, plan));
    DLPROBE_ASSIGN_OR_RETURN(
        s.arena, s.allocator.allocate_buffer(plan.arena_bytes, Category::arena, "planned arena"));
    s.arena_layout = ArenaLayout{plan.arena_bytes, plan.peak_live_bytes};
    auto* base = static_cast<std::byte*>(s.arena.data());
    for (std::size_t k = 0; k < order.size(); ++k) {
      Buffer* b = order[k];
      b->view.data = base + plan.offsets[k];
      s.transients.push_back(
          {b->owner, b->category, b->view.desc.bytes(), first[b], last[b], plan.offsets[k]});
    }
    std::vector<Call> calls;
    calls.reserve(drafts.size());
    for (Draft& d : drafts) calls.push_back(std::move(d.call));
    return calls;
  }

  std::vector<std::vector<Buffer*>> allocs(drafts.size());
  std::vector<std::vector<Buffer*>> frees(drafts.size());
  for (Buffer* b : order) allocs[first[b]].push_back(b);
  // Frees in the order the draft uses them.
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    for (Buffer* b : drafts[i].uses) {
      if (!b->transient || last[b] != i) continue;
      if (std::find(frees[i].begin(), frees[i].end(), b) == frees[i].end()) frees[i].push_back(b);
    }
  }
  std::map<Buffer*, std::size_t> transient_index;
  std::vector<Call> calls;
  memory::CachingAllocator& allocator = s.allocator;
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    for (Buffer* b : allocs[i]) {
      transient_index[b] = s.transients.size();
      s.transients.push_back({b->owner, b->category, b->view.desc.bytes(), calls.size(), 0, 0});
      calls.push_back({fmt::format("alloc {} {} {}", b->owner, memory::category_name(b->category),
                                   b->view.desc.str()),
                       CallKind::alloc, b->owner, [&allocator, b]() -> Status {
                         DLPROBE_ASSIGN_OR_RETURN(
                             b->view.data,
                             allocator.allocate(b->view.desc.bytes(), b->category, b->owner));
                         return Status::ok();
                       }});
    }
    calls.push_back(std::move(drafts[i].call));
    for (Buffer* b : frees[i]) {
      s.transients[transient_index[b]].last_call = calls.size();
      calls.push_back({fmt::format("free {} {} {}", b->owner, memory::category_name(b->category),
                                   b->view.desc.str()),
                       CallKind::free, b->owner, [&allocator, b]() -> Status {
                         void* ptr = b->view.data;
                         b->view.data = nullptr;
                         return allocator.deallocate(ptr);
                       }});
    }
  }
  return calls;
}

void StepState::release_transients() {
  // A planned step's buffers point into its arena, which lives as long as the step.
  if (arena_layout) return;
  for (const auto& b : buffers) {
    if (!b->transient || b->view.data == nullptr) continue;
    // Already failing: the first error is the one to report.
    (void)allocator.deallocate(b->view.data);
    b->view.data = nullptr;
  }
}

Status check_config(const StepConfig& c) {
  if (c.batch < 1) return invalid_argument(fmt::format("batch must be >= 1, got {}", c.batch));
  if (c.graph && c.memory_plan != MemoryPlan::planned) {
    return invalid_argument("a graph replay needs the planned memory plan (fixed addresses)");
  }
  if (c.graph && c.mode == StepMode::train) {
    return invalid_argument("a graph replay runs modes grads and infer, not train");
  }
  if (c.mode == StepMode::train) {
    DLPROBE_RETURN_IF_ERROR(c.optimizer == OptimizerKind::sgd ? sgd_check(c.sgd)
                                                              : adamw_check(c.adamw));
  }
  const GradScalerOptions& g = c.scaler;
  // GradScaler's own constraints.
  if (!(g.init_scale > 0.0) || !std::isfinite(g.init_scale)) {
    return invalid_argument(fmt::format("grad scaler: init scale {} must be > 0", g.init_scale));
  }
  if (!(g.growth_factor > 1.0)) {
    return invalid_argument(
        fmt::format("grad scaler: growth factor {} must be > 1", g.growth_factor));
  }
  if (!(g.backoff_factor > 0.0 && g.backoff_factor < 1.0)) {
    return invalid_argument(
        fmt::format("grad scaler: backoff factor {} must be in (0, 1)", g.backoff_factor));
  }
  if (g.growth_interval < 1) {
    return invalid_argument(
        fmt::format("grad scaler: growth interval {} must be >= 1", g.growth_interval));
  }
  return Status::ok();
}

}  // namespace

struct TrainingStep::Impl : StepState {
  using StepState::StepState;
};

TrainingStep::TrainingStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainingStep::~TrainingStep() {
  if (!impl_) return;
  // The recorded graph's memory is the backend's; a sweep's next configuration on the same
  // backend would carry it (on an H200 one evaluate sweep held 25 GiB of dead graph workspaces
  // by its twentieth configuration).
  if (impl_->graph) impl_->backend.release_graph(*impl_->graph);
  impl_->release_transients();
}

Result<std::unique_ptr<TrainingStep>> TrainingStep::create(const StepConfig& config,
                                                           Backend& backend,
                                                           memory::CachingAllocator& allocator) {
  DLPROBE_RETURN_IF_ERROR(check_config(config));
  DLPROBE_ASSIGN_OR_RETURN(model::Model m, model::Model::create(config.model));
  DLPROBE_ASSIGN_OR_RETURN(std::vector<Shape> shapes,
                           m.value_shapes(config.batch, config.mode != StepMode::infer));
  auto impl = std::make_unique<Impl>(config, std::move(m), backend, allocator);
  backend.set_math_mode(config.precision == Precision::tf32 ? MathMode::tf32
                                                            : MathMode::strict_fp32);
  impl->scale = impl->scaling() ? config.scaler.init_scale : 1.0;
  DLPROBE_RETURN_IF_ERROR(impl->allocate_state());
  DLPROBE_RETURN_IF_ERROR(impl->upload_initial_state());
  Planner planner(*impl);
  DLPROBE_RETURN_IF_ERROR(planner.run(shapes));
  DLPROBE_ASSIGN_OR_RETURN(impl->calls, schedule(*impl, planner.take()));
  return std::unique_ptr<TrainingStep>(new TrainingStep(std::move(impl)));
}

const StepConfig& TrainingStep::config() const {
  return impl_->config;
}
const model::Model& TrainingStep::model() const {
  return impl_->model;
}
const std::vector<Call>& TrainingStep::calls() const {
  return impl_->calls;
}
const std::vector<TransientBuffer>& TrainingStep::transients() const {
  return impl_->transients;
}
std::optional<ArenaLayout> TrainingStep::arena() const {
  return impl_->arena_layout;
}
std::size_t TrainingStep::current_call() const {
  return impl_->current_call;
}
bool TrainingStep::graph_recorded() const {
  return impl_->graph.has_value();
}
double TrainingStep::loss_scale() const {
  return impl_->scale;
}
std::int64_t TrainingStep::optimizer_steps() const {
  return impl_->optimizer_steps;
}

Status TrainingStep::set_input(const HostTensor& images, const HostTensor& labels) {
  const StepConfig& c = impl_->config;
  const Shape want{c.batch, 3, c.model.image_size, c.model.image_size};
  if (!(images.shape() == want) || !dtype_is_floating(images.dtype())) {
    return invalid_argument(fmt::format("images must be a floating {} tensor, got {} {}",
                                        want.str(), dtype_name(images.dtype()),
                                        images.shape().str()));
  }
  if (!(labels.shape() == Shape{c.batch}) ||
      (labels.dtype() != DType::int32 && labels.dtype() != DType::int64)) {
    return invalid_argument(fmt::format("labels must be int32 or int64 [{}], got {} [{}]", c.batch,
                                        dtype_name(labels.dtype()), labels.shape().str()));
  }
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    const double label = labels.get(i);
    if (label < 0 || label >= static_cast<double>(c.model.classes)) {
      return invalid_argument(
          fmt::format("label {} of sample {} is outside [0, {})", label, i, c.model.classes));
    }
  }
  DLPROBE_RETURN_IF_ERROR(impl_->backend.synchronize());
  DLPROBE_RETURN_IF_ERROR(impl_->upload_to(*impl_->images, images, "images"));
  DLPROBE_RETURN_IF_ERROR(impl_->upload_to(*impl_->labels, labels, "labels"));
  impl_->input_set = true;
  return Status::ok();
}

Status TrainingStep::enqueue() {
  return impl_->enqueue(nullptr, [this] { return collect().status(); });
}

Status StepState::enqueue(const std::size_t* marks, const std::function<Status()>& collect) {
  StepState& s = *this;
  if (!s.input_set) return invalid_argument("set_input() must come before the first step");
  const bool unscaling = s.found_inf != nullptr;
  if (s.pending && unscaling) DLPROBE_RETURN_IF_ERROR(collect());
  s.pending_scale = s.scale;
  if (s.config.mode == StepMode::train) {
    s.queued_step = s.optimizer_steps + 1;
    // Without a scaler no step is ever skipped, so the count need not wait for the result.
    if (!unscaling) s.optimizer_steps = s.queued_step;
  }
  if (s.training()) {
    for (std::size_t i = 0; i < s.state.size(); ++i) {
      if (s.model.state()[i].kind == StateKind::num_batches_tracked) {
        ++s.state[i].num_batches_tracked;
      }
    }
  }
  if (s.config.graph && marks == nullptr && !s.graph_failed) {
    if (!s.graph && s.eager_runs > 0) {
      Result<std::size_t> recorded = s.backend.capture([&s]() -> Status {
        for (const Call& call : s.calls) {
          const Status st = call.run();
          if (!st.is_ok()) return st.with_context(call.name);
        }
        return Status::ok();
      });
      if (recorded.has_value()) {
        s.graph = *recorded;
      } else {
        s.graph_failed = true;
        log_warn("the step runs eagerly: {}", recorded.status().message());
      }
    }
    if (s.graph) {
      DLPROBE_RETURN_IF_ERROR(s.backend.replay(*s.graph));
      s.pending = true;
      return Status::ok();
    }
  }
  // The capture at the next step sizes the graph's shared workspace from what this run's calls
  // take: a count of this step's own, not of whatever ran on the backend before it.
  if (s.config.graph && !s.graph && !s.graph_failed && marks == nullptr) {
    s.backend.reset_call_workspace_peak();
  }
  ++s.eager_runs;
  for (std::size_t i = 0; i < s.calls.size(); ++i) {
    if (marks != nullptr) DLPROBE_RETURN_IF_ERROR(s.backend.mark(*marks + i));
    s.current_call = i;
    const Status st = s.calls[i].run();
    if (!st.is_ok()) {
      s.release_transients();
      s.pending = false;
      return st.with_context(s.calls[i].name);
    }
  }
  if (marks != nullptr) DLPROBE_RETURN_IF_ERROR(s.backend.mark(*marks + s.calls.size()));
  s.pending = true;
  return Status::ok();
}

Result<StepResult> TrainingStep::collect() {
  Impl& s = *impl_;
  if (!s.pending) return invalid_argument("no step is queued");
  s.pending = false;
  DLPROBE_ASSIGN_OR_RETURN(HostTensor loss, s.download(*s.loss));
  StepResult r;
  r.loss = loss.get(0);
  r.loss_scale = s.pending_scale;
  if (s.found_inf != nullptr) {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor found, s.download(*s.found_inf));
    // torch.cuda.amp.GradScaler.update: back off on inf/NaN, grow after growth_interval clean
    // steps in a row.
    const GradScalerOptions& g = s.config.scaler;
    if (found.get(0) != 0.0) {
      r.skipped = true;
      s.scale *= g.backoff_factor;
      s.growth_tracker = 0;
    } else {
      ++s.optimizer_steps;
      if (++s.growth_tracker == g.growth_interval) {
        s.scale *= g.growth_factor;
        s.growth_tracker = 0;
      }
    }
  }
  return r;
}

Result<StepResult> TrainingStep::run_step() {
  DLPROBE_RETURN_IF_ERROR(enqueue());
  return collect();
}

Result<std::vector<double>> TrainingStep::profile_step(std::size_t first_mark) {
  DLPROBE_RETURN_IF_ERROR(impl_->enqueue(&first_mark, [this] { return collect().status(); }));
  DLPROBE_RETURN_IF_ERROR(collect().status());
  std::vector<double> ms(impl_->calls.size());
  for (std::size_t i = 0; i < ms.size(); ++i) {
    DLPROBE_ASSIGN_OR_RETURN(ms[i], impl_->backend.elapsed_ms(first_mark + i, first_mark + i + 1));
  }
  return ms;
}

namespace {

Result<int> find_entry(const model::Model& m, std::string_view name) {
  const int i = m.find_state(name);
  if (i < 0) {
    return error(Errc::not_found, fmt::format("{} has no tensor named '{}'",
                                              model::arch_name(m.config().arch), name));
  }
  return i;
}

}  // namespace

Result<HostTensor> TrainingStep::tensor(std::string_view name) const {
  DLPROBE_ASSIGN_OR_RETURN(const int i, find_entry(impl_->model, name));
  const StateSlot& slot = impl_->state[static_cast<std::size_t>(i)];
  if (slot.master == nullptr) {
    HostTensor t(TensorDesc::make(Shape{1}, DType::int64).value());
    t.set(0, static_cast<double>(slot.num_batches_tracked));
    return t;
  }
  return impl_->download(*slot.master);
}

Result<HostTensor> TrainingStep::gradient(std::string_view name) const {
  DLPROBE_ASSIGN_OR_RETURN(const int i, find_entry(impl_->model, name));
  const StateSlot& slot = impl_->state[static_cast<std::size_t>(i)];
  if (slot.grad == nullptr) {
    return invalid_argument(
        fmt::format("'{}' has no gradient in mode {}", name, step_mode_name(impl_->config.mode)));
  }
  return impl_->download(*slot.grad);
}

Status TrainingStep::set_tensor(std::string_view name, const HostTensor& value) {
  DLPROBE_ASSIGN_OR_RETURN(const int i, find_entry(impl_->model, name));
  StateSlot& slot = impl_->state[static_cast<std::size_t>(i)];
  if (slot.master == nullptr) {
    if (value.numel() != 1 || dtype_is_floating(value.dtype())) {
      return invalid_argument(fmt::format("{}: expected one integer, got {} [{}]", name,
                                          dtype_name(value.dtype()), value.shape().str()));
    }
    slot.num_batches_tracked = static_cast<std::int64_t>(value.get(0));
    return Status::ok();
  }
  if (!dtype_is_floating(value.dtype())) {
    return invalid_argument(
        fmt::format("{}: expected a floating tensor, got {}", name, dtype_name(value.dtype())));
  }
  DLPROBE_RETURN_IF_ERROR(impl_->backend.synchronize());
  return impl_->upload_to(*slot.master, value, name);
}

Result<safetensors::File> TrainingStep::state_dict() const {
  safetensors::File file;
  for (const model::StateEntry& e : impl_->model.state()) {
    DLPROBE_ASSIGN_OR_RETURN(HostTensor t, tensor(e.name));
    safetensors::Tensor out;
    out.name = e.name;
    out.dtype = t.dtype();
    if (e.kind != StateKind::num_batches_tracked) {
      for (int d = 0; d < e.shape.rank; ++d) out.shape.push_back(e.shape[d]);
    }
    // PyTorch's tensors are contiguous in logical order: NCHW for conv weights.
    const HostTensor contiguous =
        t.layout() == Layout::nchw ? std::move(t) : t.to_layout(Layout::nchw);
    const auto* bytes = static_cast<const std::byte*>(contiguous.data());
    out.data.assign(bytes, bytes + contiguous.desc().bytes());
    file.tensors.push_back(std::move(out));
  }
  return file;
}

Status TrainingStep::load_state_dict(const safetensors::File& file) {
  const model::Model& m = impl_->model;
  for (const safetensors::Tensor& t : file.tensors) {
    if (m.find_state(t.name) < 0) {
      return invalid_argument(fmt::format("unexpected tensor '{}' in the state dict for {}", t.name,
                                          model::arch_name(m.config().arch)));
    }
  }
  std::vector<HostTensor> values;
  for (const model::StateEntry& e : m.state()) {
    const safetensors::Tensor* t = file.find(e.name);
    if (t == nullptr) {
      return invalid_argument(fmt::format("missing tensor '{}' in the state dict for {}", e.name,
                                          model::arch_name(m.config().arch)));
    }
    std::vector<std::int64_t> want;
    for (int d = 0; d < e.shape.rank; ++d) want.push_back(e.shape[d]);
    const bool scalar = e.kind == StateKind::num_batches_tracked;
    const bool shape_ok = t->shape == want || (scalar && t->shape.empty());
    if (!shape_ok) {
      return invalid_argument(fmt::format("tensor '{}' has shape [{}], the model expects [{}]",
                                          e.name, fmt::join(t->shape, ", "),
                                          fmt::join(want, ", ")));
    }
    if (dtype_is_floating(t->dtype) == scalar) {
      return invalid_argument(fmt::format("tensor '{}' has dtype {}, expected {}", e.name,
                                          safetensors::dtype_code(t->dtype),
                                          scalar ? "an integer" : "a floating type"));
    }
    HostTensor v(TensorDesc::make(e.shape, t->dtype).value());
    if (t->data.size() != v.desc().bytes()) {
      return invalid_argument(fmt::format("tensor '{}' holds {} bytes, its shape needs {}", e.name,
                                          t->data.size(), v.desc().bytes()));
    }
    std::memcpy(v.data(), t->data.data(), v.desc().bytes());
    values.push_back(std::move(v));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    DLPROBE_RETURN_IF_ERROR(set_tensor(m.state()[i].name, values[i]));
  }
  return Status::ok();
}

Status TrainingStep::keep_logits() {
  StepState& s = *impl_;
  if (s.kept_logits != nullptr) return Status::ok();
  const auto loss_forward = std::find_if(s.calls.begin(), s.calls.end(), [](const Call& c) {
    return c.kind == CallKind::cross_entropy_forward;
  });
  if (loss_forward == s.calls.end() || s.logits == nullptr) {
    return error(Errc::internal, "keep_logits: the plan has no loss call");
  }
  DLPROBE_ASSIGN_OR_RETURN(Buffer * kept,
                           s.persistent(s.logits->view.desc, Category::temporaries, "logits"));
  DLPROBE_RETURN_IF_ERROR(s.backend.fill(kept->view, std::nan("")));
  // Right after the loss read them: the logits' buffer is still allocated there in every mode.
  Buffer* src = s.logits;
  s.calls.insert(loss_forward + 1,
                 Call{"loss.logits.keep", CallKind::cast, "loss",
                      [&be = s.backend, src, kept] { return be.cast(src->view, kept->view); }});
  s.kept_logits = kept;
  return Status::ok();
}

Result<HostTensor> TrainingStep::logits() const {
  if (impl_->kept_logits == nullptr) {
    return invalid_argument("logits: keep_logits() must come before the step");
  }
  return impl_->download(*impl_->kept_logits);
}

}  // namespace dlprobe::engine
