# Debian's packages (scripts/setup.sh installs them). fmt is linked as Debian's shared library, not
# in its header-only form: the header-only form compiles fmt's whole implementation into every file
# (about 8 of a small file's 10 s on the 2-core build machine). scripts/gpu-bundle.sh carries libfmt
# and cpp-httplib to a GPU machine whose image lacks them.
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)
# The history's database (Debian's libsqlite3-dev).
find_package(SQLite3 REQUIRED)
find_package(PkgConfig REQUIRED)
# RE2 matches `run --throughput-regex` against a workload's output lines in linear time without
# recursion (std::regex recurses per character and overflows the stack on a long line). Debian
# ships only its pkg-config file.
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)
# libjpeg-turbo's TurboJPEG API decodes the data pipeline's JPEGs on the host (Debian's
# libturbojpeg0-dev ships only its pkg-config file).
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)
if(DLPROBE_WITH_HTTP)
  # Debian splits cpp-httplib: httplib.h only declares, libcpp-httplib.so implements, so this one
  # is a shared library the binary needs at run time. Its pkg-config file carries the feature
  # macros (OpenSSL, zlib, brotli) that the header's class layouts depend on.
  pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
  add_library(dlprobe_httplib INTERFACE)
  target_link_libraries(dlprobe_httplib INTERFACE PkgConfig::CPP_HTTPLIB Threads::Threads)
endif()

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
