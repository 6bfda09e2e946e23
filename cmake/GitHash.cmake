# Run by the dlprobe_git_hash target at every build (cmake -P): writes the commit the sources are
# at into OUTPUT as DLPROBE_GIT_HASH, with "-dirty" where tracked files differ from it. A hash
# taken when CMake configured would go stale with each incremental build after a commit, and
# results, doctor and the trend between two results name the build by it. The file is rewritten
# only when the hash changes, so that an unchanged tree recompiles nothing.
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SOURCE_DIR}"
                OUTPUT_VARIABLE hash OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT hash)
  set(hash unknown)
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY "${SOURCE_DIR}"
                  RESULT_VARIABLE dirty ERROR_QUIET)
  if(dirty EQUAL 1)
    string(APPEND hash "-dirty")
  endif()
endif()
file(CONFIGURE OUTPUT "${OUTPUT}" CONTENT "#define DLPROBE_GIT_HASH \"@hash@\"\n" @ONLY)
