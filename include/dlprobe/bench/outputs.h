// Where a bench sweep's results go: the results file (dlprobe.results/1) and the configuration
// table as CSV and Markdown, each rewritten atomically after every configuration, so that a crash
// or Ctrl-C keeps everything measured so far. An output named "-" is standard output, which
// cannot be rewritten: it is written once, by finish().
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/results/results.h"

namespace dlprobe::bench {

class Outputs {
 public:
  // Empty paths are not written. Creating writes each output that is not yet a file once, empty,
  // so that a path that cannot be written fails before anything is measured (the error names the
  // file); a file that exists keeps its content until the first write() replaces it.
  static Result<Outputs> create(std::string json, std::string csv, std::string md,
                                results::Context context);
  Status write(const std::vector<results::Configuration>& configurations);
  Status add_findings(const std::vector<results::Finding>& findings);
  // The sweep is over: the outputs on standard output are written (the files are current).
  Status finish() const;
  const results::Document& document() const { return document_; }

 private:
  // Rewrites the files; with `last`, standard output too.
  Status flush(bool last = false) const;
  // Each output asked for, with what it holds now (the table rendered once for both formats).
  using Contents = std::vector<std::pair<const std::string*, std::string>>;
  Contents contents() const;
  std::string json_, csv_, md_;
  results::Document document_;
};

}  // namespace dlprobe::bench
