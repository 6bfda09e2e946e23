#include "dlprobe/device/device.h"

#include <fmt/format.h>

#include "dlprobe/core/units.h"

namespace dlprobe::device {

Result<Device> parse_device(std::string_view text) {
  if (text == "cpu") return Device{DeviceKind::cpu, 0};
  if (const auto index = parse_cuda_index(text)) return Device{DeviceKind::cuda, *index};
  return invalid_argument(fmt::format("unknown device '{}' (expected cpu, cuda or cuda:N)", text));
}

std::string device_name(const Device& device) {
  return device.kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{}", device.index);
}

}  // namespace dlprobe::device
