# Warnings are errors in our own code; third-party headers come in as SYSTEM includes.
# -Wno-subobject-linkage: in a unity build (CMAKE_UNITY_BUILD, each target's sources included into
# a few files) GCC takes every source for a header and warns of a class whose members have types
# from the file's anonymous namespace; compiled alone, the same source is fine. Clang (the
# libFuzzer build, fuzz/README.md) has no such warning and refuses the option under -Werror.
add_library(dlprobe_warnings INTERFACE)
target_compile_options(dlprobe_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
  $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-subobject-linkage>
  $<$<COMPILE_LANGUAGE:CXX>:-Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)

add_library(dlprobe_sanitize INTERFACE)
add_library(dlprobe_sanitize_runtime INTERFACE)
if(DLPROBE_SANITIZE)
  # -O1, after the build type's level: what ASan's authors advise (usable speed, exact reports),
  # and it compiles faster than -O2. -g1: file and line in every report, for little compile time.
  # -fno-sanitize=null,alignment: these two checks instrument every pointer use and took a third of
  # the build's compile time; a null dereference still ends in ASan's SEGV report with its stack,
  # and x86-64 has no alignment faults. The rest of UBSan (integer overflow, shifts, bounds, enum
  # and bool loads, vptr) stays.
  # -fno-sanitize-address-use-after-scope: poisoning every local's scope took another 30 % of the
  # compile time; overflows of stack, heap and globals and use after free are still caught.
  # -Wno-maybe-uninitialized: GCC 12 at -O1 with the sanitizers reports it inside libstdc++'s
  # <regex> and std::function (false positives); the Release build keeps the warning.
  target_compile_options(dlprobe_sanitize INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-O1 -g1 -fsanitize=address,undefined -fno-sanitize=null,alignment
    -fno-sanitize-address-use-after-scope -fno-omit-frame-pointer -fno-sanitize-recover=all>
    $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-maybe-uninitialized>)
  target_link_options(dlprobe_sanitize INTERFACE -fsanitize=address,undefined)
  # Test drivers: what they exercise (the libraries and the tool) is
  # instrumented; their own code is not, and is not optimised, which makes it four times faster to
  # compile. They link the sanitizers' runtime the libraries need.
  target_compile_options(dlprobe_sanitize_runtime INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-O0 -g1>)
  target_link_options(dlprobe_sanitize_runtime INTERFACE -fsanitize=address,undefined)
endif()
