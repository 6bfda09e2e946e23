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
