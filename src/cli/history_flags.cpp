#include "history_flags.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <system_error>

#include "dlprobe/core/log.h"
#include "dlprobe/history/history.h"

namespace dlprobe::cli {

void add_history_flags(CLI::App& sub, HistoryFlags& flags) {
  sub.add_option("--history", flags.file,
                 "The history database the results are added to (default: "
                 "$XDG_DATA_HOME/dlprobe/history.sqlite, else "
                 "~/.local/share/dlprobe/history.sqlite)");
  sub.add_flag("--no-history", flags.skip, "Do not add the results to the history");
}

namespace {

// Why the default history cannot take the results, if it cannot: a database there that does not
// open, or no folder for a new one.
Status default_history_usable() {
  DLPROBE_ASSIGN_OR_RETURN(const std::filesystem::path path, history::default_path());
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    const Result<history::History> opened = history::History::open(path, {.create = false});
    return opened ? Status::ok() : opened.status();
  }
  // The nearest folder above that exists is where the store makes the history's own.
  std::filesystem::path above = path.parent_path();
  while (above.has_relative_path() && !std::filesystem::exists(above, ec)) {
    above = above.parent_path();
  }
  if (!std::filesystem::is_directory(above, ec) || ::access(above.c_str(), W_OK | X_OK) != 0) {
    return error(Errc::io_error,
                 fmt::format("{}: cannot make its folder in {}", path.string(), above.string()));
  }
  return Status::ok();
}

}  // namespace

Status check_history(const HistoryFlags& flags) {
  if (flags.skip) return Status::ok();
  if (flags.file.empty()) {
    // Said before the work as well as after it, so that a long run is not the first to hear.
    if (Status s = default_history_usable(); !s) {
      log_warn("the results will not be added to the history: {}", s.message());
    }
    return Status::ok();
  }
  // A file not there yet is made by the store at the end, so that a command refused before it
  // measures leaves no empty history behind.
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(flags.file, ec))) {
    return Status::ok();
  }
  const Result<history::History> opened = history::History::open(flags.file, {.create = false});
  return opened ? Status::ok() : opened.status().with_context("--history");
}

NamedOutput history_input(const HistoryFlags& flags) {
  if (flags.skip) return {"--history", {}};
  if (!flags.file.empty()) return {"--history", flags.file};
  // Without HOME there is no default history to guard: store_in_history warns of it at the end.
  const Result<std::filesystem::path> path = history::default_path();
  return {"the default history", path ? *path : std::filesystem::path()};
}

void store_in_history(const HistoryFlags& flags, const results::Document& document) {
  if (flags.skip) return;
  if (Status s = history::store(document, flags.file); !s) {
    log_warn("results not added to the history: {}", s.message());
  }
}

void store_in_history(const HistoryFlags& flags, const Result<results::Document>& document) {
  if (flags.skip) return;
  if (!document) {
    log_warn("results not added to the history: {}", document.status().message());
    return;
  }
  store_in_history(flags, *document);
}

}  // namespace dlprobe::cli
