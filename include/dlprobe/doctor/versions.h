// The software stack doctor reports: driver, CUDA runtime and the NVIDIA libraries, each probed
// with dlopen so a missing library is reported as "not found" instead of stopping dlprobe from
// starting, and the compatibility verdicts between them (pure functions over the probed values).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/severity.h"

namespace dlprobe::doctor {

// Something doctor found, with what to do about it.
struct Finding {
  Severity severity = Severity::info;
  std::string id;  // stable identifier, e.g. "runtime_newer_than_driver"
  std::string message;
  std::string fix;  // empty when there is nothing to do
};

struct Version {
  int major = 0;
  int minor = 0;
  int patch = 0;
  std::string str() const;  // "13.0", "9.19.0" (the patch is left out when the scheme has none)
  bool has_patch = true;
  friend bool operator==(const Version& a, const Version& b) {
    return a.major == b.major && a.minor == b.minor && a.patch == b.patch;
  }
};

// CUDA's encoding, 1000 * major + 10 * minor (13000 -> 13.0, 12040 -> 12.4).
Version decode_cuda_version(std::int64_t v);
// cuDNN's encoding: 1000 * major + 100 * minor + patch up to 8.x (8907 -> 8.9.7), then
// 10000 * major + 100 * minor + patch from 9.0 (91900 -> 9.19.0).
Version decode_cudnn_version(std::int64_t v);
// 10000 * major + 100 * minor + patch: cuBLAS, cuBLASLt, NCCL from 2.9, CUPTI from CUDA 13.
Version decode_mmp_version(std::int64_t v);

// One library as loaded (or not) into this process.
struct LibraryProbe {
  std::string name;     // "cuDNN"
  bool loaded = false;  // the library opened and its version call answered
  std::string path;     // the file that was loaded, symlinks resolved
  std::string version;  // "9.19.0"
  std::int64_t raw_version = 0;
  std::string built_with;  // the version dlprobe was compiled against; empty when not linked
  std::string detail;      // why it is not loaded, or the sonames tried
};

// Opens the first of `sonames` that loads, calls `symbol` (an `integer f(void)` or `status f(int*)`
// per `kind`) and resolves the file it came from. The library stays loaded for the process: closing
// libraries such as cuBLAS or NCCL runs their destructors against state other code may still hold.
enum class VersionCall {
  returns_size_t,              // size_t f(void): cudnnGetVersion, cublasLtGetVersion
  out_int,                     // status f(int*), 0 = success: ncclGetVersion
  out_uint32,                  // status f(uint32_t*), 0 = success: cuptiGetVersion
  property_major_minor_patch,  // status f(type, int*), types 0/1/2: cublasGetProperty
};
LibraryProbe probe_library(std::string name, const std::vector<std::string>& sonames,
                           const char* symbol, VersionCall kind);

struct StackVersions {
  std::optional<std::string> driver;  // "580.65.06"
  std::string driver_source;          // "NVML", "/proc/driver/nvidia/version"
  // cudaDriverGetVersion (or NVML's): the newest CUDA the driver supports; 0 = no driver;
  // nullopt when it could not be asked (built without CUDA and no NVML).
  std::optional<int> cuda_driver_api;
  int cuda_runtime_built = 0;   // CUDART_VERSION; 0 without CUDA
  int cuda_runtime_loaded = 0;  // cudaRuntimeGetVersion (the static runtime linked in)
  LibraryProbe cudnn;
  std::optional<std::int64_t> cudnn_cudart_version;  // cudnnGetCudartVersion of the loaded cuDNN
  LibraryProbe cublas;
  LibraryProbe cublaslt;
  LibraryProbe nccl;
  LibraryProbe cupti;
  LibraryProbe onednn;
};

// Probes everything above on this machine.
StackVersions probe_versions();

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." -> "580.65.06".
std::optional<std::string> parse_proc_driver_version(std::string_view text);

// The minimum Linux driver a CUDA major needs (the CUDA release notes' "minor version
// compatibility" table), e.g. "580" for 13; nullopt for majors it does not know.
std::optional<std::string_view> minimum_driver_for_cuda_major(int major);

// Verdicts on how the probed pieces fit together, each with its fix.
std::vector<Finding> compatibility_findings(const StackVersions& v);

}  // namespace dlprobe::doctor
