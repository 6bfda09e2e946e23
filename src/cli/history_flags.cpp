#include "history_flags.h"

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

Status check_history(const HistoryFlags& flags) {
  if (flags.skip || flags.file.empty()) return Status::ok();
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
