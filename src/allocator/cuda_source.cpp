// The CUDA memory source; compiled only with DLPROBE_WITH_CUDA.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <memory>
#include <string>

#include "core/cuda_check.h"
#include "dlprobe/allocator/memory_source.h"
#include "dlprobe/core/units.h"

namespace dlprobe::memory {

namespace {

// Makes `device` current for one call and puts the caller's device back, so that the source works
// whatever device the calling thread had selected and leaves that choice alone.
class DeviceScope {
 public:
  static Result<DeviceScope> enter(int device) {
    int previous = 0;
    DLPROBE_CUDA_CHECK(cudaGetDevice(&previous));
    if (previous != device) DLPROBE_CUDA_CHECK(cudaSetDevice(device));
    return DeviceScope(previous, device);
  }
  DeviceScope(DeviceScope&& other) noexcept : previous_(other.previous_), device_(other.device_) {
    other.device_ = other.previous_;
  }
  DeviceScope& operator=(DeviceScope&&) = delete;
  ~DeviceScope() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }

 private:
  DeviceScope(int previous, int device) : previous_(previous), device_(device) {}
  int previous_;
  int device_;
};

class CudaMemorySource final : public MemorySource {
 public:
  explicit CudaMemorySource(int device) : device_(device), name_(fmt::format("cuda:{}", device)) {}

  std::string_view name() const override { return name_; }

  Result<void*> allocate(std::size_t bytes) override {
    DLPROBE_ASSIGN_OR_RETURN(DeviceScope scope, DeviceScope::enter(device_));
    void* ptr = nullptr;
    const cudaError_t rc = cudaMalloc(&ptr, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      // cudaMalloc's out-of-memory is not sticky; clear it so the next runtime call does not
      // report it again.
      (void)cudaGetLastError();
      return error(Errc::out_of_memory, fmt::format("{}: cudaMalloc of {} failed: out of memory",
                                                    name_, format_size(bytes)));
    }
    DLPROBE_CUDA_CHECK(rc);
    return ptr;
  }

  Status free(void* ptr, std::size_t /*bytes*/) override {
    DLPROBE_ASSIGN_OR_RETURN(DeviceScope scope, DeviceScope::enter(device_));
    DLPROBE_CUDA_CHECK(cudaFree(ptr));
    return Status::ok();
  }

  std::optional<DeviceMemoryInfo> memory_info() const override {
    auto scope = DeviceScope::enter(device_);
    if (!scope) return std::nullopt;
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    return DeviceMemoryInfo{free_bytes, total_bytes};
  }

 private:
  int device_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<MemorySource>> make_cuda_memory_source(int device) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    return error(Errc::unavailable,
                 fmt::format("no usable CUDA device: {}", cudaGetErrorString(rc)));
  }
  DLPROBE_CUDA_CHECK(rc);
  if (device < 0 || device >= count) {
    return error(Errc::not_found,
                 fmt::format("CUDA device {} does not exist ({} visible)", device, count));
  }
  return std::unique_ptr<MemorySource>(std::make_unique<CudaMemorySource>(device));
}

}  // namespace dlprobe::memory
