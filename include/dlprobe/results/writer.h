// Keeps a results file on disk current while a sweep runs: after every configuration the whole
// document is rewritten atomically (temporary file + rename), so a crash, an out-of-memory kill or
// Ctrl-C leaves a valid file holding everything measured up to that point. Standard output ("-")
// cannot be rewritten: there the document is written once, by finish().
#pragma once

#include <filesystem>

#include "dlprobe/core/status.h"
#include "dlprobe/results/results.h"

namespace dlprobe::results {

class ResultsWriter {
 public:
  // Writes the document with its context and no configurations yet, so that a bad path fails
  // before anything is measured (on standard output nothing yet).
  static Result<ResultsWriter> create(std::filesystem::path path, Context context);

  // Appends and rewrites the file.
  Status add(Configuration configuration);
  // Appends a finding about the run as a whole and rewrites the file.
  Status add_finding(Finding finding);
  // The work is over: standard output gets the whole document (a file is current already).
  Status finish() const;

  const Document& document() const { return document_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  ResultsWriter(std::filesystem::path path, Document document)
      : path_(std::move(path)), document_(std::move(document)) {}
  Status flush() const;

  std::filesystem::path path_;
  Document document_;
};

}  // namespace dlprobe::results
