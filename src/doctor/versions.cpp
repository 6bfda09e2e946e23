#include "dlprobe/doctor/versions.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "dlprobe/core/build_info.h"

#if DLPROBE_WITH_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#endif
#if DLPROBE_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace dlprobe::doctor {

std::string Version::str() const {
  if (has_patch) return fmt::format("{}.{}.{}", major, minor, patch);
  return fmt::format("{}.{}", major, minor);
}

Version decode_cuda_version(std::int64_t v) {
  return {static_cast<int>(v / 1000), static_cast<int>((v % 1000) / 10), 0, false};
}

Version decode_cudnn_version(std::int64_t v) {
  if (v >= 90000) return decode_mmp_version(v);
  return {static_cast<int>(v / 1000), static_cast<int>((v % 1000) / 100), static_cast<int>(v % 100),
          true};
}

Version decode_mmp_version(std::int64_t v) {
  return {static_cast<int>(v / 10000), static_cast<int>((v % 10000) / 100),
          static_cast<int>(v % 100), true};
}

namespace {

std::string resolved_path(const void* symbol_address) {
  Dl_info info{};
  if (dladdr(symbol_address, &info) == 0 || info.dli_fname == nullptr) return {};
  char buffer[PATH_MAX];
  if (realpath(info.dli_fname, buffer) != nullptr) return buffer;
  return info.dli_fname;
}

std::string version_text(std::string_view name, std::int64_t raw) {
  if (name == "cuDNN") return decode_cudnn_version(raw).str();
  // CUPTI numbered its API plainly (18, 22, ...) before adopting major/minor/patch in CUDA 13.
  if (name == "CUPTI" && raw < 10000) return fmt::format("API {}", raw);
  return decode_mmp_version(raw).str();
}

}  // namespace

LibraryProbe probe_library(std::string name, const std::vector<std::string>& sonames,
                           const char* symbol, VersionCall kind) {
  LibraryProbe probe;
  probe.name = std::move(name);
  std::string tried;
  for (const auto& soname : sonames) {
    void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", soname, why ? why : "not found");
      continue;
    }
    void* fn = dlsym(handle, symbol);
    if (fn == nullptr) {
      probe.detail = fmt::format("{} loaded but has no {}", soname, symbol);
      probe.path = resolved_path(handle);
      return probe;
    }
    probe.path = resolved_path(fn);
    bool ok = false;
    std::int64_t raw = 0;
    switch (kind) {
      case VersionCall::returns_size_t:
        raw = static_cast<std::int64_t>(reinterpret_cast<std::size_t (*)()>(fn)());
        ok = true;
        break;
      case VersionCall::out_int: {
        int value = 0;
        ok = reinterpret_cast<int (*)(int*)>(fn)(&value) == 0;
        raw = value;
        break;
      }
      case VersionCall::out_uint32: {
        std::uint32_t value = 0;
        ok = reinterpret_cast<int (*)(std::uint32_t*)>(fn)(&value) == 0;
        raw = value;
        break;
      }
      case VersionCall::property_major_minor_patch: {
        // libraryPropertyType is a C enum (int-sized): MAJOR_VERSION = 0, MINOR_VERSION = 1,
        // PATCH_LEVEL = 2; passing int keeps this file free of CUDA headers.
        auto get = reinterpret_cast<int (*)(int, int*)>(fn);
        int major = 0, minor = 0, patch = 0;
        ok = get(0, &major) == 0 && get(1, &minor) == 0 && get(2, &patch) == 0;
        raw = major * 10000 + minor * 100 + patch;
        break;
      }
    }
    if (!ok) {
      probe.detail = fmt::format("{} loaded but {} failed", soname, symbol);
      return probe;
    }
    probe.loaded = true;
    probe.raw_version = raw;
    probe.version = version_text(probe.name, raw);
    return probe;
  }
  probe.detail = tried.empty() ? "no library names to try" : "not found (" + tried + ")";
  return probe;
}

namespace {

// The sonames for `base` ("libcublas.so"), the CUDA major dlprobe was built for first, so that a
// library for another CUDA major is only picked (and then reported as a mismatch) when the right
// one is absent.
std::vector<std::string> cuda_sonames(const std::string& base, int built_major) {
  std::vector<std::string> names;
  if (built_major > 0) names.push_back(fmt::format("{}.{}", base, built_major));
  for (int major : {13, 12, 11}) {
    if (major != built_major) names.push_back(fmt::format("{}.{}", base, major));
  }
  return names;
}

}  // namespace

StackVersions probe_versions() {
  StackVersions v;
  const auto& build = build_info();
#if DLPROBE_WITH_CUDA
  int driver = 0;
  // With no driver at all, the static runtime answers 0 with success; an error means it could not
  // even tell, which doctor reports the same way.
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  v.cuda_driver_api = driver;
  v.cuda_runtime_built = CUDART_VERSION;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) v.cuda_runtime_loaded = runtime;
#endif
  const int cuda_major = v.cuda_runtime_built / 1000;

  std::vector<std::string> cudnn_names;
  const int cudnn_built_major = decode_cudnn_version(build.cudnn_version).major;
  if (build.cudnn_version > 0)
    cudnn_names.push_back(fmt::format("libcudnn.so.{}", cudnn_built_major));
  for (int major : {9, 8}) {
    if (build.cudnn_version == 0 || major != cudnn_built_major)
      cudnn_names.push_back(fmt::format("libcudnn.so.{}", major));
  }
  v.cudnn = probe_library("cuDNN", cudnn_names, "cudnnGetVersion", VersionCall::returns_size_t);
  if (build.cudnn_version > 0) v.cudnn.built_with = decode_cudnn_version(build.cudnn_version).str();
  if (v.cudnn.loaded) {
    void* handle = dlopen(v.cudnn.path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle != nullptr) {
      if (void* fn = dlsym(handle, "cudnnGetCudartVersion"))
        v.cudnn_cudart_version =
            static_cast<std::int64_t>(reinterpret_cast<std::size_t (*)()>(fn)());
    }
  }

  v.cublas = probe_library("cuBLAS", cuda_sonames("libcublas.so", cuda_major), "cublasGetProperty",
                           VersionCall::property_major_minor_patch);
  v.cublaslt = probe_library("cuBLASLt", cuda_sonames("libcublasLt.so", cuda_major),
                             "cublasLtGetVersion", VersionCall::returns_size_t);
#if DLPROBE_WITH_CUDA
  // cuBLASLt ships in the cuBLAS package under cuBLAS's version number; the GEMM ceilings link it,
  // so the one probed here is the one they use.
  v.cublaslt.built_with = decode_mmp_version(CUBLAS_VERSION).str();
#endif
  v.nccl = probe_library("NCCL", {"libnccl.so.2"}, "ncclGetVersion", VersionCall::out_int);
  auto cupti_names = cuda_sonames("libcupti.so", cuda_major);
  cupti_names.push_back("libcupti.so");
  v.cupti = probe_library("CUPTI", cupti_names, "cuptiGetVersion", VersionCall::out_uint32);

  v.onednn.name = "oneDNN";
#if DLPROBE_WITH_ONEDNN
  const dnnl_version_t* dnnl = dnnl_version();
  v.onednn.loaded = true;
  v.onednn.version = fmt::format("{}.{}.{}", dnnl->major, dnnl->minor, dnnl->patch);
  v.onednn.built_with =
      fmt::format("{}.{}.{}", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH);
  v.onednn.path = resolved_path(reinterpret_cast<const void*>(&dnnl_version));
#else
  v.onednn.detail = "dlprobe was built without oneDNN (DLPROBE_WITH_ONEDNN=OFF)";
#endif
  return v;
}

std::optional<std::string> parse_proc_driver_version(std::string_view text) {
  const std::string_view marker = "Kernel Module";
  auto at = text.find(marker);
  if (at == std::string_view::npos) return std::nullopt;
  std::istringstream rest{std::string(text.substr(at + marker.size()))};
  std::string word;
  // The module line reads "... Kernel Module  580.65.06  <build date>"; some kernels insert the
  // flavour ("for x86_64") first, so take the first word that starts with a digit and has a dot.
  while (rest >> word) {
    if (!word.empty() && word[0] >= '0' && word[0] <= '9' && word.find('.') != std::string::npos)
      return word;
  }
  return std::nullopt;
}

std::optional<std::string_view> minimum_driver_for_cuda_major(int major) {
  switch (major) {
    case 11:
      return "450.80.02";
    case 12:
      return "525.60.13";
    case 13:
      return "580.65.06";
    default:
      return std::nullopt;
  }
}

std::vector<Finding> compatibility_findings(const StackVersions& v) {
  std::vector<Finding> out;
  const Version runtime = decode_cuda_version(v.cuda_runtime_built);
  if (v.cuda_driver_api.has_value() && v.cuda_runtime_built > 0) {
    const int driver_api = *v.cuda_driver_api;
    const Version driver = decode_cuda_version(driver_api);
    const auto min_driver = minimum_driver_for_cuda_major(runtime.major);
    const std::string min_text =
        min_driver ? fmt::format(" (Linux driver >= {})", *min_driver) : std::string();
    if (driver_api == 0) {
      out.push_back({Severity::error, "no_driver", "no NVIDIA driver is loaded: CUDA cannot run",
                     fmt::format("install an NVIDIA driver that supports CUDA {}{}; in a "
                                 "container, start it with --gpus all (NVIDIA Container Toolkit)",
                                 runtime.str(), min_text)});
    } else if (driver.major < runtime.major) {
      out.push_back(
          {Severity::error, "runtime_newer_than_driver",
           fmt::format("the CUDA {} runtime dlprobe was built with is newer than the driver "
                       "supports (CUDA {}): CUDA calls fail with 'insufficient driver'",
                       runtime.str(), driver.str()),
           fmt::format("update the driver to one for CUDA {}{}, or build dlprobe with a CUDA {}.x "
                       "toolkit",
                       runtime.str(), min_text, driver.major)});
    } else if (driver.major == runtime.major && driver.minor < runtime.minor) {
      out.push_back(
          {Severity::warning, "runtime_minor_newer_than_driver",
           fmt::format("the CUDA {} runtime is newer than the driver's CUDA {}: it runs under "
                       "minor-version compatibility, but PTX from the newer toolkit cannot be "
                       "JIT-compiled and newer APIs fail",
                       runtime.str(), driver.str()),
           fmt::format("update the driver to one for CUDA {} or newer", runtime.str())});
    }
  }

  if (v.cudnn.loaded && !v.cudnn.built_with.empty()) {
    const Version loaded = decode_cudnn_version(v.cudnn.raw_version);
    const std::string& built = v.cudnn.built_with;
    int built_major = 0, built_minor = 0;
    std::sscanf(built.c_str(), "%d.%d", &built_major, &built_minor);
    if (loaded.major != built_major) {
      out.push_back({Severity::error, "cudnn_major_mismatch",
                     fmt::format("cuDNN {} is loaded ({}) but dlprobe was built with cuDNN {}: the "
                                 "major versions have different APIs",
                                 loaded.str(), v.cudnn.path, built),
                     fmt::format("install cuDNN {}.x for CUDA {} (e.g. package cudnn{}-cuda-{}) or "
                                 "put its lib folder first on LD_LIBRARY_PATH",
                                 built_major, runtime.major, built_major, runtime.major)});
    } else if (loaded.minor < built_minor) {
      // Within a major version cuDNN only adds API, so an older library runs, minus what is new.
      out.push_back({Severity::info, "cudnn_older_than_built",
                     fmt::format("cuDNN {} is loaded ({}), older than the {} dlprobe was built "
                                 "with: engines and features added since are unavailable",
                                 loaded.str(), v.cudnn.path, built),
                     fmt::format("install cuDNN {} or newer for CUDA {}", built, runtime.major)});
    }
  } else if (!v.cudnn.loaded && v.cuda_runtime_built > 0) {
    out.push_back({Severity::warning, "cudnn_not_found",
                   fmt::format("cuDNN could not be loaded: {}", v.cudnn.detail),
                   fmt::format("install cuDNN 9 for CUDA {} (e.g. package cudnn9-cuda-{}) or add "
                               "its lib folder to LD_LIBRARY_PATH",
                               runtime.major, runtime.major)});
  }
  if (v.cudnn.loaded && v.cudnn_cudart_version.has_value() && v.cuda_runtime_built > 0) {
    const Version cudnn_cuda = decode_cuda_version(*v.cudnn_cudart_version);
    if (cudnn_cuda.major != runtime.major) {
      out.push_back({Severity::error, "cudnn_cuda_major_mismatch",
                     fmt::format("the loaded cuDNN {} was built for CUDA {}, dlprobe for CUDA {}",
                                 v.cudnn.version, cudnn_cuda.str(), runtime.str()),
                     fmt::format("install the cuDNN build for CUDA {} (e.g. package "
                                 "cudnn9-cuda-{})",
                                 runtime.major, runtime.major)});
    }
  }
  if (v.cublas.loaded && v.cuda_runtime_built > 0) {
    const Version cublas = decode_mmp_version(v.cublas.raw_version);
    if (cublas.major != runtime.major) {
      out.push_back(
          {Severity::error, "cublas_cuda_major_mismatch",
           fmt::format("cuBLAS {} ({}) belongs to CUDA {}, dlprobe was built with CUDA {}",
                       v.cublas.version, v.cublas.path, cublas.major, runtime.str()),
           fmt::format("put CUDA {}'s lib64 folder first on LD_LIBRARY_PATH", runtime.major)});
    }
  }
  if (!v.cupti.loaded && v.cuda_runtime_built > 0) {
    out.push_back(
        {Severity::info, "cupti_not_found",
         fmt::format("CUPTI could not be loaded, so kernel-level timing is unavailable: {}",
                     v.cupti.detail),
         "add the CUDA toolkit's CUPTI folder (extras/CUPTI/lib64 or lib64) to "
         "LD_LIBRARY_PATH"});
  }
  return out;
}

}  // namespace dlprobe::doctor
