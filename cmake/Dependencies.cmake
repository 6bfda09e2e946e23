# Debian's packages (scripts/setup.sh installs them). The header-only forms are used so that a binary
# built here carries no Debian shared library to the GPU machine, except oneDNN, which is optional.
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
add_library(dlprobe_httplib INTERFACE)
target_include_directories(dlprobe_httplib SYSTEM INTERFACE ${HTTPLIB_INCLUDE_DIR})
target_link_libraries(dlprobe_httplib INTERFACE Threads::Threads)

if(DLPROBE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(DLPROBE_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
if(DLPROBE_WITH_ONEDNN)
  find_package(dnnl REQUIRED)
endif()
if(DLPROBE_WITH_CUDA)
  # cuDNN ships with the CUDA toolkit here but has no CMake package of its own.
  find_library(DLPROBE_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  # Binaries find the toolkit's shared libraries (cuBLASLt, cuDNN) without LD_LIBRARY_PATH.
  list(APPEND CMAKE_BUILD_RPATH ${CUDAToolkit_LIBRARY_DIR})
endif()
