#include "dlprobe/data/device_staging.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <array>

#include "core/cuda_check.h"

namespace dlprobe::data {
namespace {

class CudaStaging final : public DeviceStaging {
 public:
  ~CudaStaging() override {
    // Each release runs only for what was made; errors at teardown have no one to go to.
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    for (void* d : device_) {
      if (d != nullptr) cudaFree(d);
    }
    if (host_ != nullptr) cudaFreeHost(host_);
  }

  Status open(int device, std::size_t bytes) {
    int count = 0;
    DLPROBE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count) {
      return invalid_argument(
          fmt::format("cuda:{}: this machine has {} CUDA device(s)", device, count));
    }
    if (bytes == 0) return invalid_argument("device staging: a buffer of 0 bytes");
    device_index_ = device;
    bytes_ = bytes;
    DLPROBE_CUDA_CHECK(cudaSetDevice(device));
    DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DLPROBE_CUDA_CHECK(cudaMallocHost(&host_, bytes));
    for (void*& d : device_) DLPROBE_CUDA_CHECK(cudaMalloc(&d, bytes));
    return Status::ok();
  }

  std::span<std::byte> host() override { return {static_cast<std::byte*>(host_), bytes_}; }

  Result<const void*> upload() override {
    // Any thread may call: the caller's current device need not be this one.
    DLPROBE_CUDA_CHECK(cudaSetDevice(device_index_));
    turn_ = (turn_ + 1) % device_.size();
    DLPROBE_CUDA_CHECK(
        cudaMemcpyAsync(device_[turn_], host_, bytes_, cudaMemcpyHostToDevice, stream_));
    DLPROBE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return static_cast<const void*>(device_[turn_]);
  }

 private:
  int device_index_ = 0;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  void* host_ = nullptr;
  std::array<void*, 2> device_{};
  std::size_t turn_ = 0;
};

}  // namespace

Result<std::unique_ptr<DeviceStaging>> DeviceStaging::open(int device, std::size_t bytes) {
  auto staging = std::make_unique<CudaStaging>();
  DLPROBE_RETURN_IF_ERROR(staging->open(device, bytes));
  return std::unique_ptr<DeviceStaging>(std::move(staging));
}

}  // namespace dlprobe::data
