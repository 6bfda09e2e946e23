#include "step_files.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace dlprobe::cli {
namespace {

// A tensor of the input file as a HostTensor (row-major, so NCHW for rank 4).
Result<HostTensor> host_tensor(const safetensors::Tensor& t) {
  if (t.shape.empty() || t.shape.size() > 4) {
    return invalid_argument(fmt::format("rank {} is not supported", t.shape.size()));
  }
  Shape shape;
  shape.rank = static_cast<int>(t.shape.size());
  for (std::size_t i = 0; i < t.shape.size(); ++i) shape.dims[i] = t.shape[i];
  DLPROBE_ASSIGN_OR_RETURN(TensorDesc desc, TensorDesc::make(shape, t.dtype));
  HostTensor h(desc);
  if (t.data.size() != desc.bytes()) {
    return invalid_argument(
        fmt::format("holds {} bytes, its shape needs {}", t.data.size(), desc.bytes()));
  }
  std::memcpy(h.data(), t.data.data(), desc.bytes());
  return h;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::int64_t first_non_finite(const HostTensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.get(i))) return i;
  }
  return -1;
}

Result<StepInput> read_step_input(const std::string& path) {
  DLPROBE_ASSIGN_OR_RETURN(safetensors::File file, safetensors::read_file(path));
  const safetensors::Tensor* images = file.find("images");
  const safetensors::Tensor* labels = file.find("labels");
  if (images == nullptr || labels == nullptr) {
    return invalid_argument(
        fmt::format("{}: no tensor named '{}' (expected 'images' [N, 3, H, W] "
                    "and 'labels' [N])",
                    path, images == nullptr ? "images" : "labels"));
  }
  const std::vector<std::int64_t>& s = images->shape;
  if (s.size() != 4 || s[1] != 3 || s[2] != s[3] || !dtype_is_floating(images->dtype)) {
    return invalid_argument(fmt::format(
        "{}: 'images' is {} {}, expected a floating [N, 3, H, H] tensor (square RGB images)", path,
        safetensors::dtype_code(images->dtype), shape_text(s)));
  }
  if (labels->shape.size() != 1 || labels->shape[0] != s[0] || dtype_is_floating(labels->dtype)) {
    return invalid_argument(fmt::format("{}: 'labels' is {} {}, expected an integer [{}] tensor",
                                        path, safetensors::dtype_code(labels->dtype),
                                        shape_text(labels->shape), s[0]));
  }
  StepInput in;
  Result<HostTensor> im = host_tensor(*images);
  if (!im.has_value()) return im.status().with_context(fmt::format("{}: images", path));
  Result<HostTensor> lb = host_tensor(*labels);
  if (!lb.has_value()) return lb.status().with_context(fmt::format("{}: labels", path));
  in.images = std::move(im).value();
  in.labels = std::move(lb).value();
  // A NaN or an infinity in the batch would run to a NaN loss and gradients, written as if they
  // were the step's answer: the file is refused instead, naming the first such value.
  if (const std::int64_t i = first_non_finite(in.images); i >= 0) {
    const std::int64_t per_image = s[1] * s[2] * s[3];
    return invalid_argument(
        fmt::format("{}: 'images' holds {} at value {} of image {}, not a finite number", path,
                    in.images.get(i), i % per_image, i / per_image));
  }
  return in;
}

// `fc.weight` [classes, features] says how many classes the model has, `conv1.weight` [width, 3,
// 7, 7] how wide it is.
Result<model::ModelConfig> model_of_weights(const safetensors::File& weights,
                                            const std::string& path) {
  const safetensors::Tensor* fc = weights.find("fc.weight");
  const safetensors::Tensor* stem = weights.find("conv1.weight");
  const bool fc_ok = fc != nullptr && fc->shape.size() == 2 && fc->shape[0] >= 1;
  const bool stem_ok = stem != nullptr && stem->shape.size() == 4 && stem->shape[0] >= 1;
  if (!fc_ok || !stem_ok) {
    // Named one at a time: the message says which of the two the file lacks or holds wrongly.
    return invalid_argument(fmt::format(
        "{}: {}, so not a torchvision ResNet state dict", path,
        !fc_ok && !stem_ok ? "no 'fc.weight' [classes, features] and 'conv1.weight' [width, 3, 7, "
                             "7] tensors"
        : !fc_ok           ? "no 'fc.weight' [classes, features] tensor"
                           : "no 'conv1.weight' [width, 3, 7, 7] tensor"));
  }
  model::ModelConfig m;
  m.classes = fc->shape[0];
  m.width = stem->shape[0];
  return m;
}

safetensors::Tensor scalar_tensor(std::string name, double value) {
  safetensors::Tensor t;
  t.name = std::move(name);
  t.dtype = DType::fp64;
  t.data.resize(sizeof value);
  std::memcpy(t.data.data(), &value, sizeof value);
  return t;
}

// Contiguous in logical order (NCHW for rank 4), as PyTorch's tensors of the same name are.
safetensors::Tensor to_file_tensor(std::string name, const HostTensor& value) {
  const HostTensor contiguous =
      value.layout() == Layout::nchw ? value : value.to_layout(Layout::nchw);
  safetensors::Tensor t;
  t.name = std::move(name);
  t.dtype = contiguous.dtype();
  for (int d = 0; d < contiguous.shape().rank; ++d) t.shape.push_back(contiguous.shape()[d]);
  const auto* bytes = static_cast<const std::byte*>(contiguous.data());
  t.data.assign(bytes, bytes + contiguous.desc().bytes());
  return t;
}

}  // namespace dlprobe::cli
