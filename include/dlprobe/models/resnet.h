// The models the training engine runs: torchvision's ResNet v1.5 family (resnet18 ... resnet152) as
// a flat graph of layers in forward order, with torchvision's parameter and buffer names so that a
// PyTorch state_dict maps onto it one to one.
//
// Architecture, as torchvision.models.resnet builds it:
//   stem: conv1 7x7/2 pad 3 -> bn1 -> relu -> maxpool 3x3/2 pad 1
//   layer1..layer4 of BasicBlocks (18, 34) or Bottlenecks (50, 101, 152); the first block of
//   layer2..4 strides by 2 (a Bottleneck on its 3x3 conv: "v1.5"), and a block whose input and
//   output differ in shape adds a projection shortcut conv1x1 + BN named downsample.0 / .1
//   avgpool (adaptive, to 1x1) -> flatten -> fc
// Every conv is bias-free; the add of the residual comes before the block's last ReLU.
//
// The graph says what each layer computes and keeps for its backward pass; the step planner
// (dlprobe/step.h) turns it into backend calls and buffers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/ops.h"
#include "dlprobe/engine/tensor.h"

namespace dlprobe::model {

enum class Arch : std::uint8_t { resnet18, resnet34, resnet50, resnet101, resnet152 };
// "resnet18", ..., "resnet152"; anything else is a one-line error naming `flag`.
Result<Arch> parse_arch(std::string_view text, std::string_view flag = "model");
// "resnet18, resnet34, ...": the models parse_arch takes, for help texts and errors.
std::string arch_names();
std::string_view arch_name(Arch arch);

struct ModelConfig {
  Arch arch = Arch::resnet50;
  std::int64_t image_size = 224;  // square RGB images
  std::int64_t classes = 1000;
  // torchvision's option: the last BN of each residual branch starts with weight 0.
  bool zero_init_residual = false;
  // Channels of the stem and layer1; each later stage doubles them (torchvision's ResNets: 64).
  // A narrower model is the same graph with a fraction of the work (width 16: about 1/16), for
  // quick checks on a CPU.
  std::int64_t width = 64;
};
// The architecture's name, with the width where it is not torchvision's: "resnet50",
// "resnet18-w16". Two models of one name have the same layers and shapes at any image size.
std::string model_name(const ModelConfig& config);

enum class LayerKind : std::uint8_t {
  conv,
  batch_norm,
  relu,
  max_pool,
  add,              // the residual connection
  global_avg_pool,  // AdaptiveAvgPool2d((1, 1)) followed by flatten
  linear,
};
std::string_view layer_kind_name(LayerKind kind);

// What a layer keeps from its forward pass for its backward pass, as PyTorch's autograd saves it:
// conv and linear their input (for the weight gradient), batch norm its input (plus the batch
// mean and inverse std it computes), ReLU its output, max pooling input and output. add and
// global average pooling need only shapes.
struct SavedForBackward {
  bool input = false;
  bool output = false;
  bool batch_statistics = false;
};
SavedForBackward saved_for_backward(LayerKind kind);

// A value is one activation tensor of the forward pass; value 0 is the input images.
using ValueId = int;
inline constexpr ValueId kImages = 0;

struct Layer {
  LayerKind kind = LayerKind::conv;
  // Unique: the torchvision module path ("layer2.0.downsample.0", "fc"), except for ReLU and add,
  // which torchvision does not name per use: "layer1.0.relu1" is the first use of the block's
  // shared `relu` module, "layer1.0.add" the residual sum, "relu" the stem's.
  std::string name;
  std::vector<ValueId> inputs;  // two for add, one otherwise
  ValueId output = 0;
  Conv2dParams conv;              // conv
  std::int64_t in_channels = 0;   // conv, batch_norm (channels), linear (features)
  std::int64_t out_channels = 0;  // conv, linear
  std::int64_t kernel = 0;        // conv: square kernel size
  BatchNormParams batch_norm;     // batch_norm
  MaxPool2dParams pool;           // max_pool
};

// Where a state-dict entry sits in a layer.
enum class StateKind : std::uint8_t {
  conv_weight,          // [K, C, R, S]
  bn_weight,            // gamma [C]
  bn_bias,              // beta [C]
  running_mean,         // buffer [C]
  running_var,          // buffer [C]
  num_batches_tracked,  // int64 scalar buffer
  fc_weight,            // [OUT, IN]
  fc_bias,              // [OUT]
};
bool is_parameter(StateKind kind);  // trainable (in model.parameters())

// How a state entry starts, following torchvision's ResNet.__init__ and nn.Linear's defaults.
enum class Init : std::uint8_t {
  kaiming_normal_fan_out,  // N(0, 2 / (K*R*S)): kaiming_normal_(mode="fan_out", relu)
  linear_uniform,          // U(-1/sqrt(IN), 1/sqrt(IN)) for nn.Linear's weight and bias
  ones,
  zeros,
};

struct StateEntry {
  std::string name;  // torchvision's state_dict key
  StateKind kind = StateKind::conv_weight;
  // Logical shape; num_batches_tracked (a 0-dimensional tensor in PyTorch) is Shape{1} here.
  Shape shape;
  Init init = Init::zeros;
  int layer = 0;            // index into Model::layers()
  std::int64_t fan_in = 0;  // linear_uniform's IN
};

class Model {
 public:
  // Builds the graph and checks that an image of config.image_size passes through it.
  static Result<Model> create(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<Layer>& layers() const { return layers_; }
  // torchvision's state_dict order (module registration order).
  const std::vector<StateEntry>& state() const { return state_; }
  // Index into state(), or -1.
  int find_state(std::string_view name) const;
  int value_count() const { return value_count_; }
  ValueId logits() const { return layers_.back().output; }
  // Number of trainable elements, as sum(p.numel() for p in model.parameters()).
  std::int64_t parameter_count() const;

  // Logical shape of every value for a batch of `batch` images, from the shape checks of
  // dlprobe/ops.h; `training` adds batch norm's need for more than one value per channel.
  Result<std::vector<Shape>> value_shapes(std::int64_t batch, bool training) const;

 private:
  ModelConfig config_;
  std::vector<Layer> layers_;
  std::vector<StateEntry> state_;
  int value_count_ = 1;
};

// The initial value of every state entry (in state() order, logical NCHW, fp32; int64 for
// num_batches_tracked), drawn from a generator seeded with `seed`: the same on every platform.
// The distributions are torchvision's; the values are not PyTorch's (its generator is another),
// so comparisons with PyTorch exchange weights through safetensors.
std::vector<HostTensor> initial_state(const Model& model, std::uint64_t seed);

}  // namespace dlprobe::model
