#include "dlprobe/bench/outputs.h"

#include <span>

#include "dlprobe/core/files.h"
#include "dlprobe/results/table.h"

namespace dlprobe::bench {

Result<Outputs> Outputs::create(std::string json, std::string csv, std::string md,
                                results::Context context) {
  Outputs o;
  o.json_ = std::move(json);
  o.csv_ = std::move(csv);
  o.md_ = std::move(md);
  o.document_.context = std::move(context);
  DLPROBE_RETURN_IF_ERROR(o.flush());
  return o;
}

Status Outputs::write(const std::vector<results::Configuration>& configurations) {
  document_.configurations = configurations;
  return flush();
}

Status Outputs::add_findings(const std::vector<results::Finding>& findings) {
  document_.findings.insert(document_.findings.end(), findings.begin(), findings.end());
  return flush();
}

Status Outputs::finish() const {
  return flush(true);
}

Status Outputs::flush(bool last) const {
  // A file is rewritten every time; standard output, which cannot be, only the last time.
  const auto due = [last](const std::string& path) {
    return !path.empty() && (last ? is_stdout_path(path) : !is_stdout_path(path));
  };
  if (due(json_)) DLPROBE_RETURN_IF_ERROR(write_file_atomic(json_, results::serialize(document_)));
  if (!due(csv_) && !due(md_)) return Status::ok();
  const results::NamedDocument named{"results", document_};
  const results::Table table = results::configuration_table(std::span(&named, 1));
  if (due(csv_)) DLPROBE_RETURN_IF_ERROR(write_file_atomic(csv_, results::to_csv(table)));
  if (due(md_)) DLPROBE_RETURN_IF_ERROR(write_file_atomic(md_, results::to_markdown(table)));
  return Status::ok();
}

}  // namespace dlprobe::bench
