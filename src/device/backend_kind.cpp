#include "dlprobe/device/backend_kind.h"

#include <fmt/format.h>

#include <optional>

#include "dlprobe/core/build_info.h"
#include "dlprobe/core/named.h"

namespace dlprobe::device {

namespace {

constexpr Named<BackendKind> kBackendKinds[] = {{BackendKind::cuda, "cuda"},
                                                {BackendKind::onednn, "onednn"},
                                                {BackendKind::reference, "reference"}};

}  // namespace

std::string_view backend_kind_name(BackendKind kind) {
  return name_of(kBackendKinds, kind, "reference");
}

bool backend_built(BackendKind kind) {
  switch (kind) {
    case BackendKind::cuda:
      return build_info().with_cuda;
    case BackendKind::onednn:
      return build_info().with_onednn;
    case BackendKind::reference:
      return true;
  }
  return false;
}

BackendKind default_backend(const Device& device) {
  if (device.kind == DeviceKind::cuda) return BackendKind::cuda;
  return backend_built(BackendKind::onednn) ? BackendKind::onednn : BackendKind::reference;
}

Status backend_runs_on(BackendKind kind, const Device& device) {
  if ((device.kind == DeviceKind::cuda) == (kind == BackendKind::cuda)) return Status::ok();
  return invalid_argument(
      fmt::format("backend {} does not run on {} (cuda runs on cuda:N, onednn and reference on "
                  "cpu)",
                  backend_kind_name(kind), device_name(device)));
}

Result<BackendKind> parse_backend(std::string_view text, const Device& device) {
  const std::optional<BackendKind> named = value_named(kBackendKinds, text);
  if (!named && text != "auto") {
    return invalid_argument(
        fmt::format("unknown backend '{}' (expected auto, cuda, onednn or reference)", text));
  }
  const BackendKind kind = named.value_or(default_backend(device));
  DLPROBE_RETURN_IF_ERROR(backend_runs_on(kind, device));
  if (!backend_built(kind)) {
    return error(
        Errc::unavailable,
        fmt::format("{}: this build has no {} backend (configured without {})", device_name(device),
                    backend_kind_name(kind),
                    kind == BackendKind::cuda ? "DLPROBE_WITH_CUDA" : "DLPROBE_WITH_ONEDNN"));
  }
  return kind;
}

Status backend_supports(BackendKind kind, engine::Precision precision) {
  using engine::Precision;
  if (precision == Precision::fp64 && kind != BackendKind::reference) {
    return error(Errc::unsupported, "precision fp64 runs on the reference backend (cpu) only");
  }
  if (precision == Precision::tf32 && kind != BackendKind::cuda) {
    // The CPU backends have no TF32 units and would run strict fp32 under tf32's name.
    return error(
        Errc::unsupported,
        "precision tf32 is a GPU tensor-core mode; on the CPU it would be fp32 (use fp32)");
  }
  if (precision == Precision::fp16 && kind == BackendKind::onednn) {
    return error(Errc::unsupported,
                 "precision fp16 is not on the oneDNN CPU backend (bf16 is, on AVX-512 CPUs); "
                 "the reference backend runs fp16 on the CPU");
  }
  return Status::ok();
}

}  // namespace dlprobe::device
