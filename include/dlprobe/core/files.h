// Whole-file reads and crash-safe rewrites, for the files dlprobe keeps current while it measures
// (results, reports, the convolution tuning cache).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

// The file's bytes; Errc::not_found when it does not exist, Errc::io_error when it cannot be read,
// Errc::invalid_argument when it holds more than `max_bytes` (a regular file is measured before it
// is read; anything else, a device or a pipe that may never end, is read up to the limit only).
Result<std::string> read_whole_file(const std::filesystem::path& path,
                                    std::uint64_t max_bytes = UINT64_MAX);

// Whether write_file_atomic(path) can succeed later: the folder exists and takes new files, and
// `path` is not a folder. Checked before long work, so that a mistyped output costs nothing.
// Errc::invalid_argument names the path and what is wrong.
Status check_writable(const std::filesystem::path& path);

// Writes to a temporary file beside `path`, flushes it to disk and renames it over `path`, so a
// reader (or a crash) sees either the old complete file or the new one, never a partial one.
Status write_file_atomic(const std::filesystem::path& path, std::string_view content);

}  // namespace dlprobe
