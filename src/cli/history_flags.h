// --history FILE and --no-history, as evaluate, bench, memory and run take them: where the
// results go besides their file, and the store once the command is done.
#pragma once

#include <string>

#include "dlprobe/core/files.h"
#include "dlprobe/results/results.h"

namespace CLI {
class App;
}

namespace dlprobe::cli {

struct HistoryFlags {
  std::string file;  // empty: the default history (history::default_path)
  bool skip = false;
};
void add_history_flags(CLI::App& sub, HistoryFlags& flags);

// Before the work: a history named with --history that exists and cannot be opened (not a
// database, a newer schema, a folder) is refused, so that the run is not measured into nowhere.
// The default history that cannot take the results is a warning (a machine without HOME still
// measures), here and again in store_in_history.
Status check_history(const HistoryFlags& flags);

// The history as one of the files the command reads and adds to, for prepare_outputs' `inputs`:
// an output over it would replace the store of earlier results. Its path is the default's where
// --history is not given, and none with --no-history.
NamedOutput history_input(const HistoryFlags& flags);

// Adds `document` to the history unless --no-history. A failure is a warning on stderr: the
// results file and the exit status stay what they are.
void store_in_history(const HistoryFlags& flags, const results::Document& document);
void store_in_history(const HistoryFlags& flags, const Result<results::Document>& document);

}  // namespace dlprobe::cli
