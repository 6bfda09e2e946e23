// The files of `dlprobe step`: the batch and the state dict it reads, the tensors it writes.
#pragma once

#include <string>

#include "dlprobe/core/status.h"
#include "dlprobe/engine/safetensors.h"
#include "dlprobe/engine/tensor.h"
#include "dlprobe/models/resnet.h"

namespace dlprobe::cli {

// The batch of an input file: `images` [N, 3, H, H] floating and `labels` [N] integer.
struct StepInput {
  HostTensor images;
  HostTensor labels;
};
Result<StepInput> read_step_input(const std::string& path);

// The classes and width of the torchvision ResNet whose state dict `weights` is (read from `path`).
Result<model::ModelConfig> model_of_weights(const safetensors::File& weights,
                                            const std::string& path);

// The storage index of the first NaN or infinity in `t`, or -1.
std::int64_t first_non_finite(const HostTensor& t);

// An fp64 scalar tensor, as the output's `loss` and `loss_scale`.
safetensors::Tensor scalar_tensor(std::string name, double value);

// A tensor as the output file holds it: contiguous in logical order (NCHW for rank 4), as
// PyTorch's tensors of the same name are.
safetensors::Tensor to_file_tensor(std::string name, const HostTensor& value);

}  // namespace dlprobe::cli
