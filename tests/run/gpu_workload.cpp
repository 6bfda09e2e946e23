// For the GPU test of `dlprobe run`: a child process that takes GPU memory with the CUDA runtime
// (so NVML lists it), reports steps in the line protocol and exits.
//   gpu_workload MIB STEPS
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1024;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  void* p = nullptr;
  if (cudaMalloc(&p, mib << 20) != cudaSuccess) {
    std::fprintf(stderr, "RuntimeError: CUDA error: out of memory\n");
    return 1;
  }
  for (int i = 0; i < steps; ++i) {
    cudaMemset(p, i, mib << 20);
    cudaDeviceSynchronize();
    usleep(50000);
    std::printf("{\"dlprobe\": {\"step\": %d, \"step_time_s\": 0.05, \"batch\": 1}}\n", i);
    std::fflush(stdout);
  }
  cudaFree(p);
  return 0;
}
