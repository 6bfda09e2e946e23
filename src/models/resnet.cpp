#include <fmt/format.h>

#include <array>
#include <cmath>
#include <numbers>
#include <span>

#include "dlprobe/core/parallel.h"
#include "dlprobe/models/resnet.h"

namespace dlprobe::model {
namespace {

struct ArchSpec {
  Arch arch;
  std::string_view name;
  bool bottleneck;
  std::array<int, 4> blocks;
};
constexpr std::array<ArchSpec, 5> kArchs = {{
    {Arch::resnet18, "resnet18", false, {2, 2, 2, 2}},
    {Arch::resnet34, "resnet34", false, {3, 4, 6, 3}},
    {Arch::resnet50, "resnet50", true, {3, 4, 6, 3}},
    {Arch::resnet101, "resnet101", true, {3, 4, 23, 3}},
    {Arch::resnet152, "resnet152", true, {3, 8, 36, 3}},
}};

const ArchSpec& spec_of(Arch arch) {
  for (const auto& s : kArchs) {
    if (s.arch == arch) return s;
  }
  return kArchs[0];
}

// Appends layers and state entries in torchvision's module registration order.
class Builder {
 public:
  Builder(std::vector<Layer>& layers, std::vector<StateEntry>& state, int& values)
      : layers_(layers), state_(state), values_(values) {}

  ValueId conv(const std::string& name, ValueId x, std::int64_t in, std::int64_t out,
               std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
    Layer l;
    l.kind = LayerKind::conv;
    l.name = name;
    l.in_channels = in;
    l.out_channels = out;
    l.kernel = kernel;
    l.conv.stride = {stride, stride};
    l.conv.pad = {pad, pad};
    const ValueId y = push(std::move(l), {x});
    state_.push_back({name + ".weight", StateKind::conv_weight, Shape{out, in, kernel, kernel},
                      Init::kaiming_normal_fan_out, last(), 0});
    return y;
  }

  ValueId batch_norm(const std::string& name, ValueId x, std::int64_t channels, bool zero_gamma) {
    Layer l;
    l.kind = LayerKind::batch_norm;
    l.name = name;
    l.in_channels = channels;
    const ValueId y = push(std::move(l), {x});
    const Shape c{channels};
    state_.push_back({name + ".weight", StateKind::bn_weight, c,
                      zero_gamma ? Init::zeros : Init::ones, last(), 0});
    state_.push_back({name + ".bias", StateKind::bn_bias, c, Init::zeros, last(), 0});
    state_.push_back({name + ".running_mean", StateKind::running_mean, c, Init::zeros, last(), 0});
    state_.push_back({name + ".running_var", StateKind::running_var, c, Init::ones, last(), 0});
    state_.push_back({name + ".num_batches_tracked", StateKind::num_batches_tracked, Shape{1},
                      Init::zeros, last(), 0});
    return y;
  }

  ValueId simple(LayerKind kind, const std::string& name, std::vector<ValueId> inputs) {
    Layer l;
    l.kind = kind;
    l.name = name;
    return push(std::move(l), std::move(inputs));
  }

  ValueId linear(const std::string& name, ValueId x, std::int64_t in, std::int64_t out) {
    Layer l;
    l.kind = LayerKind::linear;
    l.name = name;
    l.in_channels = in;
    l.out_channels = out;
    const ValueId y = push(std::move(l), {x});
    state_.push_back(
        {name + ".weight", StateKind::fc_weight, Shape{out, in}, Init::linear_uniform, last(), in});
    state_.push_back(
        {name + ".bias", StateKind::fc_bias, Shape{out}, Init::linear_uniform, last(), in});
    return y;
  }

 private:
  ValueId push(Layer l, std::vector<ValueId> inputs) {
    l.inputs = std::move(inputs);
    l.output = values_++;
    layers_.push_back(std::move(l));
    return layers_.back().output;
  }
  int last() const { return static_cast<int>(layers_.size()) - 1; }

  std::vector<Layer>& layers_;
  std::vector<StateEntry>& state_;
  int& values_;
};

// torchvision's BasicBlock (expansion 1) or Bottleneck (expansion 4, stride on the 3x3 conv). The
// downsample branch is registered last in both, so its state entries follow the main branch's.
ValueId block(Builder& b, const std::string& p, ValueId x, std::int64_t in, std::int64_t planes,
              std::int64_t stride, bool bottleneck, bool zero_init_residual) {
  const std::int64_t expansion = bottleneck ? 4 : 1;
  const std::int64_t out = planes * expansion;
  ValueId y = 0;
  if (bottleneck) {
    y = b.conv(p + "conv1", x, in, planes, 1, 1, 0);
    y = b.batch_norm(p + "bn1", y, planes, false);
    y = b.simple(LayerKind::relu, p + "relu1", {y});
    y = b.conv(p + "conv2", y, planes, planes, 3, stride, 1);
    y = b.batch_norm(p + "bn2", y, planes, false);
    y = b.simple(LayerKind::relu, p + "relu2", {y});
    y = b.conv(p + "conv3", y, planes, out, 1, 1, 0);
    y = b.batch_norm(p + "bn3", y, out, zero_init_residual);
  } else {
    y = b.conv(p + "conv1", x, in, planes, 3, stride, 1);
    y = b.batch_norm(p + "bn1", y, planes, false);
    y = b.simple(LayerKind::relu, p + "relu1", {y});
    y = b.conv(p + "conv2", y, planes, planes, 3, 1, 1);
    y = b.batch_norm(p + "bn2", y, planes, zero_init_residual);
  }
  ValueId identity = x;
  if (stride != 1 || in != out) {
    identity = b.conv(p + "downsample.0", x, in, out, 1, stride, 0);
    identity = b.batch_norm(p + "downsample.1", identity, out, false);
  }
  y = b.simple(LayerKind::add, p + "add", {y, identity});
  return b.simple(LayerKind::relu, p + (bottleneck ? "relu3" : "relu2"), {y});
}

// splitmix64: tiny, fully specified and platform-independent; std::normal_distribution is not
// (its algorithm is left to the standard library), and the initial weights must be the same
// everywhere.
class Generator {
 public:
  // The generator after `draws` draws from `seed`: the state only ever grows by kGolden, so any
  // point of the sequence is reached at once, and a tensor's elements can be drawn by several
  // threads with the values one thread would give.
  static Generator at(std::uint64_t seed, std::uint64_t draws) {
    return Generator(seed + draws * kGolden);
  }
  std::uint64_t next() {
    std::uint64_t z = (state_ += kGolden);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  static constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  // Standard normal by Box-Muller: one value from two draws.
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  explicit Generator(std::uint64_t state) : state_(state) {}
  std::uint64_t state_;
};

// Fills `values` with f(generator) per element, each element taking `draws_each` draws of the
// sequence from `seed` after the first `first_draw`, in element order (the same values on any
// number of threads).
template <class F>
void draw(std::span<float> values, std::uint64_t seed, std::uint64_t first_draw,
          std::uint64_t draws_each, F f) {
  // Box-Muller's log and cos make a weight element cost tens of nanoseconds: ResNet-50's 25
  // million took about a second on one core.
  parallel_for(static_cast<std::int64_t>(values.size()), std::int64_t{1} << 16,
               [&](std::int64_t begin, std::int64_t end) {
                 Generator gen = Generator::at(
                     seed, first_draw + static_cast<std::uint64_t>(begin) * draws_each);
                 for (std::int64_t i = begin; i < end; ++i) {
                   values[static_cast<std::size_t>(i)] = static_cast<float>(f(gen));
                 }
               });
}

}  // namespace

Result<Arch> parse_arch(std::string_view text, std::string_view flag) {
  for (const auto& s : kArchs) {
    if (s.name == text) return s.arch;
  }
  return invalid_argument(
      fmt::format("{}: unknown model '{}' (expected one of {})", flag, text, arch_names()));
}

std::string arch_names() {
  std::string out;
  for (const auto& s : kArchs) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

std::string_view arch_name(Arch arch) {
  return spec_of(arch).name;
}

std::string_view layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::conv:
      return "conv";
    case LayerKind::batch_norm:
      return "batch_norm";
    case LayerKind::relu:
      return "relu";
    case LayerKind::max_pool:
      return "max_pool";
    case LayerKind::add:
      return "add";
    case LayerKind::global_avg_pool:
      return "global_avg_pool";
    case LayerKind::linear:
      return "linear";
  }
  return "?";
}

SavedForBackward saved_for_backward(LayerKind kind) {
  switch (kind) {
    case LayerKind::conv:
      return {true, false, false};
    case LayerKind::batch_norm:
      return {true, false, true};
    case LayerKind::relu:
      return {false, true, false};
    case LayerKind::max_pool:
      return {true, true, false};
    case LayerKind::linear:
      return {true, false, false};
    case LayerKind::add:
    case LayerKind::global_avg_pool:
      return {};
  }
  return {};
}

bool is_parameter(StateKind kind) {
  switch (kind) {
    case StateKind::conv_weight:
    case StateKind::bn_weight:
    case StateKind::bn_bias:
    case StateKind::fc_weight:
    case StateKind::fc_bias:
      return true;
    case StateKind::running_mean:
    case StateKind::running_var:
    case StateKind::num_batches_tracked:
      return false;
  }
  return false;
}

std::string model_name(const ModelConfig& config) {
  std::string out(arch_name(config.arch));
  if (config.width != 64) out += fmt::format("-w{}", config.width);
  return out;
}

Result<Model> Model::create(const ModelConfig& config) {
  if (config.image_size < 1) {
    return invalid_argument(fmt::format("image size must be >= 1, got {}", config.image_size));
  }
  if (config.classes < 1) {
    return invalid_argument(fmt::format("classes must be >= 1, got {}", config.classes));
  }
  if (config.width < 1 || config.width > 4096) {
    return invalid_argument(fmt::format("width must be in [1, 4096], got {}", config.width));
  }
  const ArchSpec& spec = spec_of(config.arch);
  Model m;
  m.config_ = config;
  Builder b(m.layers_, m.state_, m.value_count_);
  ValueId x = b.conv("conv1", kImages, 3, config.width, 7, 2, 3);
  x = b.batch_norm("bn1", x, config.width, false);
  x = b.simple(LayerKind::relu, "relu", {x});
  x = b.simple(LayerKind::max_pool, "maxpool", {x});
  std::int64_t in = config.width;
  const std::int64_t expansion = spec.bottleneck ? 4 : 1;
  for (std::size_t stage = 0; stage < 4; ++stage) {
    const std::int64_t planes = config.width << stage;
    for (int i = 0; i < spec.blocks[stage]; ++i) {
      const std::int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      x = block(b, fmt::format("layer{}.{}.", stage + 1, i), x, in, planes, stride, spec.bottleneck,
                config.zero_init_residual);
      in = planes * expansion;
    }
  }
  x = b.simple(LayerKind::global_avg_pool, "avgpool", {x});
  b.linear("fc", x, in, config.classes);
  // An image the stem cannot take fails here, not when a step is planned.
  DLPROBE_RETURN_IF_ERROR(m.value_shapes(1, false).status());
  return m;
}

int Model::find_state(std::string_view name) const {
  for (std::size_t i = 0; i < state_.size(); ++i) {
    if (state_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& e : state_) {
    if (is_parameter(e.kind)) n += e.shape.numel();
  }
  return n;
}

Result<std::vector<Shape>> Model::value_shapes(std::int64_t batch, bool training) const {
  if (batch < 1) return invalid_argument(fmt::format("batch must be >= 1, got {}", batch));
  std::vector<Shape> shapes(static_cast<std::size_t>(value_count_));
  shapes[kImages] = Shape{batch, 3, config_.image_size, config_.image_size};
  // Each value's size is checked as it is computed: one that overflows would wrap around to a
  // count the layers' own checks misread ("0 values per channel").
  if (Status s = check_element_count(shapes[kImages]); !s) {
    return s.with_context(
        fmt::format("{}x{} images with batch {}", config_.image_size, config_.image_size, batch));
  }
  for (const Layer& l : layers_) {
    const Shape& x = shapes[static_cast<std::size_t>(l.inputs[0])];
    Result<Shape> y = x;
    switch (l.kind) {
      case LayerKind::conv:
        y = conv2d_output_shape(x, Shape{l.out_channels, l.in_channels, l.kernel, l.kernel},
                                l.conv);
        break;
      case LayerKind::batch_norm: {
        const Status s = batch_norm_check(x, Shape{l.in_channels}, l.batch_norm, training);
        if (!s.is_ok()) y = s;
        break;
      }
      case LayerKind::relu:
        break;
      case LayerKind::max_pool:
        y = max_pool2d_output_shape(x, l.pool);
        break;
      case LayerKind::add: {
        const Status s = same_shape_check("add", x, shapes[static_cast<std::size_t>(l.inputs[1])]);
        if (!s.is_ok()) y = s;
        break;
      }
      case LayerKind::global_avg_pool:
        y = global_avg_pool_output_shape(x);
        break;
      case LayerKind::linear:
        y = linear_output_shape(x, Shape{l.out_channels, l.in_channels}, Shape{l.out_channels});
        break;
    }
    if (y.has_value()) {
      if (Status s = check_element_count(*y); !s) y = s;
    }
    if (!y.has_value()) {
      return y.status().with_context(fmt::format("{} cannot take {}x{} images with batch {} ({})",
                                                 arch_name(config_.arch), config_.image_size,
                                                 config_.image_size, batch, l.name));
    }
    shapes[static_cast<std::size_t>(l.output)] = *y;
  }
  return shapes;
}

std::vector<HostTensor> initial_state(const Model& model, std::uint64_t seed) {
  // Draws of the sequence from `seed` the entries so far took: each takes its own in turn.
  std::uint64_t draws = 0;
  std::vector<HostTensor> out;
  out.reserve(model.state().size());
  for (const StateEntry& e : model.state()) {
    const DType dtype = e.kind == StateKind::num_batches_tracked ? DType::int64 : DType::fp32;
    HostTensor t(TensorDesc::make(e.shape, dtype).value());
    const auto n = static_cast<std::uint64_t>(t.numel());
    switch (e.init) {
      case Init::kaiming_normal_fan_out: {
        // fan_out of a conv weight [K, C, R, S] is K*R*S; the ReLU gain is sqrt(2).
        const double fan_out = static_cast<double>(e.shape[0] * e.shape[2] * e.shape[3]);
        const double std = std::sqrt(2.0 / fan_out);
        draw(t.values<float>(), seed, draws, 2, [std](Generator& g) { return std * g.normal(); });
        draws += 2 * n;
        break;
      }
      case Init::linear_uniform: {
        // kaiming_uniform_(a=sqrt(5)) on the weight and the bias rule both give this bound.
        const double bound = 1.0 / std::sqrt(static_cast<double>(e.fan_in));
        draw(t.values<float>(), seed, draws, 1,
             [bound](Generator& g) { return bound * (2.0 * g.uniform() - 1.0); });
        draws += n;
        break;
      }
      case Init::ones:
        t.fill(1.0);
        break;
      case Init::zeros:
        t.fill(0.0);
        break;
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace dlprobe::model
