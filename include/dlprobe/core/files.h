// Whole-file reads and crash-safe rewrites, for the files dlprobe keeps current while it measures
// (results, reports, the convolution tuning cache), and the checks every output a command names
// passes before the work starts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

// A descriptor to read `path` from (the caller closes it). A named pipe is opened without waiting
// for a writer, which may never come: with none, the first read returns 0, the end. Errc::not_found
// when it does not exist, Errc::io_error when it cannot be opened; the errors name the path.
Result<int> open_to_read(const std::filesystem::path& path);

// The file's bytes; Errc::not_found when it does not exist, Errc::io_error when it cannot be read,
// Errc::invalid_argument when it holds more than `max_bytes` (a regular file is measured before it
// is read; anything else, a device or a pipe that may never end, is read up to the limit only).
Result<std::string> read_whole_file(const std::filesystem::path& path,
                                    std::uint64_t max_bytes = UINT64_MAX);

// "-": an output path that names standard output rather than a file.
bool is_stdout_path(const std::filesystem::path& path);

// The flag, the same in every command, that lets an output replace a file holding something.
inline constexpr std::string_view kOverwriteFlag = "--overwrite";

// Whether write_file_atomic(path) can succeed later: the folder exists and takes new files, and
// `path` is not a folder; unless `overwrite`, also that `path` is not a regular file holding
// something (an earlier run's results are not replaced unasked; an empty file, a device or a pipe
// are). "-" passes. Checked before long work, so that a mistyped output costs nothing.
// Errc::invalid_argument names the path and what is wrong (and kOverwriteFlag where it helps).
Status check_writable(const std::filesystem::path& path, bool overwrite);

// An output as the command line names it: the flag and its path (empty: not asked for).
struct NamedOutput {
  std::string_view flag;
  std::filesystem::path path;
};
// No output names one of `inputs`, the files the command reads (through symbolic links and hard
// links too): writing it would replace what the command reads.
Status check_not_inputs(std::span<const NamedOutput> outputs, std::span<const NamedOutput> inputs);
// check_writable() on every output asked for, each error prefixed with its flag, none of them
// among `inputs` (check_not_inputs), and no two of them naming the same file or both standard
// output.
Status check_outputs(std::span<const NamedOutput> outputs, bool overwrite,
                     std::span<const NamedOutput> inputs = {});

// Sets standard output aside for the outputs named "-": from now on write_file_atomic("-") writes
// there, and whatever else the program prints to stdout (tables, the workload's echo) goes to
// stderr, so that what a pipe reads is the output alone. Called once, before anything is printed.
Status reserve_stdout();

// Writes to a temporary file beside the file `path` names, flushes it to disk and renames it over
// that file, so a reader (or a crash) sees either the old complete file or the new one, never a
// partial one. A symbolic link is followed: the file it points to is replaced, the link stays. A
// file that exists keeps its permission bits; a new one gets the umask's. A device or a pipe is
// written in place; "-" is standard output (see reserve_stdout()).
Status write_file_atomic(const std::filesystem::path& path, std::string_view content);

// dlprobe's file `file` in an XDG base directory: $<xdg_var>/dlprobe/<file> where that variable is
// an absolute path, else $HOME/<home_dir>/dlprobe/<file> (the spec's default). Neither set:
// Errc::not_found, "no <what> folder: neither <xdg_var> nor HOME is set (give <flag>)".
Result<std::filesystem::path> xdg_file(const char* xdg_var, std::string_view home_dir,
                                       std::string_view file, std::string_view what,
                                       std::string_view flag);

}  // namespace dlprobe
