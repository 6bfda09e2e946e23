# Warnings are errors in our own code; third-party headers come in as SYSTEM includes.
add_library(dlprobe_warnings INTERFACE)
target_compile_options(dlprobe_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion -Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)

add_library(dlprobe_sanitize INTERFACE)
if(DLPROBE_SANITIZE)
  target_compile_options(dlprobe_sanitize INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(dlprobe_sanitize INTERFACE -fsanitize=address,undefined)
endif()

# dlprobe_cuda_cxx20(TARGET): C++20 for a target's .cu files. CMake 3.25 has no flag table for
# CUDA20 with nvcc and, since the CUDA standard follows CXX_STANDARD when unset, refuses to
# generate; nvcc 12+ takes -std=c++20, so the target asks for it directly.
function(dlprobe_cuda_cxx20 target)
  set_property(TARGET ${target} PROPERTY CUDA_STANDARD)
  set_property(TARGET ${target} PROPERTY CUDA_STANDARD_REQUIRED OFF)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endfunction()
