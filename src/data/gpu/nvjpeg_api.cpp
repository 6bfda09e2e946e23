#include "data/gpu/nvjpeg_api.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <vector>

namespace dlprobe::data::nvjpeg {

const char* status_name(Status status) {
  static constexpr const char* kNames[] = {"NVJPEG_STATUS_SUCCESS",
                                           "NVJPEG_STATUS_NOT_INITIALIZED",
                                           "NVJPEG_STATUS_INVALID_PARAMETER",
                                           "NVJPEG_STATUS_BAD_JPEG",
                                           "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
                                           "NVJPEG_STATUS_ALLOCATOR_FAILURE",
                                           "NVJPEG_STATUS_EXECUTION_FAILED",
                                           "NVJPEG_STATUS_ARCH_MISMATCH",
                                           "NVJPEG_STATUS_INTERNAL_ERROR",
                                           "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
                                           "NVJPEG_STATUS_INCOMPLETE_BITSTREAM"};
  if (status >= 0 && status < static_cast<Status>(std::size(kNames))) return kNames[status];
  return "NVJPEG_STATUS_UNKNOWN";
}

namespace {

template <typename Fn>
bool resolve(void* library, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

}  // namespace

Result<std::shared_ptr<const Api>> load(const std::string& path) {
  std::vector<std::string> candidates;
  if (!path.empty()) {
    candidates.push_back(path);
  } else {
    for (const char* name : {"libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"}) {
      candidates.emplace_back(name);
    }
    for (const char* name :
         {"/usr/local/cuda/lib64/libnvjpeg.so.13", "/usr/local/cuda/lib64/libnvjpeg.so.12"}) {
      candidates.emplace_back(name);
    }
  }
  void* library = nullptr;
  std::string tried;
  for (const std::string& c : candidates) {
    library = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      tried = c;
      break;
    }
    tried += std::string(tried.empty() ? "" : "; ") + dlerror();
  }
  if (library == nullptr) {
    return error(Errc::unavailable,
                 fmt::format("nvJPEG is not available (the GPU decoder needs libnvjpeg from a CUDA "
                             "install): {}",
                             tried));
  }
  auto api = std::make_shared<Api>();
  api->library = library;
  api->path = tried;
  std::string missing;
  resolve(library, "nvjpegGetProperty", api->get_property, missing);
  resolve(library, "nvjpegCreateEx", api->create_ex, missing);
  resolve(library, "nvjpegDestroy", api->destroy, missing);
  resolve(library, "nvjpegSetDeviceMemoryPadding", api->set_device_padding, missing);
  resolve(library, "nvjpegSetPinnedMemoryPadding", api->set_pinned_padding, missing);
  resolve(library, "nvjpegJpegStateCreate", api->state_create, missing);
  resolve(library, "nvjpegJpegStateDestroy", api->state_destroy, missing);
  resolve(library, "nvjpegJpegStreamCreate", api->stream_create, missing);
  resolve(library, "nvjpegJpegStreamDestroy", api->stream_destroy, missing);
  resolve(library, "nvjpegJpegStreamParseHeader", api->stream_parse_header, missing);
  resolve(library, "nvjpegDecodeBatchedSupported", api->decode_batched_supported, missing);
  resolve(library, "nvjpegJpegStreamGetChromaSubsampling", api->stream_get_chroma_subsampling,
          missing);
  resolve(library, "nvjpegJpegStreamGetComponentDimensions", api->stream_get_component_dimensions,
          missing);
  resolve(library, "nvjpegDecodeBatchedInitialize", api->decode_batched_initialize, missing);
  resolve(library, "nvjpegDecodeBatched", api->decode_batched, missing);
  // Optional: the decoder reserves the hardware engine's memory ahead where the library can.
  api->decode_batched_pre_allocate = reinterpret_cast<decltype(api->decode_batched_pre_allocate)>(
      dlsym(library, "nvjpegDecodeBatchedPreAllocate"));
  if (!missing.empty()) {
    dlclose(library);
    return error(
        Errc::unavailable,
        fmt::format("{}: lacks {} (nvJPEG from CUDA 11 or later is needed)", tried, missing));
  }
  int major = 0;
  int minor = 0;
  int patch = 0;
  api->get_property(kMajorVersion, &major);
  api->get_property(kMinorVersion, &minor);
  api->get_property(kPatchLevel, &patch);
  api->version = fmt::format("{}.{}.{}", major, minor, patch);
  // Never closed: a handle made from it may live until the process ends.
  return std::shared_ptr<const Api>(std::move(api));
}

}  // namespace dlprobe::data::nvjpeg
