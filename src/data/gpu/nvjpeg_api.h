// The few nvJPEG types and entry points the GPU decoder uses, declared here and loaded at run time
// (dlopen): nvJPEG comes with a CUDA install on a GPU machine but its header and library are not
// on every build machine, and a dlprobe built without them must still run where they are.
// Values as nvjpeg.h defines them (CUDA 11 to 13: the ABI of these has not changed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "dlprobe/core/check.h"
#include "dlprobe/core/status.h"

namespace dlprobe::data::nvjpeg {

struct Handle;
struct State;
struct Stream;
using HandleRef = Handle*;
using StateRef = State*;
using StreamRef = Stream*;

using Status = int;
inline constexpr Status kSuccess = 0;
inline constexpr int kMaxComponent = 4;

enum Backend : int {
  kBackendDefault = 0,
  kBackendHybrid = 1,
  kBackendGpuHybrid = 2,
  kBackendHardware = 3
};
enum OutputFormat : int { kOutputYuv = 1, kOutputRgbInterleaved = 5 };
enum ChromaSubsampling : int { kCss444 = 0, kCss422 = 1, kCss420 = 2, kCss440 = 3 };
enum Property : int { kMajorVersion = 0, kMinorVersion = 1, kPatchLevel = 2 };

// nvjpegDevAllocator_t and nvjpegPinnedAllocator_t: how nvJPEG takes device and pinned memory.
struct DeviceAllocator {
  int (*malloc)(void** p, std::size_t bytes);
  int (*free)(void* p);
};
struct PinnedAllocator {
  int (*malloc)(void** p, std::size_t bytes, unsigned flags);
  int (*free)(void* p);
};

struct Image {
  unsigned char* channel[kMaxComponent];
  std::size_t pitch[kMaxComponent];
};

// The entry points, resolved from one loaded library.
struct Api {
  Status (*get_property)(Property, int*);
  Status (*create_ex)(Backend, DeviceAllocator*, PinnedAllocator*, unsigned flags, HandleRef*);
  Status (*set_device_padding)(std::size_t padding, HandleRef);
  Status (*set_pinned_padding)(std::size_t padding, HandleRef);
  Status (*destroy)(HandleRef);
  Status (*state_create)(HandleRef, StateRef*);
  Status (*state_destroy)(StateRef);
  Status (*stream_create)(HandleRef, StreamRef*);
  Status (*stream_destroy)(StreamRef);
  Status (*stream_parse_header)(HandleRef, const unsigned char*, std::size_t, StreamRef);
  Status (*decode_batched_supported)(HandleRef, StreamRef, int* is_supported);
  Status (*stream_get_chroma_subsampling)(StreamRef, ChromaSubsampling*);
  Status (*stream_get_component_dimensions)(StreamRef, unsigned component, unsigned* width,
                                            unsigned* height);
  Status (*decode_batched_initialize)(HandleRef, StateRef, int batch_size, int max_cpu_threads,
                                      OutputFormat);
  Status (*decode_batched)(HandleRef, StateRef, const unsigned char* const* data,
                           const std::size_t* lengths, Image* destinations, cudaStream_t);
  // Null where the library lacks it.
  Status (*decode_batched_pre_allocate)(HandleRef, StateRef, int batch_size, int width, int height,
                                        ChromaSubsampling, OutputFormat);
  std::string path;     // the library loaded
  std::string version;  // "13.0.1"
  void* library = nullptr;
};

// nvJPEG's status codes in words.
const char* status_name(Status status);

// Loads `path` (empty: libnvjpeg.so.13, .so.12, .so on the library path, then CUDA's usual
// folder). An error names what was tried; the Api stays loaded for the life of the process.
Result<std::shared_ptr<const Api>> load(const std::string& path);

}  // namespace dlprobe::data::nvjpeg

// DLPROBE_NVJPEG_CHECK(call): a failed nvJPEG call becomes a Status naming the call, nvJPEG's
// status and file:line.
#define DLPROBE_NVJPEG_CHECK(call)                                            \
  DLPROBE_API_CHECK("nvJPEG", call, rc_ == ::dlprobe::data::nvjpeg::kSuccess, \
                    ::dlprobe::data::nvjpeg::status_name(rc_))
